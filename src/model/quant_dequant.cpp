// quant_dequant.cpp — decoding GGML blocks to floats (the reference every kernel is tested
// against), plus half/bfloat16 conversions.
//
// Block layouts (little-endian, docs/gguf.md):
//   Q4_0  f16 d | 16 B nibbles            x = d * (q - 8)           q: low nibbles are 0..15,
//   Q4_1  f16 d | f16 m | 16 B nibbles    x = d * q + m                high nibbles are 16..31
//   Q5_0  f16 d | u32 high bits | 16 B    x = d * (q - 16)          q = nibble | bit << 4
//   Q5_1  f16 d | f16 m | u32 | 16 B      x = d * q + m
//   Q8_0  f16 d | 32 x i8                 x = d * q
//   Q4_K  f16 d | f16 dmin | 12 B 6-bit scales and mins | 128 B nibbles; 8 sub-blocks of 32:
//         x = (d * sc_j) * q - (dmin * m_j)
//   Q6_K  128 B low nibbles | 64 B high 2-bit pairs | 16 x i8 scales | f16 d; 16 sub-blocks of
//         16: x = (d * sc_j) * (q - 32)
#include <cstring>

#include "cisa/model/quant.h"
#include "quant_kernels.h"

namespace cisa {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise the mantissa into a float exponent.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) return sign | 0x7E00;   // nan
  if (abs >= 0x477FF000) return sign | 0x7C00;  // rounds to >= 65536: inf
  if (abs < 0x38800000) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even.
    if (abs < 0x33000000) return sign;  // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24 bits to drop
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias, round the 13 dropped mantissa bits to nearest even (carry may bump exponent).
  uint32_t v = abs - (112u << 23);
  const uint32_t rem = v & 0x1FFF;
  v >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (v & 1))) ++v;
  return sign | static_cast<uint16_t>(v);
}

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace quant {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float load_f16(const uint8_t* p) {
  return f16_to_f32(load_u16(p));
}

// The 6-bit scale and min of Q4_K sub-block j from the 12 packed bytes: sub-blocks 0-3 keep
// theirs in the low 6 bits of bytes j and j+4; 4-7 put their low 4 bits in byte j+4's nibbles
// and their top 2 bits in the spare top bits of bytes j-4 and j.
void q4k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Nibble j (0..31) of a 16-byte array: 0..15 are low nibbles, 16..31 the high ones.
int nibble32(const uint8_t* qs, int i) {
  return i < 16 ? (qs[i] & 0x0F) : (qs[i - 16] >> 4);
}

}  // namespace

int sub_blocks_per_block(GgmlType type) {
  return (type == GgmlType::Q4_K || type == GgmlType::Q6_K) ? 8 : 1;
}

void decode_sub_block(GgmlType type, const uint8_t* b, int j, SubBlock* out) {
  out->add = 0.0f;
  switch (type) {
    case GgmlType::Q4_0: {
      out->scale[0] = out->scale[1] = load_f16(b);
      for (int i = 0; i < 32; ++i) out->w[i] = static_cast<int8_t>(nibble32(b + 2, i) - 8);
      return;
    }
    case GgmlType::Q4_1: {
      out->scale[0] = out->scale[1] = load_f16(b);
      out->add = load_f16(b + 2);
      for (int i = 0; i < 32; ++i) out->w[i] = static_cast<int8_t>(nibble32(b + 4, i));
      return;
    }
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool has_min = type == GgmlType::Q5_1;
      out->scale[0] = out->scale[1] = load_f16(b);
      if (has_min) out->add = load_f16(b + 2);
      const uint8_t* p = b + (has_min ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, p, 4);
      for (int i = 0; i < 32; ++i) {
        const int q = nibble32(p + 4, i) | static_cast<int>((qh >> i) & 1) << 4;
        out->w[i] = static_cast<int8_t>(has_min ? q : q - 16);
      }
      return;
    }
    case GgmlType::Q8_0: {
      out->scale[0] = out->scale[1] = load_f16(b);
      std::memcpy(out->w, b + 2, 32);
      return;
    }
    case GgmlType::Q4_K: {
      const float d = load_f16(b), dmin = load_f16(b + 2);
      int sc, m;
      q4k_scale_min(b + 4, j, &sc, &m);
      out->scale[0] = out->scale[1] = d * static_cast<float>(sc);
      out->add = -(dmin * static_cast<float>(m));
      // 64-element chunk j/2 uses 32 bytes: low nibbles for sub-block 2c, high for 2c+1.
      const uint8_t* qs = b + 16 + 32 * (j / 2);
      const int shift = (j & 1) * 4;
      for (int i = 0; i < 32; ++i) out->w[i] = static_cast<int8_t>((qs[i] >> shift) & 0x0F);
      return;
    }
    case GgmlType::Q6_K: {
      // Each 128-element half h has 64 B of 4-bit codes and 32 B of 2-bit high parts. Its
      // quarter q takes the bytes 32*(q&1).. of the 64, their low (q < 2) or high nibbles, and
      // the 2 bits at shift 2q of the high parts; scales go by 16 elements.
      const int h = j / 4, q = j % 4;
      const uint8_t* ql = b + 64 * h + 32 * (q & 1);
      const uint8_t* qh = b + 128 + 32 * h;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * q;
      const float d = load_f16(b + 208);
      out->scale[0] = d * static_cast<float>(sc[0]);
      out->scale[1] = d * static_cast<float>(sc[1]);
      const int lshift = (q >> 1) * 4, hshift = 2 * q;
      for (int i = 0; i < 32; ++i) {
        const int v = ((ql[i] >> lshift) & 0x0F) | (((qh[i] >> hshift) & 3) << 4);
        out->w[i] = static_cast<int8_t>(v - 32);
      }
      return;
    }
    default:
      std::memset(out, 0, sizeof(*out));
      return;
  }
}

}  // namespace quant

Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  if (!ggml_type_is_supported(type))
    return unimplemented(std::string("dequantisation of tensor type ") + ggml_type_name(type) +
                         " is not supported");
  const int64_t bs = ggml_block_size(type);
  if (n < 0 || n % bs != 0)
    return invalid_argument("dequantize_row: " + std::to_string(n) +
                            " elements is not a multiple of the " + ggml_type_name(type) +
                            " block size " + std::to_string(bs));
  const auto* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);
      return Status::Ok();
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(quant::load_u16(p + 2 * i));
      return Status::Ok();
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(quant::load_u16(p + 2 * i));
      return Status::Ok();
    default:
      break;
  }
  const int64_t bb = ggml_block_bytes(type);
  const int subs = quant::sub_blocks_per_block(type);
  quant::SubBlock sb;
  for (int64_t blk = 0; blk < n / bs; ++blk) {
    for (int j = 0; j < subs; ++j) {
      quant::decode_sub_block(type, p + blk * bb, j, &sb);
      float* out = dst + blk * bs + 32 * j;
      for (int i = 0; i < 32; ++i) {
        // Product and sum in separate statements so no compiler fuses them into one rounding:
        // the gguf package rounds the product, then adds.
        const float prod = sb.scale[i >> 4] * static_cast<float>(sb.w[i]);
        out[i] = prod + sb.add;
      }
    }
  }
  return Status::Ok();
}

}  // namespace cisa
