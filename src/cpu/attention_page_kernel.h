// attention_page_kernel.h — the inner step of CPU attention: a block of up to 4 query rows against
// one page of B keys and values, with the online-softmax update. Internal to src/cpu.
//
// For rows r and keys j of the page:  s_rj = scale · q_r·k_j  (−∞ where masked)
//   m_r' = max(m_r, max_j s_rj);  l_r = l_r·e^(m_r − m_r') + Σ_j e^(s_rj − m_r');
//   acc_r = acc_r·e^(m_r − m_r') + Σ_j e^(s_rj − m_r') v_j
// K and V are read in place (f32) or widened as they are loaded (bf16). AVX-512 and AVX2+FMA
// versions are used where the compiler targets them; the portable loops are their specification.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attention_tile_kernel.h"
#include "cisa/core/bf16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CISA_ATTENTION_AVX2 1
#endif

namespace cisa::cpu {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Mask callback result for one (row, key): visible or not. `full` pages skip the callback.
struct PageMask {
  int64_t s0;           // absolute position of the page's first key
  const int64_t* tpos;  // absolute position of each row
  int64_t window;       // 0: none
  bool full;            // every key visible to every row
  bool visible(int r, int j) const {
    const int64_t pos = s0 + j;
    return full || (pos <= tpos[r] && (window == 0 || pos > tpos[r] - window));
  }
};

inline float widen1(float x) {
  return x;
}
inline float widen1(uint16_t x) {
  return bf16_to_f32(x);
}

#ifdef CISA_ATTENTION_AVX2
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float hsum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
// e^x for x ≤ 0 (softmax arguments): x = n·ln2 + r, |r| ≤ ln2/2, e^r by its degree-6 Taylor
// polynomial (relative error < 2e-7), 2^n built in the exponent bits; x < −87 (and −∞) give 0.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 split in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

#ifdef CISA_ATTENTION_AVX2
// Sums of eight vectors, as one vector: lane i = Σ of v[i]'s lanes (a transpose-and-add).
inline __m256 hsum8x8(const __m256* v) {
  const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
  // a = [s0 s1 s2 s3 | s0' s1' s2' s3'] (halves of sums 0–3), b likewise for 4–7.
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

#ifdef CISA_ATTENTION_AVX512
// The four sums of four vectors: lane x = Σ of v[x]'s lanes.
inline __m128 hsum4x16(const __m512* v) {
  __m256 y[4];
  for (int x = 0; x < 4; ++x)
    y[x] = _mm256_add_ps(_mm512_castps512_ps256(v[x]), _mm512_extractf32x8_ps(v[x], 1));
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(y[0], y[1]), _mm256_hadd_ps(y[2], y[3]));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Scores of NR rows against B keys, four keys at a time: NR × 4 accumulators of 16 channels, so
// each K vector loaded feeds NR FMAs and each query vector four.
template <int NR, class T>
inline void page_scores512(const float* const* q, const T* k, int B, int d, float scale, float* s) {
  const int dm = d & ~15;  // channels in whole vectors; d − dm is 0 or 8
  const __mmask16 tail = 0x00ff;
  int j0 = 0;
  for (; j0 + 4 <= B; j0 += 4) {
    const T* kj = k + static_cast<int64_t>(j0) * d;
    __m512 a[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int x = 0; x < 4; ++x) a[r][x] = _mm512_setzero_ps();
    for (int i = 0; i < dm; i += 16) {
      __m512 kv[4];
      for (int x = 0; x < 4; ++x) kv[x] = load16(kj + static_cast<int64_t>(x) * d + i);
      for (int r = 0; r < NR; ++r) {
        const __m512 qv = _mm512_loadu_ps(q[r] + i);
        for (int x = 0; x < 4; ++x) a[r][x] = _mm512_fmadd_ps(qv, kv[x], a[r][x]);
      }
    }
    if (dm < d) {
      __m512 kv[4];
      for (int x = 0; x < 4; ++x) kv[x] = maskz_load16(tail, kj + static_cast<int64_t>(x) * d + dm);
      for (int r = 0; r < NR; ++r) {
        const __m512 qv = _mm512_maskz_loadu_ps(tail, q[r] + dm);
        for (int x = 0; x < 4; ++x) a[r][x] = _mm512_fmadd_ps(qv, kv[x], a[r][x]);
      }
    }
    for (int r = 0; r < NR; ++r)
      _mm_storeu_ps(s + r * B + j0, _mm_mul_ps(hsum4x16(a[r]), _mm_set1_ps(scale)));
  }
  for (int j = j0; j < B; ++j) {
    const T* kj = k + static_cast<int64_t>(j) * d;
    __m512 a[NR];
    for (int r = 0; r < NR; ++r) a[r] = _mm512_setzero_ps();
    for (int i = 0; i < d; i += 16) {
      const __mmask16 m = d - i >= 16 ? static_cast<__mmask16>(0xffff) : tail;
      const __m512 kv = maskz_load16(m, kj + i);
      for (int r = 0; r < NR; ++r)
        a[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q[r] + i), kv, a[r]);
    }
    for (int r = 0; r < NR; ++r) s[r * B + j] = _mm512_reduce_add_ps(a[r]) * scale;
  }
}
#endif

// Scores of NR rows against B keys: s[r·B + j].
template <int NR, class T>
inline void page_scores(const float* const* q, const T* k, int B, int d, float scale, float* s) {
#if defined(CISA_ATTENTION_AVX512)
  page_scores512<NR>(q, k, B, d, scale, s);
#elif defined(CISA_ATTENTION_AVX2)
  int j0 = 0;
  if constexpr (NR == 4) {
    // Four rows × two keys: eight accumulators, one K load feeds four FMAs, one reduction.
    alignas(32) float sums[8];
    for (; j0 + 2 <= B; j0 += 2) {
      const T* ka = k + static_cast<int64_t>(j0) * d;
      const T* kb = ka + d;
      __m256 acc[8];
      for (auto& a : acc) a = _mm256_setzero_ps();
      for (int i = 0; i < d; i += 8) {
        const __m256 x = load8(ka + i), y = load8(kb + i);
        for (int r = 0; r < 4; ++r) {
          const __m256 qv = _mm256_loadu_ps(q[r] + i);
          acc[2 * r] = _mm256_fmadd_ps(qv, x, acc[2 * r]);
          acc[2 * r + 1] = _mm256_fmadd_ps(qv, y, acc[2 * r + 1]);
        }
      }
      _mm256_store_ps(sums, _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
      for (int r = 0; r < 4; ++r) {
        s[r * B + j0] = sums[2 * r];
        s[r * B + j0 + 1] = sums[2 * r + 1];
      }
    }
  }
  for (int j = j0; j < B; ++j) {
    const T* kj = k + static_cast<int64_t>(j) * d;
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) {
      const __m256 kv = load8(kj + i);
      for (int r = 0; r < NR; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), kv, acc[r]);
    }
    for (int r = 0; r < NR; ++r) s[r * B + j] = hsum8(acc[r]) * scale;
  }
#else
  for (int j = 0; j < B; ++j)
    for (int r = 0; r < NR; ++r) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int i = 0; i < d; i += 8)
        for (int l = 0; l < 8; ++l)
          acc[l] += q[r][i + l] * widen1(k[static_cast<int64_t>(j) * d + i + l]);
      s[r * B + j] =
          (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) *
          scale;
    }
#endif
}

// Online-softmax update of NR rows with one page. s is overwritten with the probabilities.
template <int NR, class T>
inline void page_update(const PageMask& mask, float* s, const T* v, int B, int d, float* m,
                        float* l, float* const* acc) {
  bool any = false;
  for (int r = 0; r < NR; ++r) {
    float* sr = s + r * B;
    if (!mask.full)
      for (int j = 0; j < B; ++j)
        if (!mask.visible(r, j)) sr[j] = kNegInf;
    float mx = kNegInf;
    for (int j = 0; j < B; ++j) mx = std::max(mx, sr[j]);
    if (mx == kNegInf) {  // nothing visible to this row on this page
      for (int j = 0; j < B; ++j) sr[j] = 0.0f;
      continue;
    }
    any = true;
    if (mx > m[r]) {
      const float c = std::exp(m[r] - mx);  // 0 on the row's first visible page
      l[r] *= c;
      for (int i = 0; i < d; ++i) acc[r][i] *= c;
      m[r] = mx;
    }
    float sum = 0.0f;
#ifdef CISA_ATTENTION_AVX2
    int j = 0;
    const __m256 mv = _mm256_set1_ps(m[r]);
    for (; j + 8 <= B; j += 8) {
      const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mv));
      _mm256_storeu_ps(sr + j, p);
      sum += hsum8(p);
    }
    for (; j < B; ++j) sum += (sr[j] = sr[j] == kNegInf ? 0.0f : std::exp(sr[j] - m[r]));
#else
    for (int j = 0; j < B; ++j) sum += (sr[j] = sr[j] == kNegInf ? 0.0f : std::exp(sr[j] - m[r]));
#endif
    l[r] += sum;
  }
  if (!any) return;
  // Keys past the last row's position are in the future for every row: their slots may not even
  // be written yet, so they are not read at all (0·garbage could be NaN).
  const int jend =
      mask.full ? B : static_cast<int>(std::min<int64_t>(B, mask.tpos[NR - 1] - mask.s0 + 1));
  // acc_r += Σ_j p_rj v_j, 16 output channels at a time so the NR×2 accumulators stay in registers.
#if defined(CISA_ATTENTION_AVX512)
  rows_pv<NR>(acc, s, B, nullptr, v, jend, d,
              /*rescale=*/false);  // 64 channels × NR rows at a time
#elif defined(CISA_ATTENTION_AVX2)
  int i = 0;
  for (; i + 16 <= d; i += 16) {
    __m256 a[NR][2];
    for (int r = 0; r < NR; ++r) {
      a[r][0] = _mm256_loadu_ps(acc[r] + i);
      a[r][1] = _mm256_loadu_ps(acc[r] + i + 8);
    }
    for (int j = 0; j < jend; ++j) {
      const T* vj = v + static_cast<int64_t>(j) * d + i;
      const __m256 v0 = load8(vj), v1 = load8(vj + 8);
      for (int r = 0; r < NR; ++r) {
        const __m256 p = _mm256_broadcast_ss(s + r * B + j);
        a[r][0] = _mm256_fmadd_ps(p, v0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(p, v1, a[r][1]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      _mm256_storeu_ps(acc[r] + i, a[r][0]);
      _mm256_storeu_ps(acc[r] + i + 8, a[r][1]);
    }
  }
  if (i < d) {  // head_dim is a multiple of 8: at most one 8-wide remainder
    __m256 a[NR];
    for (int r = 0; r < NR; ++r) a[r] = _mm256_loadu_ps(acc[r] + i);
    for (int j = 0; j < jend; ++j) {
      const __m256 v0 = load8(v + static_cast<int64_t>(j) * d + i);
      for (int r = 0; r < NR; ++r)
        a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(s + r * B + j), v0, a[r]);
    }
    for (int r = 0; r < NR; ++r) _mm256_storeu_ps(acc[r] + i, a[r]);
  }
#else
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < jend; ++j) {
      const float p = s[r * B + j];
      if (p == 0.0f) continue;
      for (int i = 0; i < d; ++i) acc[r][i] += p * widen1(v[static_cast<int64_t>(j) * d + i]);
    }
#endif
}

// One page for `nr` (1…4) rows starting at row r0 of a tile.
template <class T>
inline void page_step(int nr, const float* const* q, const T* k, const T* v, const PageMask& mask,
                      int B, int d, float scale, float* s, float* m, float* l, float* const* acc) {
  switch (nr) {
    case 4:
      page_scores<4>(q, k, B, d, scale, s);
      page_update<4>(mask, s, v, B, d, m, l, acc);
      break;
    case 3:
      page_scores<3>(q, k, B, d, scale, s);
      page_update<3>(mask, s, v, B, d, m, l, acc);
      break;
    case 2:
      page_scores<2>(q, k, B, d, scale, s);
      page_update<2>(mask, s, v, B, d, m, l, acc);
      break;
    default:
      page_scores<1>(q, k, B, d, scale, s);
      page_update<1>(mask, s, v, B, d, m, l, acc);
      break;
  }
}

// The two halves of page_step, for callers that score several pages before updating with them.
template <class T>
inline void page_step_scores(int nr, const float* const* q, const T* k, int B, int d, float scale,
                             float* s) {
  switch (nr) {
    case 4:
      page_scores<4>(q, k, B, d, scale, s);
      break;
    case 3:
      page_scores<3>(q, k, B, d, scale, s);
      break;
    case 2:
      page_scores<2>(q, k, B, d, scale, s);
      break;
    default:
      page_scores<1>(q, k, B, d, scale, s);
      break;
  }
}
template <class T>
inline void page_step_update(int nr, const T* v, const PageMask& mask, int B, int d, float* s,
                             float* m, float* l, float* const* acc) {
  switch (nr) {
    case 4:
      page_update<4>(mask, s, v, B, d, m, l, acc);
      break;
    case 3:
      page_update<3>(mask, s, v, B, d, m, l, acc);
      break;
    case 2:
      page_update<2>(mask, s, v, B, d, m, l, acc);
      break;
    default:
      page_update<1>(mask, s, v, B, d, m, l, acc);
      break;
  }
}

}  // namespace cisa::cpu
