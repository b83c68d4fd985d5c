// The fitted index query (src/calib/index_fit.h): the mix family holds each head and the mean, it
// commutes with RoPE in both layouts (checked against an fp64 rotation written here), the weighted
// least squares recovers a mix that generated the target exactly, and the ridge pulls toward the
// mean.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "calib/index_fit.h"

namespace cisa::calib {
namespace {

std::vector<float> random_vec(std::mt19937_64& g, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(g);
  return v;
}

// RoPE at position t in fp64, written out for both layouts: pair i turns by t·base^(−2i/d).
std::vector<double> rope(const std::vector<double>& x, int64_t t, RopeStyle style) {
  const int d = static_cast<int>(x.size());
  std::vector<double> y = x;
  for (int i = 0; i < d / 2; ++i) {
    const double a = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / d);
    const int c1 = style == RopeStyle::kNorm ? 2 * i : i;
    const int c2 = style == RopeStyle::kNorm ? 2 * i + 1 : i + d / 2;
    y[static_cast<size_t>(c1)] =
        x[static_cast<size_t>(c1)] * std::cos(a) - x[static_cast<size_t>(c2)] * std::sin(a);
    y[static_cast<size_t>(c2)] =
        x[static_cast<size_t>(c1)] * std::sin(a) + x[static_cast<size_t>(c2)] * std::cos(a);
  }
  return y;
}

std::vector<double> matvec(const std::vector<float>& w, const std::vector<float>& x, int d) {
  const size_t E = x.size();
  std::vector<double> y(static_cast<size_t>(d), 0.0);
  for (size_t r = 0; r < static_cast<size_t>(d); ++r)
    for (size_t e = 0; e < E; ++e) y[r] += static_cast<double>(w[r * E + e]) * x[e];
  return y;
}

TEST(CalibIndexFit, MixHoldsEachHeadAndTheMean) {
  std::mt19937_64 g(1);
  const int heads = 3, d = 8;
  const std::vector<float> q = random_vec(g, heads * d);
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    std::vector<float> out(d);
    apply_mix(mean_mix(heads, d), q.data(), heads, d, style, out.data());
    for (int i = 0; i < d; ++i)
      EXPECT_NEAR(out[size_t(i)], (q[size_t(i)] + q[size_t(d + i)] + q[size_t(2 * d + i)]) / 3,
                  1e-6);
    for (int h = 0; h < heads; ++h) {
      std::vector<float> one(size_t(heads * d), 0.0f);
      for (int i = 0; i < d / 2; ++i) one[size_t((h * d / 2 + i) * 2)] = 1.0f;
      apply_mix(one, q.data(), heads, d, style, out.data());
      for (int i = 0; i < d; ++i) EXPECT_EQ(out[size_t(i)], q[size_t(h * d + i)]);
    }
  }
}

TEST(CalibIndexFit, TheMixedProjectionCommutesWithRope) {
  std::mt19937_64 g(2);
  const int heads = 4, d = 16, E = 24;
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    std::vector<std::vector<float>> w;
    for (int h = 0; h < heads; ++h) w.push_back(random_vec(g, size_t(d) * E));
    const std::vector<float> mix = random_vec(g, size_t(heads) * d), x = random_vec(g, E);
    const std::vector<float> wmix = mix_projection(mix, w, d, E, style);
    for (int64_t t : {0, 1, 37, 5000}) {
      // The engine's path: project with W̃, then rotate.
      const std::vector<double> want = rope(matvec(wmix, x, d), t, style);
      // Calibration's path: rotate each head's query, then mix.
      std::vector<float> q;
      for (int h = 0; h < heads; ++h)
        for (double v : rope(matvec(w[size_t(h)], x, d), t, style)) q.push_back(float(v));
      std::vector<float> got(d);
      apply_mix(mix, q.data(), heads, d, style, got.data());
      for (int i = 0; i < d; ++i) EXPECT_NEAR(got[size_t(i)], want[size_t(i)], 2e-4) << t;
    }
  }
}

TEST(CalibIndexFit, LeastSquaresRecoversAGeneratingMix) {
  // Dense mass p_j ∝ exp(z_j) with z from a known mix and scores small enough that no chunk falls
  // under the target's floor: the target is then exactly z up to a constant, so the unregularised
  // fit must return the generating coefficients.
  std::mt19937_64 g(3);
  const int heads = 2, d = 8, n = 40;
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    const std::vector<float> truth = random_vec(g, size_t(heads) * d, 0.5f);
    MixFit fit(heads, d, style);
    for (int pos = 0; pos < 30; ++pos) {
      const std::vector<float> q = random_vec(g, size_t(heads) * d),
                               reps = random_vec(g, size_t(n) * d, 0.3f);
      std::vector<float> iq(d);
      apply_mix(truth, q.data(), heads, d, style, iq.data());
      std::vector<double> mass(n);
      for (int j = 0; j < n; ++j) {
        double z = 0;
        for (int i = 0; i < d; ++i) z += double(iq[size_t(i)]) * reps[size_t(j * d + i)];
        mass[size_t(j)] = std::exp(z / std::sqrt(double(d)));
      }
      double total = 0;
      for (double m : mass) total += m;
      for (double m : mass) ASSERT_GT(m / total, 0.01 / n);  // above the target's floor
      ASSERT_TRUE(fit.add(mass, reps, q.data()).ok());
    }
    auto got = fit.solve(0.0);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    for (size_t i = 0; i < truth.size(); ++i) EXPECT_NEAR((*got)[i], truth[i], 2e-4) << i;
    // A huge ridge returns the mean.
    auto mean = fit.solve(1e9);
    ASSERT_TRUE(mean.ok());
    const std::vector<float> want = mean_mix(heads, d);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*mean)[i], want[i], 1e-6);
  }
}

TEST(CalibIndexFit, RejectsBadInputs) {
  MixFit fit(2, 4, RopeStyle::kNorm);
  EXPECT_EQ(fit.solve(0.1).status().code(), StatusCode::kFailedPrecondition);
  const std::vector<float> q(8, 1.0f), reps(12, 1.0f);
  EXPECT_FALSE(fit.add(std::vector<double>{1, 2}, reps, q.data()).ok());     // 3 chunks of reps
  EXPECT_FALSE(fit.add(std::vector<double>{0, 0, 0}, reps, q.data()).ok());  // no mass
  EXPECT_FALSE(fit.add(std::vector<double>{1, NAN, 1}, reps, q.data()).ok());
  EXPECT_EQ(fit.positions(), 0);
}

}  // namespace
}  // namespace cisa::calib
