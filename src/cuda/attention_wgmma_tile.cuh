// The K/V tile of the wgmma attention kernels (attention_wgmma.cu, attention_wgmma_ws.cu) and the
// two warpgroup MMAs that read it. A tile of NT tokens × 128 channels is stored as two 64-channel
// halves, [half][token][128 bytes], each 128-byte-swizzled (wgmma.cuh), so one layout serves K
// as the K-major B operand of Q·Kᵀ and V as the MN-major B operand of P·V.
#pragma once

#include <cstdint>

#include "wgmma.cuh"

namespace cisa::cuda::detail {

constexpr int kWgHeadDim = 128;             // the only head dim of the wgmma kernels
constexpr uint32_t kSw128AtomBytes = 1024;  // 8 token rows of 128 bytes: one swizzle atom
template <int NT>
constexpr uint32_t kWgHalfBytes = NT * 128;  // one 64-channel half of a tile

// S = Q·Kᵀ of the K tile at kst, issued, not waited (m64n64 for 64-token tiles, else m64n128).
// K-major B: a k16 step is 32 bytes of a 128-byte row, SBO = one atom of 8 token rows.
template <int NT>
__device__ __forceinline__ void wg_issue_qk(float (&s)[NT / 2],
                                            const uint32_t (&qf)[kWgHeadDim / 16][4],
                                            const uint8_t* kst) {
  auto desc = [&](int kk) {
    return dev::smem_desc_sw128(kst + (kk / 4) * kWgHalfBytes<NT> + (kk % 4) * 32, 16,
                                kSw128AtomBytes);
  };
  if constexpr (NT == 64) {
    dev::wgmma_m64n64k16_init<0>(s, qf[0], desc(0));
#pragma unroll
    for (int kk = 1; kk < kWgHeadDim / 16; ++kk) dev::wgmma_m64n64k16<0>(s, qf[kk], desc(kk), 1);
  } else {
    dev::wgmma_m64n128k16_init<0>(s, qf[0], desc(0));
#pragma unroll
    for (int kk = 1; kk < kWgHeadDim / 16; ++kk) dev::wgmma_m64n128k16<0>(s, qf[kk], desc(kk), 1);
  }
}

// O += P·V of the V tile at vst, issued, not waited. MN-major B: LBO = one channel half, SBO = 8
// tokens (one atom); a k16 step is 16 token rows.
template <int NT>
__device__ __forceinline__ void wg_issue_pv(float (&o)[kWgHeadDim / 2],
                                            const uint32_t (&pa)[NT / 16][4], const uint8_t* vst) {
#pragma unroll
  for (int kt = 0; kt < NT / 16; ++kt)
    dev::wgmma_m64n128k16<1>(
        o, pa[kt], dev::smem_desc_sw128(vst + kt * 16 * 128, kWgHalfBytes<NT>, kSw128AtomBytes), 1);
}

}  // namespace cisa::cuda::detail
