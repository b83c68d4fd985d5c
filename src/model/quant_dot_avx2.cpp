// quant_dot_avx2.cpp — AVX2 kernels for the quantised dot products (built when the compiler
// targets AVX2 and FMA; AVX-512 VNNI's dpbusd replaces the maddubs/madd pair where available).
//
// Each 32-element weight type has a loader that turns a block into 32 byte codes, a scale ws
// and an additive term a. Types with a min (Q4_1, Q5_1) give unsigned codes u with
// element i = ws * u[i] + a, and a multiplies the activation block's sum s (llama.cpp's Q8_1
// "s"). Q8_0 gives signed codes w and uses the sign trick (|w| times x with w's sign). Types with
// a code offset c (Q4_0's 8, Q5_0's 16) give unsigned codes u and start the integer dot from the
// activation block's lane offsets -c sum q (BlockXO.off), so that each lane ends up holding the
// signed codes' sum, as in llama.cpp's kernels. Either way each of the 8 int32 lanes of a block's
// integer dot holds the sum over 4 consecutive elements, is converted to float and accumulated
// with one fused multiply-add by ws * d_x; lanes are added at the end. That is the order of
// llama.cpp's AVX2 kernels (ggml_vec_dot_*_q8_* and llamafile's tinyBLAS_Q0_AVX), so with the
// activations quantised as theirs (quant_kernels.h) the products are bit-identical to its.
// The math is the scalar kernel's (quant_dot_scalar.cpp), only the summation order differs.
#include "quant_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "cisa/model/quant.h"
#include "quant_avx2_util.h"

namespace cisa::quant {
namespace {

// 16 packed nibbles -> 32 bytes: low nibbles in bytes 0..15, high nibbles in 16..31.
inline __m256i unpack_nibbles16(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, byte i = 0x10 when bit i is set (the fifth bit of a Q5 code).
inline __m256i bit4_from_bits(uint32_t bits) {
  // Byte i takes the byte of `bits` holding bit i, then tests its own bit position i % 8.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                             0x0202020202020202, 0x0303030303030303));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

inline const BlockX& block_x(const BlockX& b) {
  return b;
}
inline const BlockX& block_x(const BlockXO& b) {
  return b.x;
}

struct Sub {
  __m256i u;    // codes (unsigned), or |w| for signed types
  __m256i sgn;  // signed types: the codes themselves (their signs are applied to x)
  __m256 ws;    // per-lane scale
  float a;      // additive term, multiplied by the activation block's sum s
};

// A loader has prepare(block, &pre), decoding what a block shares, and sub(block, j, pre),
// returning sub-block j; the tile calls sub() right before using it, so no decoded block is
// stored to memory. (The K-quants have their own kernels in quant_dot_avx2_k.cpp.)
struct NoPre {};

struct LoadQ4_0 {
  static constexpr int kSubs = 1, kBytes = 18;
  static constexpr bool kSigned = false, kLaneOffset = true;
  using XBlock = BlockXO;
  using Pre = NoPre;
  static void prepare(const uint8_t*, Pre*) {}
  static Sub sub(const uint8_t* b, int, const Pre&) {
    Sub s;
    s.u = unpack_nibbles16(b + 2);
    s.ws = _mm256_set1_ps(f16(b));
    s.a = 0.0f;
    return s;
  }
};

struct LoadQ4_1 {
  static constexpr int kSubs = 1, kBytes = 20;
  static constexpr bool kSigned = false, kLaneOffset = false;
  using XBlock = BlockX;
  using Pre = NoPre;
  static void prepare(const uint8_t*, Pre*) {}
  static Sub sub(const uint8_t* b, int, const Pre&) {
    Sub s;
    s.u = unpack_nibbles16(b + 4);
    s.ws = _mm256_set1_ps(f16(b));
    s.a = f16(b + 2);
    return s;
  }
};

// Q5_0 codes (u - 16) enter as unsigned u with the activation block's lane offsets (BlockXO.off),
// like Q4_0's (u - 8); Q5_1 keeps its unsigned codes and its min, which multiplies the
// activation block's sum s.
template <bool kMin>
struct LoadQ5 {
  static constexpr int kSubs = 1, kBytes = kMin ? 24 : 22;
  static constexpr bool kSigned = false, kLaneOffset = !kMin;
  using XBlock = std::conditional_t<kMin, BlockX, BlockXO>;
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
    s.a = kMin ? f16(b + 2) : 0.0f;
    return s;
  }
};

struct LoadQ8_0 {
  static constexpr int kSubs = 1, kBytes = 34;
  static constexpr bool kSigned = true, kLaneOffset = false;
  using XBlock = BlockX;
  using Pre = NoPre;
  static void prepare(const uint8_t*, Pre*) {}
  static Sub sub(const uint8_t* b, int, const Pre&) {
    Sub s;
    s.sgn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    s.u = _mm256_abs_epi8(s.sgn);
    s.ws = _mm256_set1_ps(f16(b));
    s.a = 0.0f;
    return s;
  }
};

// An NR x NT register tile: rows w, w + row_bytes, ... against tokens xq, xq + nb, ...
// Each weight sub-block is decoded once per tile and each activation block loaded once per
// tile; the NR * NT accumulators are independent, which hides the fused multiply-add latency.
template <class L, int NR, int NT>
void tile(const uint8_t* w, uint64_t row_bytes, const typename L::XBlock* xq, int64_t nb, float* y,
          int64_t ldy) {
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
        const auto& xb = xq[t * nb + blk * L::kSubs + j];
        const BlockX& bx = block_x(xb);
        const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bx.q));
        const __m256 dx = _mm256_set1_ps(bx.d);
        for (int r = 0; r < NR; ++r) {
          const Sub& s = sub[r];
          __m256i isum;
          if constexpr (L::kSigned)
            isum = dot_us(s.u, _mm256_sign_epi8(qx, s.sgn));
          else if constexpr (L::kLaneOffset)
            isum =
                dot_us_acc(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.off)), s.u, qx);
          else
            isum = dot_us(s.u, qx);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(s.ws, dx), acc[r][t]);
          if constexpr (!L::kSigned && !L::kLaneOffset) add[r][t] += s.a * bx.s;
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = hsum(acc[r][t]) + add[r][t];
}

// All rows against NT tokens: tiles of NR rows, then single rows for the remainder.
template <class L, int NT>
void rows_times_tokens(const uint8_t* w, uint64_t row_bytes, int64_t n_rows,
                       const typename L::XBlock* xq, int64_t nb, float* y, int64_t ldy) {
  // One row per tile, measured on Zen 4: interleaving 4 rows was 7% faster on cache-resident
  // matrices but 3x slower streaming the 178 MB output matrix from memory (prefetch streams).
  constexpr int NR = 1;
  int64_t r = 0;
  for (; r + NR <= n_rows; r += NR)
    tile<L, NR, NT>(w + r * row_bytes, row_bytes, xq, nb, y + r, ldy);
  for (; r < n_rows; ++r) tile<L, 1, NT>(w + r * row_bytes, row_bytes, xq, nb, y + r, ldy);
}

template <class L>
void tile_avx2(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const void* xv, int64_t nb,
               int64_t n_tok, float* y, int64_t ldy) {
  const auto* xq = static_cast<const typename L::XBlock*>(xv);
  int64_t t = 0;
  // Groups of 8 tokens reuse each decoded sub-block 8 times (measured ~10% faster than 4 with
  // AVX-512VL's 32 vector registers), then 4, then the remainder.
  for (; t + 8 <= n_tok; t += 8)
    rows_times_tokens<L, 8>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy);
  for (; t + 4 <= n_tok; t += 4)
    rows_times_tokens<L, 4>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy);
  switch (n_tok - t) {
    case 3:
      rows_times_tokens<L, 3>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy);
      break;
    case 2:
      rows_times_tokens<L, 2>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy);
      break;
    case 1:
      rows_times_tokens<L, 1>(w, row_bytes, n_rows, xq + t * nb, nb, y + t * ldy, ldy);
      break;
    default:
      break;
  }
}

// 8 int32 codes per vector, 4 vectors -> 32 int8 in element order. packs works within 128-bit
// lanes, so the dwords come out as (0,4,1,5,2,6,3,7) and a permute restores the order.
inline __m256i pack_codes(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// max |x| over n floats (n a multiple of 8).
inline float abs_max(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8)
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// Codes of 32 floats scaled by id, rounded to nearest even; also their 16-element sums.
inline __m256i codes32(const float* x, __m256 id, int* sum_lo, int* sum_hi) {
  __m256i q[4];
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id));
  *sum_lo = hsum_i32(_mm256_add_epi32(q[0], q[1]));
  *sum_hi = hsum_i32(_mm256_add_epi32(q[2], q[3]));
  return pack_codes(q[0], q[1], q[2], q[3]);
}

}  // namespace

void quantize_x_fast(const float* x, BlockX* out, int64_t k, XSum sum_kind) {
  for (int64_t b = 0; b < k / kBlockX; ++b) {
    const float* xb = x + b * kBlockX;
    const float amax = abs_max(xb, 32);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum0, sum1;
    const __m256i q = codes32(xb, _mm256_set1_ps(id), &sum0, &sum1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q), q);
    const float sum = static_cast<float>(sum0 + sum1);
    out[b].d = f16_to_f32(f32_to_f16(d));
    out[b].s = sum_kind == XSum::kQ8_1 ? f16_to_f32(f32_to_f16(d * sum)) : out[b].d * sum;
  }
}

void quantize_xo_fast(const float* x, BlockXO* out, int64_t k, int code_offset) {
  for (int64_t b = 0; b < k / kBlockX; ++b) {
    quantize_x_fast(x + b * kBlockX, &out[b].x, kBlockX, XSum::kQ8_0);
    // Lane sums of 4 codes, times -code_offset (dot_us with the offset in every byte).
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out[b].x.q));
    const __m256i lanes = dot_us(_mm256_set1_epi8(static_cast<char>(code_offset)), q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].off),
                        _mm256_sub_epi32(_mm256_setzero_si256(), lanes));
  }
}

void quantize_xk_fast(const float* x, BlockXK* out, int64_t k) {
  for (int64_t b = 0; b < k / kBlockXK; ++b) {
    const float* xb = x + b * kBlockXK;
    const float amax = abs_max(xb, 256);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int c = 0; c < 8; ++c) {
      int lo, hi;
      const __m256i q = codes32(xb + 32 * c, _mm256_set1_ps(id), &lo, &hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q + 32 * c), q);
      out[b].bsum[2 * c] = static_cast<int16_t>(lo);
      out[b].bsum[2 * c + 1] = static_cast<int16_t>(hi);
    }
    out[b].d = amax != 0.0f ? 1.0f / id : 0.0f;
  }
}

TileKernel tile_kernel_avx2(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
      return tile_avx2<LoadQ4_0>;
    case GgmlType::Q4_1:
      return tile_avx2<LoadQ4_1>;
    case GgmlType::Q5_0:
      return tile_avx2<LoadQ5<false>>;
    case GgmlType::Q5_1:
      return tile_avx2<LoadQ5<true>>;
    case GgmlType::Q8_0:
      return tile_avx2<LoadQ8_0>;
    default:
      return nullptr;
  }
}

}  // namespace cisa::quant

#else  // no AVX2: the scalar kernels are used

namespace cisa::quant {
TileKernel tile_kernel_avx2(GgmlType) {
  return nullptr;
}
void quantize_x_fast(const float* x, BlockX* out, int64_t k, XSum sum) {
  quantize_x(x, out, k, sum);
}
void quantize_xo_fast(const float* x, BlockXO* out, int64_t k, int code_offset) {
  quantize_xo(x, out, k, code_offset);
}
void quantize_xk_fast(const float* x, BlockXK* out, int64_t k) {
  quantize_xk(x, out, k);
}
}  // namespace cisa::quant

#endif
