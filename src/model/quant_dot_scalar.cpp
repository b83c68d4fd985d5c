// quant_dot_scalar.cpp — activation quantisation and the portable quantised dot-product kernels.
//
// For a weight sub-block of 32 with element i = s[i/16] * w[i] + a and an activation block
// x[i] = d * q[i], the dot product is
//   sum_i x[i] (s[i/16] w[i] + a) = d * (s[0] * sum_{i<16} w q + s[1] * sum_{i>=16} w q) + a * s
// where s = d * sum q is the activation block's sum (BlockX). The integer sums are exact; floats
// enter once per half block. The AVX2 kernels compute the same quantities with vector instructions.
#include <cmath>
#include <type_traits>

#include "cisa/model/quant.h"
#include "quant_kernels.h"

namespace cisa::quant {

namespace {
float round_f16(float v) {
  return f16_to_f32(f32_to_f16(v));
}
}  // namespace
void quantize_x(const float* x, BlockX* out, int64_t k, XSum sum_kind) {
  for (int64_t b = 0; b < k / kBlockX; ++b) {
    const float* xb = x + b * kBlockX;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      // nearbyint rounds half to even, as the vector conversion (_mm256_cvtps_epi32) does.
      const int q = static_cast<int>(std::nearbyint(xb[i] * id));
      out[b].q[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = round_f16(d);
    out[b].s = sum_kind == XSum::kQ8_1 ? round_f16(d * static_cast<float>(sum))
                                       : out[b].d * static_cast<float>(sum);
  }
}

void quantize_xo(const float* x, BlockXO* out, int64_t k, int code_offset) {
  for (int64_t b = 0; b < k / kBlockX; ++b) {
    quantize_x(x + b * kBlockX, &out[b].x, kBlockX, XSum::kQ8_0);
    const int8_t* q = out[b].x.q;
    for (int l = 0; l < 8; ++l)
      out[b].off[l] = -code_offset * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
  }
}

void quantize_xk(const float* x, BlockXK* out, int64_t k) {
  for (int64_t b = 0; b < k / kBlockXK; ++b) {
    const float* xb = x + b * kBlockXK;
    float amax = 0.0f;
    for (int i = 0; i < 256; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        const int q = static_cast<int>(std::nearbyint(xb[i] * id));
        out[b].q[i] = static_cast<int8_t>(q);
        sum += q;
      }
      out[b].bsum[g] = static_cast<int16_t>(sum);
    }
    out[b].d = amax != 0.0f ? 1.0f / id : 0.0f;
  }
}

int activation_code_offset(GgmlType type) {
  return type == GgmlType::Q4_0 ? 8 : type == GgmlType::Q5_0 ? 16 : 0;
}

XSum activation_sum_kind(GgmlType type) {
  return type == GgmlType::Q4_1 || type == GgmlType::Q5_1 ? XSum::kQ8_1 : XSum::kQ8_0;
}

bool uses_block256(GgmlType type) {
  return type == GgmlType::Q4_K || type == GgmlType::Q6_K;
}

int64_t activation_blocks(GgmlType type, int64_t k) {
  return k / (uses_block256(type) ? kBlockXK : kBlockX);
}

size_t activation_bytes(GgmlType type, int64_t k) {
  const size_t block = uses_block256(type)                ? sizeof(BlockXK)
                       : activation_code_offset(type) > 0 ? sizeof(BlockXO)
                                                          : sizeof(BlockX);
  return static_cast<size_t>(activation_blocks(type, k)) * block;
}

void quantize_activations(GgmlType type, const float* x, void* out, int64_t k) {
  if (uses_block256(type))
    quantize_xk(x, static_cast<BlockXK*>(out), k);
  else if (const int c = activation_code_offset(type); c > 0)
    quantize_xo(x, static_cast<BlockXO*>(out), k, c);
  else
    quantize_x(x, static_cast<BlockX*>(out), k, activation_sum_kind(type));
}

float activation_value(GgmlType type, const void* xq, int64_t i) {
  if (uses_block256(type)) {
    const BlockXK& b = static_cast<const BlockXK*>(xq)[i / kBlockXK];
    return b.d * static_cast<float>(b.q[i % kBlockXK]);
  }
  const BlockX& b = activation_code_offset(type) > 0
                        ? static_cast<const BlockXO*>(xq)[i / kBlockX].x
                        : static_cast<const BlockX*>(xq)[i / kBlockX];
  return b.d * static_cast<float>(b.q[i % kBlockX]);
}

namespace {

// 32-element types against BlockX activations (BlockXO for offset-coded types, whose lane
// offsets this kernel does not need: its codes are already signed).
inline const BlockX& block_x(const BlockX& b) {
  return b;
}
inline const BlockX& block_x(const BlockXO& b) {
  return b.x;
}
template <GgmlType kType>
using XBlockOf =
    std::conditional_t<kType == GgmlType::Q4_0 || kType == GgmlType::Q5_0, BlockXO, BlockX>;

template <GgmlType kType>
void tile_scalar(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const void* xv, int64_t nb,
                 int64_t n_tok, float* y, int64_t ldy) {
  const auto* xq = static_cast<const XBlockOf<kType>*>(xv);
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
            const BlockX& bx = block_x(xq[(t0 + t) * nb + xb]);
            int lo = 0, hi = 0;
            for (int i = 0; i < 16; ++i) lo += sb.w[i] * bx.q[i];
            for (int i = 16; i < 32; ++i) hi += sb.w[i] * bx.q[i];
            acc[t] += bx.d * (sb.scale[0] * static_cast<float>(lo) +
                              sb.scale[1] * static_cast<float>(hi)) +
                      sb.add * bx.s;
          }
        }
      }
      for (int t = 0; t < nt; ++t) y[(t0 + t) * ldy + r] = acc[t];
    }
  }
}

// K-quants against BlockXK activations: per sub-block of 32, integer sums per 16 elements,
//   d_x * (scale_0 * sum_{i<16} w q + scale_1 * sum_{i>=16} w q + add * (bsum_lo + bsum_hi)).
template <GgmlType kType>
void tile_scalar_k(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const void* xv, int64_t nb,
                   int64_t n_tok, float* y, int64_t ldy) {
  const BlockXK* xq = static_cast<const BlockXK*>(xv);
  const int64_t block_bytes = ggml_block_bytes(kType);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + static_cast<uint64_t>(r) * row_bytes;
    for (int64_t t = 0; t < n_tok; ++t) {
      float acc = 0.0f;
      SubBlock sb;
      for (int64_t blk = 0; blk < nb; ++blk) {
        const BlockXK& bx = xq[t * nb + blk];
        for (int j = 0; j < 8; ++j) {
          decode_sub_block(kType, row + blk * block_bytes, j, &sb);
          int lo = 0, hi = 0;
          for (int i = 0; i < 16; ++i) lo += sb.w[i] * bx.q[32 * j + i];
          for (int i = 16; i < 32; ++i) hi += sb.w[i] * bx.q[32 * j + i];
          const int qsum = bx.bsum[2 * j] + bx.bsum[2 * j + 1];
          acc += bx.d * (sb.scale[0] * static_cast<float>(lo) +
                         sb.scale[1] * static_cast<float>(hi) + sb.add * static_cast<float>(qsum));
        }
      }
      y[t * ldy + r] = acc;
    }
  }
}

}  // namespace

TileKernel tile_kernel_scalar(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
      return tile_scalar<GgmlType::Q4_0>;
    case GgmlType::Q4_1:
      return tile_scalar<GgmlType::Q4_1>;
    case GgmlType::Q5_0:
      return tile_scalar<GgmlType::Q5_0>;
    case GgmlType::Q5_1:
      return tile_scalar<GgmlType::Q5_1>;
    case GgmlType::Q8_0:
      return tile_scalar<GgmlType::Q8_0>;
    case GgmlType::Q4_K:
      return tile_scalar_k<GgmlType::Q4_K>;
    case GgmlType::Q6_K:
      return tile_scalar_k<GgmlType::Q6_K>;
    default:
      return nullptr;
  }
}

}  // namespace cisa::quant
