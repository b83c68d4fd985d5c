// quant_dot_avx2.cpp — AVX2 kernels for the quantised dot products (built when the compiler
// targets AVX2 and FMA; AVX-512 VNNI's dpbusd replaces the maddubs/madd pair where available).
//
// Each weight type has a loader that turns one block into sub-blocks of 32 unsigned codes u
// (one byte each) with a per-lane scale vector ws and additive terms a0, a1 such that element
// i = ws[i/4 lane] * u[i] + a_{i/16}: offsets such as Q4_0's "- 8" move into a0/a1 (= -8 d),
// which multiply the activation's half sums s0/s1 instead of the codes. Q8_0 codes are signed and
// use the sign trick (|w| times x with w's sign). One activation block then costs a load, an
// integer dot product of 32 byte pairs into 8 int32 lanes, a conversion and a fused multiply-add.
// The math is the scalar kernel's (quant_dot_scalar.cpp), only the summation order differs.
#include "quant_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstring>

#include "cisa/quant.h"

namespace cisa::quant {
namespace {

// 8 int32 lanes, lane k = sum_{i<4} u[4k+i] * s[4k+i] (u unsigned, s signed bytes).
inline __m256i dot_us(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  // Pairwise u*s into int16 (cannot saturate: |u| <= 128 here, |s| <= 127), then pairs to int32.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 packed nibbles -> 32 bytes: low nibbles in bytes 0..15, high nibbles in 16..31.
inline __m256i unpack_nibbles16(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, byte i = 0x10 when bit i is set (the fifth bit of a Q5 code).
inline __m256i bit4_from_bits(uint32_t bits) {
  // Byte i takes the byte of `bits` holding bit i, then tests its own bit position i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

struct Sub {
  __m256i u;    // codes (unsigned), or |w| for signed types
  __m256i sgn;  // signed types: the codes themselves (their signs are applied to x)
  __m256 ws;    // per-lane scale
  float a0, a1; // additive terms per half, multiplied by the activation's s0 / s1
};

struct LoadQ4_0 {
  static constexpr int kSubs = 1, kBytes = 18;
  static constexpr bool kSigned = false;
  static void load(const uint8_t* b, Sub* s) {
    const float d = f16(b);
    s->u = unpack_nibbles16(b + 2);
    s->ws = _mm256_set1_ps(d);
    s->a0 = s->a1 = -8.0f * d;
  }
};

struct LoadQ4_1 {
  static constexpr int kSubs = 1, kBytes = 20;
  static constexpr bool kSigned = false;
  static void load(const uint8_t* b, Sub* s) {
    s->u = unpack_nibbles16(b + 4);
    s->ws = _mm256_set1_ps(f16(b));
    s->a0 = s->a1 = f16(b + 2);
  }
};

template <bool kMin>
struct LoadQ5 {
  static constexpr int kSubs = 1, kBytes = kMin ? 24 : 22;
  static constexpr bool kSigned = false;
  static void load(const uint8_t* b, Sub* s) {
    const float d = f16(b);
    const uint8_t* p = b + (kMin ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    s->u = _mm256_or_si256(unpack_nibbles16(p + 4), bit4_from_bits(qh));
    s->ws = _mm256_set1_ps(d);
    s->a0 = s->a1 = kMin ? f16(b + 2) : -16.0f * d;
  }
};

struct LoadQ8_0 {
  static constexpr int kSubs = 1, kBytes = 34;
  static constexpr bool kSigned = true;
  static void load(const uint8_t* b, Sub* s) {
    s->sgn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    s->u = _mm256_abs_epi8(s->sgn);
    s->ws = _mm256_set1_ps(f16(b));
    s->a0 = s->a1 = 0.0f;
  }
};

struct LoadQ4_K {
  static constexpr int kSubs = 8, kBytes = 144;
  static constexpr bool kSigned = false;
  static void load(const uint8_t* b, Sub* s) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* sc = b + 4;
    for (int j = 0; j < 8; ++j) {
      // 6-bit scale and min, packed as in quant_dequant.cpp (q4k_scale_min).
      const int scale = j < 4 ? (sc[j] & 63) : ((sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4));
      const int min = j < 4 ? (sc[j + 4] & 63) : ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
      s[j].ws = _mm256_set1_ps(d * static_cast<float>(scale));
      s[j].a0 = s[j].a1 = -(dmin * static_cast<float>(min));
    }
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
      s[2 * c].u = _mm256_and_si256(q, lo4);
      s[2 * c + 1].u = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
    }
  }
};

struct LoadQ6_K {
  static constexpr int kSubs = 8, kBytes = 210;
  static constexpr bool kSigned = false;
  static void load(const uint8_t* b, Sub* s) {
    const float d = f16(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      // Quarter q: nibbles of ql0/ql1 (low for q < 2) plus bits 2q..2q+1 of qh as bits 4..5.
      Sub* o = s + 4 * h;
      o[0].u = _mm256_or_si256(_mm256_and_si256(ql0, lo4),
                               _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
      o[1].u = _mm256_or_si256(_mm256_and_si256(ql1, lo4),
                               _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
      o[2].u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), lo4),
                               _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
      o[3].u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), lo4),
                               _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(static_cast<char>(0xC0))), 2));
      for (int q = 0; q < 4; ++q) {
        const float s0 = d * static_cast<float>(sc[8 * h + 2 * q]);
        const float s1 = d * static_cast<float>(sc[8 * h + 2 * q + 1]);
        o[q].ws = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));  // lanes 0-3: elements 0..15
        o[q].a0 = -32.0f * s0;
        o[q].a1 = -32.0f * s1;
      }
    }
  }
};

// NT tokens against each of n_rows rows; the tokens' blocks are nb apart in xq.
template <class L, int NT>
void rows_times_tokens(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const BlockX* xq,
                       int64_t nb, float* y, int64_t ldy) {
  const int64_t n_blocks = nb / L::kSubs;
  Sub sub[L::kSubs];
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + static_cast<uint64_t>(r) * row_bytes;
    __m256 acc[NT];
    float add[NT];
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_setzero_ps();
      add[t] = 0.0f;
    }
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      L::load(row + blk * L::kBytes, sub);
      for (int j = 0; j < L::kSubs; ++j) {
        const Sub& s = sub[j];
        for (int t = 0; t < NT; ++t) {
          const BlockX& bx = xq[t * nb + blk * L::kSubs + j];
          __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bx.q));
          if constexpr (L::kSigned) qx = _mm256_sign_epi8(qx, s.sgn);
          const __m256i isum = dot_us(s.u, qx);
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(s.ws, _mm256_set1_ps(bx.d)), acc[t]);
          if constexpr (!L::kSigned) add[t] += s.a0 * bx.s0 + s.a1 * bx.s1;
        }
      }
    }
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = hsum(acc[t]) + add[t];
  }
}

template <class L>
void tile_avx2(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const BlockX* xq, int64_t nb,
               int64_t n_tok, float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= n_tok; t += 4) rows_times_tokens<L, 4>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy);
  switch (n_tok - t) {
    case 3: rows_times_tokens<L, 3>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy); break;
    case 2: rows_times_tokens<L, 2>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy); break;
    case 1: rows_times_tokens<L, 1>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy); break;
    default: break;
  }
}

}  // namespace

TileKernel tile_kernel_avx2(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return tile_avx2<LoadQ4_0>;
    case GgmlType::Q4_1: return tile_avx2<LoadQ4_1>;
    case GgmlType::Q5_0: return tile_avx2<LoadQ5<false>>;
    case GgmlType::Q5_1: return tile_avx2<LoadQ5<true>>;
    case GgmlType::Q8_0: return tile_avx2<LoadQ8_0>;
    case GgmlType::Q4_K: return tile_avx2<LoadQ4_K>;
    case GgmlType::Q6_K: return tile_avx2<LoadQ6_K>;
    default: return nullptr;
  }
}

}  // namespace cisa::quant

#else  // no AVX2: the scalar kernels are used

namespace cisa::quant {
TileKernel tile_kernel_avx2(GgmlType) { return nullptr; }
}  // namespace cisa::quant

#endif
