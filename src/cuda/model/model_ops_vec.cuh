// Shared pieces of the model_ops kernels (model_ops.cu, model_ops_elementwise.cu): the block size,
// grid sizing for grid-stride loops, alignment tests, and V-wide f32 / bf16 accesses (V ∈ {1, 4,
// 8}) that compile to one 4-, 8- or 16-byte load or store.
//
//   const Vec<4> a = load_f32<4>(x + i);   // x + i 16-byte aligned
//   store_bf16<4>(y + i, a);                // y + i 8-byte aligned
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common.cuh"

namespace cisa::cuda::detail::vec {

constexpr int kThreads = 256;  // every model_ops kernel: 8 warps per block

// Blocks for a grid-stride loop over `work` items, one per thread (≥ 1; capped, the loop covers
// the rest).
inline unsigned blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : b > (1 << 20) ? (1 << 20) : b);
}

inline bool aligned(const void* p, unsigned bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

__device__ __forceinline__ int64_t first_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return int64_t(gridDim.x) * blockDim.x;
}

// V consecutive floats / bf16 values as one access (V ∈ {1, 4, 8}; 8 only for bf16 loads).
template <int V>
struct Vec {
  float v[V];
};
template <int V>
__device__ __forceinline__ Vec<V> load_f32(const float* p) {
  Vec<V> r;
  if constexpr (V == 1) {
    r.v[0] = *p;
  } else {
    static_assert(V == 4, "f32 accesses are 1 or 4 wide");
    const float4 a = *reinterpret_cast<const float4*>(p);
    r.v[0] = a.x, r.v[1] = a.y, r.v[2] = a.z, r.v[3] = a.w;
  }
  return r;
}
template <int V>
__device__ __forceinline__ void store_f32(float* p, const Vec<V>& r) {
  if constexpr (V == 1) {
    *p = r.v[0];
  } else {
    static_assert(V == 4, "f32 accesses are 1 or 4 wide");
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  }
}
template <int V>
__device__ __forceinline__ Vec<V> load_bf16(const uint16_t* p) {
  Vec<V> r;
  if constexpr (V == 1) {
    r.v[0] = dev::bf16_to_f32(*p);
  } else {
    static_assert(V == 4 || V == 8, "bf16 loads are 1, 4 or 8 wide");
    uint32_t w[V / 2];
    if constexpr (V == 4) {
      const uint2 a = *reinterpret_cast<const uint2*>(p);
      w[0] = a.x, w[1] = a.y;
    } else {
      const uint4 a = *reinterpret_cast<const uint4*>(p);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    }
    for (int j = 0; j < V / 2; ++j) {  // low half of each word is the lower address
      r.v[2 * j] = __uint_as_float(w[j] << 16);
      r.v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
  return r;
}
template <int V>
__device__ __forceinline__ void store_bf16(uint16_t* p, const Vec<V>& r) {
  if constexpr (V == 1) {
    *p = dev::f32_to_bf16(r.v[0]);
  } else {
    static_assert(V == 4, "bf16 stores are 1 or 4 wide");
    const uint32_t lo = dev::f32_to_bf16(r.v[0]) | uint32_t(dev::f32_to_bf16(r.v[1])) << 16;
    const uint32_t hi = dev::f32_to_bf16(r.v[2]) | uint32_t(dev::f32_to_bf16(r.v[3])) << 16;
    *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
  }
}

}  // namespace cisa::cuda::detail::vec
