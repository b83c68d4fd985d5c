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

// Sequential sum in row order, then one multiply: the CPU's exact arithmetic (bit-identical q̄).
// Also q̄ as three bf16 terms for the tensor-core scoring: hi = bf16(q), mid = bf16(q − hi),
// lo = q − hi − mid. q − hi is exact in f32 and has at most 16 significant bits, its remainder
// after mid at most 8, so lo is exact in bf16 and hi + mid + lo = q exactly.
// Written by the threads of one block for list li (every thread calls it); the block's own
// later reads of qbar need a __syncthreads() first.
__device__ __forceinline__ void write_index_query(const ListDesc& L, int32_t li,
                                                  const float* __restrict__ index_q,
                                                  int num_kv_heads, int head_dim,
                                                  float* __restrict__ qbar,
                                                  uint16_t* __restrict__ qsplit) {
  const float inv = 1.0f / static_cast<float>(L.qbar_row1 - L.qbar_row0 + 1);
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t r = L.qbar_row0; r <= L.qbar_row1; ++r)
      acc = __fadd_rn(acc, index_q[(r * num_kv_heads + L.kv) * head_dim + i]);
    const float q = __fmul_rn(acc, inv);
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
