// The transformer's per-row operations (see model_ops.h for the formulas).
#include "model_ops.h"

#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

#include "cisa/model/quant.h"

namespace cisa::ops {

void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  // Squares rounded to f32, summed in double: llama.cpp's order (ggml_compute_forward_rms_norm).
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(ss / n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (w) {
    for (int i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  } else {
    for (int i = 0; i < n; ++i) y[i] = x[i] * scale;
  }
}

void rope_table(const int64_t* pos, int64_t n_pos, int n_rot, double base, float* cos_out,
                float* sin_out) {
  // llama.cpp's recurrence in f32 (ggml_rope_cache_init): θ_0 = p, θ_{i+1} = θ_i · s with
  // s = powf(base, −2/n_rot), then cosf/sinf. Each step rounds, so θ_i drifts from the exact
  // p·base^(−2i/n_rot) by up to ~2i ulps (~1e-3 rad at p = 8,000 for the fastest-turning pairs
  // that drift most); reproducing the drift keeps our rotated keys equal to llama.cpp's.
  const int half = n_rot / 2;
  const float s = std::pow(static_cast<float>(base), -2.0f / static_cast<float>(n_rot));
  for (int64_t r = 0; r < n_pos; ++r) {
    float theta = static_cast<float>(pos[r]);
    for (int i = 0; i < half; ++i) {
      cos_out[r * half + i] = std::cos(theta);
      sin_out[r * half + i] = std::sin(theta);
      theta *= s;
    }
  }
}

void rope_apply(float* x, const float* cs, const float* sn, int n_rot, RopeStyle style) {
  // The rotation is written with explicit fused multiply-adds, x_a cos − x_b sin as
  // fma(x_a, cos, −(x_b sin)) and x_a sin + x_b cos as fma(x_a, sin, x_b cos): how llama.cpp's CPU
  // build evaluates it (GCC contracts its expressions that way), so that our rotated queries and
  // keys are bit-identical to its and round to the same f16 values in the cache.
  const int half = n_rot / 2;
  const int stride = style == RopeStyle::kNeox ? 1 : 2;     // index of pair i's first element
  const int offset = style == RopeStyle::kNeox ? half : 1;  // distance to its second element
  for (int i = 0; i < half; ++i) {
    float* pa = x + i * stride;
    const float a = pa[0], b = pa[offset];
    pa[0] = std::fma(a, cs[i], -(b * sn[i]));
    pa[offset] = std::fma(a, sn[i], b * cs[i]);
  }
}

namespace {

// e^x for x in float range, written so that a loop over it vectorises: x = n·ln2 + r with
// |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7 on that interval),
// and 2^n assembled in the exponent bits. Inputs are clamped to [-87, 88] (no overflow to inf,
// results down to ~1e-38).
inline float exp_approx(float x) {
  x = std::fmin(std::fmax(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.4426950408889634f);
  const float r = std::fma(n, -0.693145751953125f, std::fma(n, -1.428606765330187e-06f, x));
  float p = 1.0f / 720.0f;
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// GELU(tanh) = 0.5 x (1 + tanh(u)) = x · σ(2u), u = √(2/π)(x + 0.044715 x³).
inline float gelu_fast(float x) {
  constexpr float k2 = 2.0f * 0.7978845608028654f;
  const float u2 = k2 * (x + 0.044715f * x * x * x);
  return x / (1.0f + exp_approx(-u2));
}

// e^x as llama.cpp's AVX-512 ggml_v_expf computes it: n = round(x / ln2) by the 1.5·2^23 trick,
// b = x − n·ln2 in two parts, e^b ≈ 1 + b·P(b) (a degree-5 minimax polynomial), times 2^n. Its
// error is ~1.5 ulp; the point is to round exactly as llama.cpp does, operation for operation.
// Written without branches so that loops over it vectorise: for x > ~88.7 it returns +inf as
// llama.cpp does; below 2^-126 (x < ~-87.3) it returns j·2^-126 instead of llama.cpp's
// subnormal or 0, a difference no caller sees (they use it only as 1 + e^x, which is then 1).
inline float exp_ggml(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  // 2^n for n clamped to the normal range: multiplying by it rounds once, as vscalefps does.
  const int32_t bits = (static_cast<int32_t>(std::fmin(std::fmax(n, -126.0f), 127.0f)) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return n > 127.0f ? INFINITY : j * scale;
}

// llama.cpp's SiLU (ggml_v_silu): x / (1 + e^(−x)) with the exp above.
inline float silu_ggml(float x) {
  return x / (1.0f + exp_ggml(-x));
}

// llama.cpp evaluates GELU through a table of all 65,536 half-precision inputs: x is rounded to
// f16, looked up, and the f16 result widened (|x| ≥ 10 bypasses the table: 0 or x). The table
// holds f16(0.5 x (1 + tanhf(√(2/π) x (1 + 0.044715 x²)))), the expression llama.cpp tabulates.
struct GeluTable {
  uint16_t v[65536];
  GeluTable() {
    for (uint32_t h = 0; h < 65536; ++h) {
      const float x = f16_to_f32(static_cast<uint16_t>(h));
      v[h] = f32_to_f16(
          0.5f * x *
          (1.0f + std::tanh(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x))));
    }
  }
};

// The table is immutable and built once, on first use (thread-safe static initialisation).
const GeluTable& gelu_table() {
  static const GeluTable t;
  return t;
}

}  // namespace

float gelu_tanh(float x) {
  return gelu_fast(x);
}

float gelu_tanh_f16(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return f16_to_f32(gelu_table().v[f32_to_f16(x)]);
}

float silu(float x) {
  return silu_ggml(x);
}

void gated_activation(Activation act, const float* gate, const float* up, float* out, int64_t n) {
  if (act != Activation::kGeluTanh) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    // exp_ggml and silu_ggml eight at a time: the same IEEE operations lane by lane, so the same
    // results (GCC does not vectorise the scalar loop).
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(gate + i);
      const __m256 e = _mm256_sub_ps(_mm256_setzero_ps(), x);  // the exponent, -x
      const __m256 r = _mm256_set1_ps(0x1.8p23f);
      const __m256 nn = _mm256_sub_ps(_mm256_fmadd_ps(e, _mm256_set1_ps(0x1.715476p+0f), r), r);
      const __m256 b = _mm256_fnmadd_ps(nn, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                        _mm256_fnmadd_ps(nn, _mm256_set1_ps(0x1.62e4p-1f), e));
      const __m256 u = _mm256_mul_ps(b, b);
      const __m256 j = _mm256_fmadd_ps(
          _mm256_fmadd_ps(
              _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
              _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
          u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
      const __m256 nc =
          _mm256_min_ps(_mm256_max_ps(nn, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
      const __m256i bits =
          _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(nc), _mm256_set1_epi32(127)), 23);
      __m256 ex = _mm256_mul_ps(j, _mm256_castsi256_ps(bits));
      ex = _mm256_blendv_ps(ex, _mm256_set1_ps(INFINITY),
                            _mm256_cmp_ps(nn, _mm256_set1_ps(127.0f), _CMP_GT_OQ));
      const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), ex));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; ++i) out[i] = silu_ggml(gate[i]) * up[i];
    return;
  }
  const GeluTable& t = gelu_table();
  int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  // Eight at a time: hardware f32 -> f16 conversion (round to nearest even, like f32_to_f16),
  // eight table lookups, f16 -> f32, then the |x| >= 10 cases blended in.
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    alignas(16) uint16_t h[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(h),
                    _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (int k = 0; k < 8; ++k) h[k] = t.v[h[k]];
    __m256 g = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
    g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
    g = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ), g);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    const float x = gate[i];
    const float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : f16_to_f32(t.v[f32_to_f16(x)]);
    out[i] = g * up[i];
  }
}

void round_to_f16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace cisa::ops
