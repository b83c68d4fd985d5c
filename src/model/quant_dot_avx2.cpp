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
#if defined(__F16C__)
  return _cvtsh_ss(h);  // exact, like f16_to_f32, in one instruction
#else
  return f16_to_f32(h);
#endif
}

struct Sub {
  __m256i u;    // codes (unsigned), or |w| for signed types
  __m256i sgn;  // signed types: the codes themselves (their signs are applied to x)
  __m256 ws;    // per-lane scale
  float a0, a1; // additive terms per half: a0 * s0 + a1 * s1 when the loader sets kHalves,
                // else a0 == a1 and the term is a0 * s (the whole block's sum)
};

// A loader has prepare(block, &pre), decoding what a block shares (K-quant scales), and
// sub(block, j, pre), returning sub-block j; the tile calls sub() right before using it, so no
// decoded block is stored to memory.
struct NoPre {};

inline __m256i shift_right16(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }

struct LoadQ4_0 {
  static constexpr int kSubs = 1, kBytes = 18;
  static constexpr bool kSigned = false, kHalves = false;
  using Pre = NoPre;
  static void prepare(const uint8_t*, Pre*) {}
  static Sub sub(const uint8_t* b, int, const Pre&) {
    const float d = f16(b);
    Sub s;
    s.u = unpack_nibbles16(b + 2);
    s.ws = _mm256_set1_ps(d);
    s.a0 = s.a1 = -8.0f * d;
    return s;
  }
};

struct LoadQ4_1 {
  static constexpr int kSubs = 1, kBytes = 20;
  static constexpr bool kSigned = false, kHalves = false;
  using Pre = NoPre;
  static void prepare(const uint8_t*, Pre*) {}
  static Sub sub(const uint8_t* b, int, const Pre&) {
    Sub s;
    s.u = unpack_nibbles16(b + 4);
    s.ws = _mm256_set1_ps(f16(b));
    s.a0 = s.a1 = f16(b + 2);
    return s;
  }
};

template <bool kMin>
struct LoadQ5 {
  static constexpr int kSubs = 1, kBytes = kMin ? 24 : 22;
  static constexpr bool kSigned = false, kHalves = false;
  using Pre = NoPre;
  static void prepare(const uint8_t*, Pre*) {}
  static Sub sub(const uint8_t* b, int, const Pre&) {
    const float d = f16(b);
    const uint8_t* p = b + (kMin ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    Sub s;
    s.u = _mm256_or_si256(unpack_nibbles16(p + 4), bit4_from_bits(qh));
    s.ws = _mm256_set1_ps(d);
    s.a0 = s.a1 = kMin ? f16(b + 2) : -16.0f * d;
    return s;
  }
};

struct LoadQ8_0 {
  static constexpr int kSubs = 1, kBytes = 34;
  static constexpr bool kSigned = true, kHalves = false;
  using Pre = NoPre;
  static void prepare(const uint8_t*, Pre*) {}
  static Sub sub(const uint8_t* b, int, const Pre&) {
    Sub s;
    s.sgn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    s.u = _mm256_abs_epi8(s.sgn);
    s.ws = _mm256_set1_ps(f16(b));
    s.a0 = s.a1 = 0.0f;
    return s;
  }
};

struct LoadQ4_K {
  static constexpr int kSubs = 8, kBytes = 144;
  static constexpr bool kSigned = false, kHalves = false;
  struct Pre {
    float ws[8], a[8];
  };
  static void prepare(const uint8_t* b, Pre* p) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* sc = b + 4;
    for (int j = 0; j < 8; ++j) {
      // 6-bit scale and min, packed as in quant_dequant.cpp (q4k_scale_min).
      const int scale = j < 4 ? (sc[j] & 63) : ((sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4));
      const int min = j < 4 ? (sc[j + 4] & 63) : ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
      p->ws[j] = d * static_cast<float>(scale);
      p->a[j] = -(dmin * static_cast<float>(min));
    }
  }
  static Sub sub(const uint8_t* b, int j, const Pre& p) {
    // 32 code bytes per pair of sub-blocks: low nibbles for even j, high for odd.
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (j >> 1)));
    Sub s;
    s.u = _mm256_and_si256(shift_right16(q, 4 * (j & 1)), _mm256_set1_epi8(0x0F));
    s.ws = _mm256_set1_ps(p.ws[j]);
    s.a0 = s.a1 = p.a[j];
    return s;
  }
};

struct LoadQ6_K {
  static constexpr int kSubs = 8, kBytes = 210;
  static constexpr bool kSigned = false, kHalves = true;  // a scale (and offset) per 16 elements
  struct Pre {
    float scale[16];
  };
  static void prepare(const uint8_t* b, Pre* p) {
    const float d = f16(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int i = 0; i < 16; ++i) p->scale[i] = d * static_cast<float>(sc[i]);
  }
  static Sub sub(const uint8_t* b, int j, const Pre& p) {
    // Half h = j / 4, quarter q = j % 4: the nibbles of ql[64h + 32(q & 1) ..] (low for q < 2)
    // plus bits 2q..2q+1 of qh[32h ..] as bits 4..5.
    const int h = j >> 2, q = j & 3;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (q & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(shift_right16(ql, 4 * (q >> 1)), _mm256_set1_epi8(0x0F));
    const __m256i hi = _mm256_and_si256(shift_right16(qh, 2 * q), _mm256_set1_epi8(0x03));
    Sub s;
    s.u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    const float s0 = p.scale[8 * h + 2 * q], s1 = p.scale[8 * h + 2 * q + 1];
    s.ws = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));  // lanes 0-3: elements 0..15
    s.a0 = -32.0f * s0;
    s.a1 = -32.0f * s1;
    return s;
  }
};

// An NR x NT register tile: rows w, w + row_bytes, ... against tokens xq, xq + nb, ...
// Each weight sub-block is decoded once per tile and each activation block loaded once per
// tile; the NR * NT accumulators are independent, which hides the fused multiply-add latency.
template <class L, int NR, int NT>
void tile(const uint8_t* w, uint64_t row_bytes, const BlockX* xq, int64_t nb, float* y, int64_t ldy) {
  const int64_t n_blocks = nb / L::kSubs;
  typename L::Pre pre[NR];
  __m256 acc[NR][NT];
  float add[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      add[r][t] = 0.0f;
    }
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    for (int r = 0; r < NR; ++r) L::prepare(w + r * row_bytes + blk * L::kBytes, &pre[r]);
#pragma GCC unroll 8
    for (int j = 0; j < L::kSubs; ++j) {
      Sub sub[NR];
      for (int r = 0; r < NR; ++r) sub[r] = L::sub(w + r * row_bytes + blk * L::kBytes, j, pre[r]);
      for (int t = 0; t < NT; ++t) {
        const BlockX& bx = xq[t * nb + blk * L::kSubs + j];
        const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bx.q));
        const __m256 dx = _mm256_set1_ps(bx.d);
        for (int r = 0; r < NR; ++r) {
          const Sub& s = sub[r];
          __m256i isum;
          if constexpr (L::kSigned) isum = dot_us(s.u, _mm256_sign_epi8(qx, s.sgn));
          else isum = dot_us(s.u, qx);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(s.ws, dx), acc[r][t]);
          if constexpr (L::kHalves) add[r][t] += s.a0 * bx.s0 + s.a1 * bx.s1;
          else if constexpr (!L::kSigned) add[r][t] += s.a0 * bx.s;
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = hsum(acc[r][t]) + add[r][t];
}

// All rows against NT tokens: tiles of NR rows, then single rows for the remainder.
template <class L, int NT>
void rows_times_tokens(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const BlockX* xq,
                       int64_t nb, float* y, int64_t ldy) {
  constexpr int NR = NT == 1 ? 4 : 2;
  int64_t r = 0;
  for (; r + NR <= n_rows; r += NR) tile<L, NR, NT>(w + r * row_bytes, row_bytes, xq, nb, y + r, ldy);
  for (; r < n_rows; ++r) tile<L, 1, NT>(w + r * row_bytes, row_bytes, xq, nb, y + r, ldy);
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
