// The index query of one selecting list (SPEC §3): the mean of its group's index queries, or the
// last one. Shared by the scoring stage's index-query kernel and the selection-reuse decision
// kernel (reuse.cu), which computes it itself to save a launch.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common.cuh"
#include "plan_types.h"

namespace cisa::cuda::detail {

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}

// q̄ of list L at channels c0 … c0 + N − 1: the mean of its group's index queries (rows
// qbar_row0 … qbar_row1), a sequential sum in row order, then one multiply: the CPU's exact
// arithmetic (bit-identical q̄). N % 4 == 0 reads 16 bytes at a time (index_q and c0 aligned to
// 4 floats). The one definition of q̄ on the device: write_index_query below and the decode
// scoring kernel (score.cu), which computes its lists' q̄ itself, both call it.
template <int N>
__device__ __forceinline__ void index_query_channels(const ListDesc& L,
                                                     const float* __restrict__ index_q,
                                                     int num_kv_heads, int head_dim, int c0,
                                                     float (&q)[N]) {
  float acc[N];
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n] = 0.0f;
  for (int64_t r = L.qbar_row0; r <= L.qbar_row1; ++r) {
    const float* row = index_q + (r * num_kv_heads + L.kv) * head_dim + c0;
    if constexpr (N % 4 == 0) {
#pragma unroll
      for (int n = 0; n < N; n += 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(row + n));
        acc[n] = __fadd_rn(acc[n], v.x);
        acc[n + 1] = __fadd_rn(acc[n + 1], v.y);
        acc[n + 2] = __fadd_rn(acc[n + 2], v.z);
        acc[n + 3] = __fadd_rn(acc[n + 3], v.w);
      }
    } else {
#pragma unroll
      for (int n = 0; n < N; ++n) acc[n] = __fadd_rn(acc[n], row[n]);
    }
  }
  const float inv = 1.0f / static_cast<float>(L.qbar_row1 - L.qbar_row0 + 1);
#pragma unroll
  for (int n = 0; n < N; ++n) q[n] = __fmul_rn(acc[n], inv);
}

// q̄ of list li (index_query_channels), and q̄ as three bf16 terms for the tensor-core scoring:
// hi = bf16(q), mid = bf16(q − hi), lo = q − hi − mid. q − hi is exact in f32 and has at most
// 16 significant bits, its remainder after mid at most 8, so lo is exact in bf16 and
// hi + mid + lo = q exactly.
// Written by the threads of one block for list li (every thread calls it); the block's own
// later reads of qbar need a __syncthreads() first.
__device__ __forceinline__ void write_index_query(const ListDesc& L, int32_t li,
                                                  const float* __restrict__ index_q,
                                                  int num_kv_heads, int head_dim,
                                                  float* __restrict__ qbar,
                                                  uint16_t* __restrict__ qsplit) {
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float qi[1];
    index_query_channels<1>(L, index_q, num_kv_heads, head_dim, i, qi);
    const float q = qi[0];
    qbar[static_cast<int64_t>(li) * head_dim + i] = q;
    const uint16_t hi = bf16_bits(q);
    const float r1 = q - dev::bf16_to_f32(hi);
    const uint16_t mid = bf16_bits(r1);
    uint16_t* out = qsplit + static_cast<int64_t>(li) * 3 * head_dim + i;
    out[0] = bf16_bits(r1 - dev::bf16_to_f32(mid));
    out[head_dim] = mid;
    out[2 * head_dim] = hi;
  }
}

}  // namespace cisa::cuda::detail
