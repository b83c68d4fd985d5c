// Representatives as the scoring kernels read them (docs/design.md, "Representative precision"):
// bf16 values, or int8 codes with one scale 2^e per representative (RepPrecision::kInt8, the
// rule of core/rep_quant.h), stored as the signed byte e (kRepExpNaN: a non-finite
// representative, whose scores are NaN). Every reader takes 16 bytes a load: 8 bf16 channels or 16
// int8 ones, so one kernel body serves both with kChan channels per lane. An int8 score is the dot
// product with the codes, times the scale (exact: a power of two), times 1/√d.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cisa::cuda::dev {

template <bool kInt8>
struct RepBytes {
  static constexpr int kBytes = kInt8 ? 1 : 2;  // bytes per value
  static constexpr int kChan = 16 / kBytes;     // channels per 16-byte load
};

// 2^e from its byte (plan_types.h: e ≥ kRepExpMin, a normal f32), built from its bits: one
// integer multiply-add, no compare in the scoring loops. kRepExpNaN gives −inf, and the update
// kernel stores such a representative's codes as zeros (reps.cu), so its dot product is 0 and
// its score 0 · −inf = NaN, as the rule asks.
__device__ __forceinline__ float rep_scale(int e) {
  return __int_as_float((e + 127) << 23);
}

// Four int8 codes (low byte first) as exact floats without I2F (a quarter-rate instruction that
// would bound a decode scan at ~14 codes per clock and SM): the byte, offset to unsigned, is
// spliced under the exponent of 2^23 and the offset subtracted back.
__device__ __forceinline__ void unpack_int8x4(uint32_t w, float* f) {
  const uint32_t u = w ^ 0x80808080u;  // x + 128 in [0, 255]
#pragma unroll
  for (int j = 0; j < 4; ++j)
    f[j] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7440 + j)) - 8388736.0f;  // 2^23 + 128
}

// L2 eviction priorities of a decode scan (sm_80+ cache policies; plain loads below that). The
// representatives stream once per step (~134 MB at 1M tokens x 16 sequences) and are loaded
// evict-first; the exponent bytes (1 byte per representative, at random page IDs) evict-last, so
// that they stay in L2 while the representatives and the K/V stream past them. Measured on an
// H100 (bench/results/decode_fixed_cost_2026-12-07/call3_h100): the 4:1 decode scoring kernel
// 58.7 -> 55.5 us, 32:1 110.5 -> 103.7 us, with the same DRAM bytes read.
__device__ __forceinline__ uint4 load_rep_streaming(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 v;
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(pol));
  return v;
#else
  return __ldg(static_cast<const uint4*>(p));
#endif
}

__device__ __forceinline__ int load_exp_resident(const int8_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  int v;
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  asm("ld.global.nc.L2::cache_hint.s8 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol));
  return v;
#else
  return __ldg(p);
#endif
}

// One 16-byte load widened to f32 in memory order: 8 bf16 values or 16 int8 codes.
template <bool kInt8>
__device__ __forceinline__ void unpack16(const uint4& w, float* f) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    if constexpr (kInt8) {
      unpack_int8x4(ws[h], f + 4 * h);
    } else {
      f[2 * h] = __uint_as_float(ws[h] << 16);
      f[2 * h + 1] = __uint_as_float(ws[h] & 0xffff0000u);
    }
  }
}

// One lane's part of a chunk's score over its N channels, summed in channel order: mean
// representatives q·r with fmaf (lo = r), quest Σ max(q·min, q·max) (lo = min, hi = max; a
// positive scale factors out of the max). The decode score kernel (score.cu), the fused decode
// selection (select_fused.cu) and the selection-reuse check (reuse.cu) all score with it, so the
// check ranks exactly the scores a fresh selection ranks.
template <bool kQuest, int N>
__device__ __forceinline__ float lane_score(const float* q, const float* lo, const float* hi) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (kQuest) {
      const float a = q[i] * lo[i], b = q[i] * hi[i];
      acc += a > b ? a : b;
    } else {
      acc = fmaf(q[i], lo[i], acc);
    }
  }
  return acc;
}

// A chunk's score from its lanes' summed dot product: bf16 as before (times 1/√d), int8 times
// the representative's scale 2^e first (exps[i]: its exponent, as loaded from the exponent bytes;
// the decode kernels keep one int register per chunk, which a byte array would pack).
template <bool kInt8>
__device__ __forceinline__ float finish_score(float dot, const int* exps, int64_t i,
                                              float inv_sqrt_d) {
  if constexpr (kInt8) dot *= rep_scale(exps[i]);
  return dot * inv_sqrt_d;
}

}  // namespace cisa::cuda::dev
