// The fitted index query (index_fit.h): scaled rotations of the group's heads, fitted by weighted
// least squares on the normal equations, solved by Cholesky.
#include "index_fit.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace cisa::calib {

std::vector<std::array<int, 2>> rope_pairs(int d, RopeStyle style) {
  std::vector<std::array<int, 2>> p(static_cast<size_t>(d / 2));
  for (int i = 0; i < d / 2; ++i)
    p[static_cast<size_t>(i)] = style == RopeStyle::kNorm ? std::array<int, 2>{2 * i, 2 * i + 1}
                                                          : std::array<int, 2>{i, i + d / 2};
  return p;
}

std::vector<float> mean_mix(int heads, int d) {
  std::vector<float> m(static_cast<size_t>(heads) * static_cast<size_t>(d), 0.0f);
  for (size_t i = 0; i < m.size(); i += 2) m[i] = 1.0f / static_cast<float>(heads);
  return m;
}

void apply_mix(std::span<const float> mix, const float* q_heads, int heads, int d, RopeStyle style,
               float* out) {
  const auto pairs = rope_pairs(d, style);
  std::fill(out, out + d, 0.0f);
  for (int h = 0; h < heads; ++h) {
    const float* q = q_heads + static_cast<size_t>(h) * static_cast<size_t>(d);
    for (size_t i = 0; i < pairs.size(); ++i) {
      const size_t at = (static_cast<size_t>(h) * pairs.size() + i) * 2;
      const float a = mix[at], b = mix[at + 1];
      const auto [c1, c2] = pairs[i];
      out[c1] += a * q[c1] - b * q[c2];
      out[c2] += b * q[c1] + a * q[c2];
    }
  }
}

std::vector<float> mix_projection(std::span<const float> mix,
                                  std::span<const std::vector<float>> head_rows, int d,
                                  int64_t n_embd, RopeStyle style) {
  const auto pairs = rope_pairs(d, style);
  const size_t E = static_cast<size_t>(n_embd);
  std::vector<float> w(static_cast<size_t>(d) * E, 0.0f);
  for (size_t h = 0; h < head_rows.size(); ++h) {
    const std::vector<float>& W = head_rows[h];
    for (size_t i = 0; i < pairs.size(); ++i) {
      const size_t at = (h * pairs.size() + i) * 2;
      const float a = mix[at], b = mix[at + 1];
      const size_t c1 = static_cast<size_t>(pairs[i][0]), c2 = static_cast<size_t>(pairs[i][1]);
      for (size_t e = 0; e < E; ++e) {
        w[c1 * E + e] += a * W[c1 * E + e] - b * W[c2 * E + e];
        w[c2 * E + e] += b * W[c1 * E + e] + a * W[c2 * E + e];
      }
    }
  }
  return w;
}

MixFit::MixFit(int heads, int d, RopeStyle style)
    : heads_(heads), d_(d), pairs_(rope_pairs(d, style)) {
  const size_t P = static_cast<size_t>(heads) * static_cast<size_t>(d);
  m_.assign(P * P, 0.0);
  b_.assign(P, 0.0);
}

Status MixFit::add(std::span<const double> mass, std::span<const float> reps,
                   const float* q_heads) {
  const size_t n = mass.size(), d = static_cast<size_t>(d_);
  if (n == 0 || reps.size() != n * d)
    return invalid_argument("MixFit: " + std::to_string(reps.size()) +
                            " representative values for " + std::to_string(n) +
                            " chunks of dimension " + std::to_string(d_));
  const double total = std::accumulate(mass.begin(), mass.end(), 0.0);
  if (!(total > 0) || !std::isfinite(total))
    return invalid_argument("MixFit: chunk mass must be positive and finite");
  for (double m : mass)
    if (!(m >= 0)) return invalid_argument("MixFit: negative or NaN chunk mass");
  const size_t P = static_cast<size_t>(heads_) * d, half = pairs_.size();
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d_)), floor = 0.01 / double(n);
  // Features φ_j (scaled by 1/√d), targets and weights; then centred by their weighted means, which
  // removes the free constant per position.
  std::vector<double> phi(n * P), y(n), w(n);
  for (size_t j = 0; j < n; ++j) {
    const double p = mass[j] / total;
    y[j] = std::log(std::max(p, floor));
    w[j] = 1.0 / double(n) + p;
    const float* r = reps.data() + j * d;
    double* f = phi.data() + j * P;
    for (int h = 0; h < heads_; ++h) {
      const float* q = q_heads + static_cast<size_t>(h) * d;
      for (size_t i = 0; i < half; ++i) {
        const auto [c1, c2] = pairs_[i];
        const double q1 = q[c1], q2 = q[c2], r1 = r[c1], r2 = r[c2];
        f[(static_cast<size_t>(h) * half + i) * 2] = (q1 * r1 + q2 * r2) * inv_sqrt_d;
        f[(static_cast<size_t>(h) * half + i) * 2 + 1] = (q1 * r2 - q2 * r1) * inv_sqrt_d;
      }
    }
  }
  const double wsum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<double> mean(P, 0.0);
  double ymean = 0;
  for (size_t j = 0; j < n; ++j) {
    ymean += w[j] * y[j];
    for (size_t a = 0; a < P; ++a) mean[a] += w[j] * phi[j * P + a];
  }
  ymean /= wsum;
  for (double& v : mean) v /= wsum;
  for (size_t j = 0; j < n; ++j) {
    double* f = phi.data() + j * P;
    for (size_t a = 0; a < P; ++a) f[a] -= mean[a];
    const double wy = w[j] * (y[j] - ymean);
    for (size_t a = 0; a < P; ++a) {
      const double wf = w[j] * f[a];
      b_[a] += f[a] * wy;
      double* row = m_.data() + a * P;
      for (size_t c = a; c < P; ++c) row[c] += wf * f[c];
    }
  }
  positions_ += 1;
  return Status::Ok();
}

void MixFit::merge(const MixFit& o) {
  for (size_t i = 0; i < m_.size(); ++i) m_[i] += o.m_[i];
  for (size_t i = 0; i < b_.size(); ++i) b_[i] += o.b_[i];
  positions_ += o.positions_;
}

Result<std::vector<float>> MixFit::solve(double ridge) const {
  if (positions_ == 0) return failed_precondition("MixFit: no positions to fit");
  const size_t P = b_.size();
  std::vector<double> a(P * P);
  double trace = 0;
  for (size_t i = 0; i < P; ++i) trace += m_[i * P + i];
  const double lambda = std::max(ridge, 0.0) * trace / double(P);
  const std::vector<float> mean = mean_mix(heads_, d_);
  std::vector<double> x(P);
  for (size_t i = 0; i < P; ++i) {
    for (size_t j = i; j < P; ++j) a[i * P + j] = a[j * P + i] = m_[i * P + j];
    a[i * P + i] += lambda;
    x[i] = b_[i] + lambda * mean[i];
  }
  // Cholesky: A = L Lᵀ, L in the lower triangle of a.
  for (size_t j = 0; j < P; ++j) {
    double s = a[j * P + j];
    for (size_t k = 0; k < j; ++k) s -= a[j * P + k] * a[j * P + k];
    if (!(s > 0))
      return internal_error(
          "MixFit: the normal equations are singular (some query or key dimensions carry nothing): "
          "fit with a ridge above 0");
    const double l = std::sqrt(s);
    a[j * P + j] = l;
    for (size_t i = j + 1; i < P; ++i) {
      double t = a[i * P + j];
      for (size_t k = 0; k < j; ++k) t -= a[i * P + k] * a[j * P + k];
      a[i * P + j] = t / l;
    }
  }
  for (size_t i = 0; i < P; ++i) {
    double t = x[i];
    for (size_t k = 0; k < i; ++k) t -= a[i * P + k] * x[k];
    x[i] = t / a[i * P + i];
  }
  for (size_t i = P; i-- > 0;) {
    double t = x[i];
    for (size_t k = i + 1; k < P; ++k) t -= a[k * P + i] * x[k];
    x[i] = t / a[i * P + i];
  }
  std::vector<float> out(P);
  for (size_t i = 0; i < P; ++i) out[i] = static_cast<float>(x[i]);
  return out;
}

}  // namespace cisa::calib
