// The transformer's per-row operations (see model_ops.h for the formulas).
#include "model_ops.h"

#include <cmath>
#include <cstring>

#include "cisa/quant.h"

namespace cisa::ops {

void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
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
  const int half = n_rot / 2;
  // inv_freq_i = base^(−2i/n_rot); the angle p·inv_freq_i is formed in double so that positions
  // in the tens of thousands keep their low-order bits.
  double inv_freq[512];
  for (int i = 0; i < half && i < 512; ++i) inv_freq[i] = std::pow(base, -2.0 * i / n_rot);
  for (int64_t r = 0; r < n_pos; ++r) {
    const double p = static_cast<double>(pos[r]);
    for (int i = 0; i < half; ++i) {
      const double a = p * inv_freq[i];
      cos_out[r * half + i] = static_cast<float>(std::cos(a));
      sin_out[r * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

void rope_apply(float* x, const float* cs, const float* sn, int n_rot, RopeStyle style) {
  const int half = n_rot / 2;
  if (style == RopeStyle::kNeox) {
    for (int i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cs[i] - b * sn[i];
      x[i + half] = a * sn[i] + b * cs[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * cs[i] - b * sn[i];
      x[2 * i + 1] = a * sn[i] + b * cs[i];
    }
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

inline float silu_fast(float x) { return x / (1.0f + exp_approx(-x)); }

}  // namespace

float gelu_tanh(float x) { return gelu_fast(x); }

float silu(float x) { return silu_fast(x); }

void gated_activation(Activation act, const float* gate, const float* up, float* out, int64_t n) {
  if (act == Activation::kGeluTanh) {
    for (int64_t i = 0; i < n; ++i) out[i] = gelu_fast(gate[i]) * up[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = silu_fast(gate[i]) * up[i];
  }
}

void round_to_f16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace cisa::ops
