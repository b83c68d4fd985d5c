// quant_dot_scalar.cpp — activation quantisation and the portable quantised dot-product kernels.
//
// For a weight sub-block of 32 with element i = s[i/16] * w[i] + a and an activation block
// x[i] = d * q[i], the dot product is
//   sum_i x[i] (s[i/16] w[i] + a) = d * (s[0] * sum_{i<16} w q + s[1] * sum_{i>=16} w q) + a * (s0 + s1)
// where s0, s1 are the activation's half sums (BlockX). The integer sums are exact; floats enter
// once per half block. The AVX2 kernels compute the same quantities with vector instructions.
#include <cmath>

#include "quant_kernels.h"

namespace cisa::quant {

void quantize_x(const float* x, BlockX* out, int64_t k) {
  for (int64_t b = 0; b < k / kBlockX; ++b) {
    const float* xb = x + b * kBlockX;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum0 = 0, sum1 = 0;
    for (int i = 0; i < 32; ++i) {
      // nearbyint rounds half to even, as the vector conversion (_mm256_cvtps_epi32) does.
      const int q = static_cast<int>(std::nearbyint(xb[i] * id));
      out[b].q[i] = static_cast<int8_t>(q);
      (i < 16 ? sum0 : sum1) += q;
    }
    out[b].d = d;
    out[b].s0 = d * static_cast<float>(sum0);
    out[b].s1 = d * static_cast<float>(sum1);
    out[b].s = out[b].s0 + out[b].s1;
  }
}

namespace {

template <GgmlType kType>
void tile_scalar(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const BlockX* xq, int64_t nb,
                 int64_t n_tok, float* y, int64_t ldy) {
  constexpr int kMaxTok = 8;
  const int subs = sub_blocks_per_block(kType);
  const int64_t block_bytes = ggml_block_bytes(kType);
  const int64_t n_blocks = nb / subs;  // weight blocks per row
  for (int64_t t0 = 0; t0 < n_tok; t0 += kMaxTok) {
    const int nt = static_cast<int>(n_tok - t0 < kMaxTok ? n_tok - t0 : kMaxTok);
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* row = w + static_cast<uint64_t>(r) * row_bytes;
      float acc[kMaxTok] = {};
      SubBlock sb;
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        for (int j = 0; j < subs; ++j) {
          decode_sub_block(kType, row + blk * block_bytes, j, &sb);
          const int64_t xb = blk * subs + j;
          for (int t = 0; t < nt; ++t) {
            const BlockX& bx = xq[(t0 + t) * nb + xb];
            int lo = 0, hi = 0;
            for (int i = 0; i < 16; ++i) lo += sb.w[i] * bx.q[i];
            for (int i = 16; i < 32; ++i) hi += sb.w[i] * bx.q[i];
            acc[t] += bx.d * (sb.scale[0] * static_cast<float>(lo) + sb.scale[1] * static_cast<float>(hi)) +
                      sb.add * (bx.s0 + bx.s1);
          }
        }
      }
      for (int t = 0; t < nt; ++t) y[(t0 + t) * ldy + r] = acc[t];
    }
  }
}

}  // namespace

TileKernel tile_kernel_scalar(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return tile_scalar<GgmlType::Q4_0>;
    case GgmlType::Q4_1: return tile_scalar<GgmlType::Q4_1>;
    case GgmlType::Q5_0: return tile_scalar<GgmlType::Q5_0>;
    case GgmlType::Q5_1: return tile_scalar<GgmlType::Q5_1>;
    case GgmlType::Q8_0: return tile_scalar<GgmlType::Q8_0>;
    case GgmlType::Q4_K: return tile_scalar<GgmlType::Q4_K>;
    case GgmlType::Q6_K: return tile_scalar<GgmlType::Q6_K>;
    default: return nullptr;
  }
}

}  // namespace cisa::quant
