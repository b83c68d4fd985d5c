// attention_decode_kernel.h — the decode inner step of CPU attention on AVX-512: up to 4 query
// rows (the heads of one KV group at one position) against a block of 16 keys, fused: scores,
// online softmax and O += P·V in one call, the scores never leaving registers. Internal to src/cpu.
//
// A decode step has too few rows to pay for transposing keys (attention_tile_kernel.h), so the
// scores are dot products along the channels: each K vector loaded feeds the FMAs of every row,
// and a row's four per-key partial vectors are summed across lanes once per four keys
// (hsum4x16), filling one 16-lane vector of the row's scores. Then, per row, as in the tile
// kernel: mask by absolute position, m' = max(m, max_j s_j), p = e^(s − m'),
// l = l·e^(m − m') + Σ p, and O = O·e^(m − m') + Σ_j p_j v_j with 4 rows × 64 channels of
// accumulators in registers.
//
// bf16 K and V are widened without shuffles: a 64-byte load holds 32 channels as 16 (even, odd)
// pairs of 16-bit values; shifting each 32-bit lane left by 16 gives the even channels as f32 and
// clearing its low half gives the odd ones. The kernel's query copies and accumulators use that
// order — within each block of 32 channels, the 16 even channels, then the 16 odd ones — so dot
// products and O += p·v need no reordering; the caller orders a query once per task
// (order_channels) and restores the accumulators' natural order once at the end
// (natural_channels). f32 data keeps the natural order (both are copies/no-ops). Requires
// d % 32 == 0.
//
// A row's arithmetic (order of its FMAs and reductions) does not depend on which rows share its
// block, so dense attention and a CISA list holding every page give identical bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attention_page_kernel.h"
#include "attention_tile_kernel.h"

namespace cisa::cpu {

#ifdef CISA_ATTENTION_AVX512

// Whether the fused decode kernel serves head dimension d and page size B.
inline bool decode_kernel_fits(int d, int B) {
  return d % 32 == 0 && B % kKeyBlock == 0;
}

// The kernel's channel order for element type T: even/odd within 32-channel blocks for bf16.
template <class T>
inline constexpr bool kEvenOdd = std::is_same_v<T, uint16_t>;

// y = x in the kernel's channel order for T (d % 32 == 0).
template <class T>
inline void order_channels(const float* x, int d, float* y) {
  if constexpr (!kEvenOdd<T>) {
    std::memcpy(y, x, static_cast<size_t>(d) * sizeof(float));
  } else {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int i = 0; i < d; i += 32) {
      const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
      _mm512_storeu_ps(y + i, _mm512_permutex2var_ps(a, even, b));
      _mm512_storeu_ps(y + i + 16, _mm512_permutex2var_ps(a, odd, b));
    }
  }
}

// The inverse of order_channels, in place.
template <class T>
inline void natural_channels(float* y, int d) {
  if constexpr (kEvenOdd<T>) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int i = 0; i < d; i += 32) {
      const __m512 e = _mm512_loadu_ps(y + i), o = _mm512_loadu_ps(y + i + 16);
      _mm512_storeu_ps(y + i, _mm512_permutex2var_ps(e, lo, o));
      _mm512_storeu_ps(y + i + 16, _mm512_permutex2var_ps(e, hi, o));
    }
  } else {
    (void)y, (void)d;
  }
}

// 32 channels at p as f32 vectors, in the kernel's order: (lo, hi) = (even, odd) for bf16,
// (first 16, last 16) for f32.
inline void load32(const float* p, __m512& lo, __m512& hi) {
  lo = _mm512_loadu_ps(p);
  hi = _mm512_loadu_ps(p + 16);
}
inline void load32(const uint16_t* p, __m512& lo, __m512& hi) {
  const __m512i x = _mm512_loadu_si512(p);
  lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Asks for the cache line of element `off` of the next block (null: none). Each line of the block
// being computed comes with a prefetch of the same line of the next one, so the next block's K
// and V stream in while this one is computed; the hardware prefetchers alone leave the two
// nearly serial (measured: time ≈ compute + transfer) and do not follow scattered pages.
template <class T>
inline void prefetch_line(const T* next, int64_t off) {
  if (next) _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T2);
}

// Raw scores of NR rows against keys 4Q … 4Q+3 of the block, into lanes 4Q … 4Q+3 of s[r].
template <int Q, int NR, class T>
inline void decode_quad(const float* const* q, const T* k, const T* next_k, int d, __m512* s) {
  __m512 a[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int x = 0; x < 4; ++x) a[r][x] = _mm512_setzero_ps();
  const T* k0 = k + static_cast<int64_t>(4 * Q) * d;
  for (int i = 0; i < d; i += 32) {
    __m512 lo[4], hi[4];
    for (int x = 0; x < 4; ++x) load32(k0 + static_cast<int64_t>(x) * d + i, lo[x], hi[x]);
    for (int x = 0; x < 4; ++x) prefetch_line(next_k, (4 * Q + x) * d + i);
    for (int r = 0; r < NR; ++r) {
      const __m512 qlo = _mm512_loadu_ps(q[r] + i), qhi = _mm512_loadu_ps(q[r] + i + 16);
      for (int x = 0; x < 4; ++x)
        a[r][x] = _mm512_fmadd_ps(qhi, hi[x], _mm512_fmadd_ps(qlo, lo[x], a[r][x]));
    }
  }
  for (int r = 0; r < NR; ++r) s[r] = _mm512_insertf32x4(s[r], hsum4x16(a[r]), Q);
}

// O_r = O_r·c_r + Σ_{j<nk} p_rj v_j for NR rows over channels [c0, c0 + 32·P), P = 1 or 2.
template <int NR, int P, class T>
inline void decode_pv(float* const* acc, const float* p, const float* c, bool rescale, const T* v,
                      const T* next_v, int nk, int d, int c0) {
  __m512 a[NR][2 * P];
  for (int r = 0; r < NR; ++r)
    for (int x = 0; x < 2 * P; ++x) {
      a[r][x] = _mm512_loadu_ps(acc[r] + c0 + 16 * x);
      if (rescale) a[r][x] = _mm512_mul_ps(a[r][x], _mm512_set1_ps(c[r]));
    }
  for (int j = 0; j < nk; ++j) {
    __m512 w[2 * P];
    for (int x = 0; x < P; ++x)
      load32(v + static_cast<int64_t>(j) * d + c0 + 32 * x, w[2 * x], w[2 * x + 1]);
    for (int x = 0; x < P; ++x) prefetch_line(next_v, j * d + c0 + 32 * x);
    for (int r = 0; r < NR; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * kKeyBlock + j]);
      for (int x = 0; x < 2 * P; ++x) a[r][x] = _mm512_fmadd_ps(pb, w[x], a[r][x]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int x = 0; x < 2 * P; ++x) _mm512_storeu_ps(acc[r] + c0 + 16 * x, a[r][x]);
}

// One block of 16 keys (K and V rows at k and v, stride d) for NR rows; next_k and next_v: the
// block computed next (prefetched), or null. q and acc: the rows'
// query and accumulator, in the kernel's channel order for T; vis[r]: the lanes row r sees;
// jend: keys at or past it are in the future of every row (their slots may be unwritten, so
// neither K nor V is read there beyond the last partial quad of scores, whose lanes are masked).
// p: scratch of NR·16 floats, 64-byte aligned.
template <int NR, class T>
inline void decode_block(const float* const* q, const T* k, const T* v, const T* next_k,
                         const T* next_v, int d, float scale, const uint32_t* vis, int jend,
                         float* m, float* l, float* const* acc, float* p) {
  __m512 s[NR];
  for (int r = 0; r < NR; ++r) s[r] = _mm512_setzero_ps();
  decode_quad<0, NR>(q, k, next_k, d, s);
  if (jend > 4) decode_quad<1, NR>(q, k, next_k, d, s);
  if (jend > 8) decode_quad<2, NR>(q, k, next_k, d, s);
  if (jend > 12) decode_quad<3, NR>(q, k, next_k, d, s);

  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 vscale = _mm512_set1_ps(scale);
  float c[NR];
  bool rescale = false;
  for (int r = 0; r < NR; ++r) {
    c[r] = 1.0f;
    const auto mk = static_cast<__mmask16>(vis[r]);
    if (mk == 0) {  // nothing visible to this row in the block
      _mm512_store_ps(p + r * kKeyBlock, _mm512_setzero_ps());
      continue;
    }
    const __m512 sv = _mm512_mask_mul_ps(ninf, mk, s[r], vscale);
    const float mx = _mm512_reduce_max_ps(sv);
    if (mx > m[r]) {
      c[r] = std::exp(m[r] - mx);  // 0 on the row's first visible block
      m[r] = mx;
      rescale = true;
    }
    const __m512 pr = _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(sv, _mm512_set1_ps(m[r]))));
    l[r] = l[r] * c[r] + _mm512_reduce_add_ps(pr);
    _mm512_store_ps(p + r * kKeyBlock, pr);
  }
  int c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) decode_pv<NR, 2>(acc, p, c, rescale, v, next_v, jend, d, c0);
  if (c0 < d) decode_pv<NR, 1>(acc, p, c, rescale, v, next_v, jend, d, c0);
}

// decode_block for nr = 1 … 4 rows.
template <class T>
inline void decode_block_rows(int nr, const float* const* q, const T* k, const T* v,
                              const T* next_k, const T* next_v, int d, float scale,
                              const uint32_t* vis, int jend, float* m, float* l, float* const* acc,
                              float* p) {
  switch (nr) {
    case 4:
      decode_block<4>(q, k, v, next_k, next_v, d, scale, vis, jend, m, l, acc, p);
      break;
    case 3:
      decode_block<3>(q, k, v, next_k, next_v, d, scale, vis, jend, m, l, acc, p);
      break;
    case 2:
      decode_block<2>(q, k, v, next_k, next_v, d, scale, vis, jend, m, l, acc, p);
      break;
    default:
      decode_block<1>(q, k, v, next_k, next_v, d, scale, vis, jend, m, l, acc, p);
      break;
  }
}

#endif  // CISA_ATTENTION_AVX512

}  // namespace cisa::cpu
