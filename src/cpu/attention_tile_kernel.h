// attention_tile_kernel.h — the prefill inner step of CPU attention on AVX-512: a tile of query
// rows against one block of up to 16 keys of a page, with the online-softmax update. Internal to
// src/cpu.
//
// The 16 keys of a block fill the 16 lanes of one vector once the block is transposed:
//   Kᵀ[i][j] = k_j[i]  (d × 16 floats, bf16 widened while transposing),
// so a row's scores s_r = scale · Σ_i q_r[i] · Kᵀ[i][:] are d broadcast-FMAs into one register,
// with no horizontal sums. Eight rows share each Kᵀ load (eight independent FMA chains), and the
// transposition is paid once per block for the whole tile. The softmax of a row is then one
// vector: mask by absolute position, m' = max(m, max_j s_rj), p = e^(s − m'), l = l·e^(m − m') + Σ
// p. O += P·V runs 4 rows × 64 channels at a time (16 accumulators): each V vector loaded feeds
// four FMAs, each broadcast p_rj four more, and the rescale e^(m − m') is folded into loading the
// accumulators.
//
// Every row's arithmetic (order of its FMAs, of its reductions) is the same whatever rows share
// its tile or block, so a row's result depends only on its own query and the keys it visits, in
// order: dense attention and a CISA list that holds every page give identical bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#define CISA_ATTENTION_AVX512 1
#endif

namespace cisa::cpu {

// Lanes j of a key block (first key at absolute position s0, nk ≤ 16 keys) that a query at
// position t sees: s0 + j ≤ t and, with a window W > 0, s0 + j > t − W.
inline uint32_t visible_lanes(int64_t s0, int nk, int64_t t, int64_t window) {
  const int64_t hi = t - s0;  // last visible lane
  if (hi < 0) return 0;
  uint32_t m = hi >= nk - 1 ? (nk >= 32 ? ~0u : (1u << nk) - 1u) : (1u << (hi + 1)) - 1u;
  if (window > 0) {
    const int64_t lo = t - window + 1 - s0;  // first visible lane
    if (lo >= nk) return 0;
    if (lo > 0) m &= ~((1u << lo) - 1u);
  }
  return m;
}

#ifdef CISA_ATTENTION_AVX512

inline constexpr int kKeyBlock = 16;  // keys per transposed block: one vector of lanes

inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 maskz_load16(__mmask16 k, const float* p) {
  return _mm512_maskz_loadu_ps(k, p);
}
inline __m512 maskz_load16(__mmask16 k, const uint16_t* p) {
  const __m256i h = _mm256_maskz_loadu_epi16(k, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e^x for x ≤ 0 (softmax arguments), as in attention_page_kernel.h's exp8: x = n·ln2 + r,
// |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^n in the exponent
// bits; x < −87 gives 0.
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 split in two parts
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}

// In-register transpose of 16 rows of 16 floats: row c of the result is column c of the input.
// Three rounds pair rows at distance 1 (32-bit interleave), 2 (64-bit) and 4/8 (128-bit blocks).
inline void transpose16x16(__m512* r) {
  __m512 t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // u[4q + w], 128-bit block b: column 4b + w of rows 4q … 4q+3.
  for (int qd = 0; qd < 4; ++qd) {
    const __m512d a = _mm512_castps_pd(t[4 * qd]), b = _mm512_castps_pd(t[4 * qd + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * qd + 2]), e = _mm512_castps_pd(t[4 * qd + 3]);
    u[4 * qd + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * qd + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * qd + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
    u[4 * qd + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
  }
  // Column 4b + w = [u[w].b, u[4+w].b, u[8+w].b, u[12+w].b] (128-bit blocks).
  for (int w = 0; w < 4; ++w) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[w], u[4 + w], 0x88),
                 v1 = _mm512_shuffle_f32x4(u[w], u[4 + w], 0xdd);
    const __m512 x0 = _mm512_shuffle_f32x4(u[8 + w], u[12 + w], 0x88);
    const __m512 x1 = _mm512_shuffle_f32x4(u[8 + w], u[12 + w], 0xdd);
    r[w] = _mm512_shuffle_f32x4(v0, x0, 0x88);       // block 0
    r[4 + w] = _mm512_shuffle_f32x4(v1, x1, 0x88);   // block 1
    r[8 + w] = _mm512_shuffle_f32x4(v0, x0, 0xdd);   // block 2
    r[12 + w] = _mm512_shuffle_f32x4(v1, x1, 0xdd);  // block 3
  }
}

// kt[i·16 + j] = k_j[i] for keys j < nk of a block (k: [nk][d], row stride d); lanes ≥ nk are 0.
// d is a multiple of 8.
template <class T>
inline void transpose_keys(const T* k, int nk, int d, float* kt) {
  for (int c0 = 0; c0 < d; c0 += 16) {
    const int nc = std::min(16, d - c0);
    const __mmask16 cm = static_cast<__mmask16>((1u << nc) - 1u);
    __m512 r[16];
    if (nk == 16 && nc == 16) {
      for (int j = 0; j < 16; ++j) r[j] = load16(k + static_cast<int64_t>(j) * d + c0);
    } else {
      for (int j = 0; j < 16; ++j)  // rows past nk: an empty mask reads nothing and gives zeros
        r[j] = maskz_load16(j < nk ? cm : static_cast<__mmask16>(0),
                            k + static_cast<int64_t>(std::min(j, nk - 1)) * d + c0);
    }
    transpose16x16(r);
    for (int c = 0; c < nc; ++c) _mm512_store_ps(kt + static_cast<int64_t>(c0 + c) * 16, r[c]);
  }
}

// Raw scores of 8 rows against a transposed block: s[r] = Σ_i q_r[i]·Kᵀ[i] (one chain per row,
// in order of i). Rows past n repeat the last row's query and are discarded.
inline void block_scores8(const float* const* q, int n, const float* kt, int d, __m512* s) {
  const float* p[8];
  for (int r = 0; r < 8; ++r) p[r] = q[std::min(r, n - 1)];
  __m512 a[8];
  for (auto& x : a) x = _mm512_setzero_ps();
  for (int i = 0; i < d; ++i) {
    const __m512 kv = _mm512_load_ps(kt + static_cast<int64_t>(i) * 16);
    for (int r = 0; r < 8; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[r][i]), kv, a[r]);
  }
  for (int r = 0; r < 8; ++r) s[r] = a[r];
}

// O_r = O_r·c_r + Σ_{j<nk} p_rj v_j for RB rows, channels [c0, c0 + 16·C), C = 4 or 1 (a lone
// chunk may hold only 8 channels: mask `last`). p: [rows][ps], c: per-row rescale (exactly 1
// when the row's max held, so multiplying is exact and skipping it when no row moved is too).
template <int RB, int C, class T>
inline void block_pv(float* const* acc, const float* p, int ps, const float* c, const T* v, int nk,
                     int d, int c0, __mmask16 last, bool rescale) {
  static_assert(C == 4 || C == 1);
  __m512 a0[RB], a1[RB], a2[RB], a3[RB];
  for (int r = 0; r < RB; ++r) {
    float* o = acc[r] + c0;
    if constexpr (C == 4) {
      a0[r] = _mm512_loadu_ps(o), a1[r] = _mm512_loadu_ps(o + 16);
      a2[r] = _mm512_loadu_ps(o + 32), a3[r] = _mm512_loadu_ps(o + 48);
    } else {
      a0[r] = _mm512_maskz_loadu_ps(last, o);
    }
    if (rescale) {
      const __m512 cr = _mm512_set1_ps(c[r]);
      a0[r] = _mm512_mul_ps(a0[r], cr);
      if constexpr (C == 4)
        a1[r] = _mm512_mul_ps(a1[r], cr), a2[r] = _mm512_mul_ps(a2[r], cr),
        a3[r] = _mm512_mul_ps(a3[r], cr);
    }
  }
  for (int j = 0; j < nk; ++j) {
    const T* vj = v + static_cast<int64_t>(j) * d + c0;
    if constexpr (C == 4) {
      __m512 v0 = load16(vj), v1 = load16(vj + 16), v2 = load16(vj + 32), v3 = load16(vj + 48);
      // Keep v in registers: folded into each FMA as a memory operand it would be loaded RB
      // times, and the loads, not the FMAs, would bound the loop.
      __asm__("" : "+v"(v0), "+v"(v1), "+v"(v2), "+v"(v3));
      for (int r = 0; r < RB; ++r) {
        const __m512 pb = _mm512_set1_ps(p[r * ps + j]);
        a0[r] = _mm512_fmadd_ps(pb, v0, a0[r]);
        a1[r] = _mm512_fmadd_ps(pb, v1, a1[r]);
        a2[r] = _mm512_fmadd_ps(pb, v2, a2[r]);
        a3[r] = _mm512_fmadd_ps(pb, v3, a3[r]);
      }
    } else {
      __m512 v0 = maskz_load16(last, vj);
      __asm__("" : "+v"(v0));
      for (int r = 0; r < RB; ++r)
        a0[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[r * ps + j]), v0, a0[r]);
    }
  }
  for (int r = 0; r < RB; ++r) {
    float* o = acc[r] + c0;
    if constexpr (C == 4) {
      _mm512_storeu_ps(o, a0[r]), _mm512_storeu_ps(o + 16, a1[r]);
      _mm512_storeu_ps(o + 32, a2[r]), _mm512_storeu_ps(o + 48, a3[r]);
    } else {
      _mm512_mask_storeu_ps(o, last, a0[r]);
    }
  }
}

// RB rows, every channel: 64-channel groups, then single chunks.
template <int RB, class T>
inline void rows_pv(float* const* acc, const float* p, int ps, const float* c, const T* v, int nk,
                    int d, bool rescale) {
  const __mmask16 full = 0xffff;
  int c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) block_pv<RB, 4>(acc, p, ps, c, v, nk, d, c0, full, rescale);
  for (; c0 < d; c0 += 16) {
    const __mmask16 last = d - c0 >= 16 ? full : static_cast<__mmask16>(0x00ff);
    block_pv<RB, 1>(acc, p, ps, c, v, nk, d, c0, last, rescale);
  }
}

// The scratch a tile needs beside its accumulators: Kᵀ of one block, p and c of every row.
inline int64_t tile_scratch_floats(int rows, int d) {
  return static_cast<int64_t>(d) * kKeyBlock + static_cast<int64_t>(rows) * kKeyBlock + rows + 16;
}

// One key block (nk ≤ 16 keys at absolute positions s0 …) for rows [0, R) of a tile whose row
// positions tpos are ascending. kt, p, c: scratch (kt 64-byte aligned); m, l, acc: the rows'
// online-softmax state.
template <class T>
inline void tile_key_block(const float* const* q, const int64_t* tpos, int R, const T* k,
                           const T* v, int64_t s0, int nk, int64_t window, int d, float scale,
                           float* kt, float* p, float* c, float* m, float* l, float* const* acc) {
  // Rows that see any key of the block form one run [ra, rb): positions ascend, and a later
  // position sees later keys only.
  int ra = 0, rb = R;
  while (ra < R && visible_lanes(s0, nk, tpos[ra], window) == 0) ++ra;
  while (rb > ra && visible_lanes(s0, nk, tpos[rb - 1], window) == 0) --rb;
  if (ra == rb) return;
  transpose_keys(k, nk, d, kt);
  const __m512 vscale = _mm512_set1_ps(scale),
               ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  bool rescale = false;
  for (int r0 = ra; r0 < rb; r0 += 8) {
    const int n = std::min(8, rb - r0);
    __m512 s[8];
    block_scores8(q + r0, n, kt, d, s);
    for (int i = 0; i < n; ++i) {
      const int r = r0 + i;
      const __mmask16 vis = static_cast<__mmask16>(visible_lanes(s0, nk, tpos[r], window));
      const __m512 sv = _mm512_mask_mul_ps(ninf, vis, s[i], vscale);
      const float mx = _mm512_reduce_max_ps(sv);
      float cr = 1.0f;
      if (mx > m[r]) {
        cr = std::exp(m[r] - mx);  // 0 on the row's first visible block
        m[r] = mx;
        rescale = true;
      }
      const __m512 pr = vis ? exp16(_mm512_sub_ps(sv, _mm512_set1_ps(m[r]))) : _mm512_setzero_ps();
      const __m512 pz = _mm512_maskz_mov_ps(vis, pr);
      l[r] = l[r] * cr + _mm512_reduce_add_ps(pz);
      _mm512_storeu_ps(p + static_cast<int64_t>(r) * kKeyBlock, pz);
      c[r] = cr;
    }
  }
  // Keys past the last row's position are future for every row (slots possibly unwritten): never
  // read. Keys before the first row's window are p = 0 for every row but harmless to read.
  const int jend = static_cast<int>(std::min<int64_t>(nk, tpos[rb - 1] - s0 + 1));
  int r0 = ra;
  for (; r0 + 4 <= rb; r0 += 4)
    rows_pv<4>(acc + r0, p + static_cast<int64_t>(r0) * kKeyBlock, kKeyBlock, c + r0, v, jend, d,
               rescale);
  for (; r0 + 2 <= rb; r0 += 2)
    rows_pv<2>(acc + r0, p + static_cast<int64_t>(r0) * kKeyBlock, kKeyBlock, c + r0, v, jend, d,
               rescale);
  if (r0 < rb)
    rows_pv<1>(acc + r0, p + static_cast<int64_t>(r0) * kKeyBlock, kKeyBlock, c + r0, v, jend, d,
               rescale);
}

#endif  // CISA_ATTENTION_AVX512

}  // namespace cisa::cpu
