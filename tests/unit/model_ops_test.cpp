// The model's per-row operations against fp64 computations written out here from the formulas
// (Zhang & Sennrich's RMSNorm, Su et al.'s RoPE in its two pairings, GELU's tanh form).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/model_ops.h"

namespace cisa {
namespace {

std::vector<float> randn(std::mt19937& rng, int n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(ModelOps, RmsNormMatchesFp64) {
  std::mt19937 rng(1);
  for (int n : {8, 64, 640, 2048}) {
    for (float scale : {1e-3f, 1.0f, 300.0f}) {
      const auto x = randn(rng, n, scale), w = randn(rng, n, 1.0f);
      std::vector<float> y(static_cast<size_t>(n));
      const float eps = 1e-6f;
      ops::rms_norm(x.data(), w.data(), y.data(), n, eps);
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double inv = 1.0 / std::sqrt(ss / n + eps);
      for (int i = 0; i < n; ++i) {
        const double want = double(x[i]) * inv * w[i];
        EXPECT_NEAR(y[i], want, 2e-6 * std::abs(want) + 1e-30) << "n=" << n << " i=" << i;
      }
      // In place, no gain.
      std::vector<float> z = x;
      ops::rms_norm(z.data(), nullptr, z.data(), n, eps);
      for (int i = 0; i < n; ++i)
        EXPECT_NEAR(z[i], double(x[i]) * inv, 2e-6 * std::abs(double(x[i]) * inv));
    }
  }
}

// Rotating by the position-p angles must equal the 2x2 rotations written out in fp64; NEOX and
// NORM differ only in which dimensions pair up. The table forms the angles by llama.cpp's f32
// recurrence θ_{i+1} = θ_i · s, so angle i carries up to ~(2i + 2) roundings of 2^-24 relative
// (s itself from powf, then one product per step): the fp64 comparison allows exactly that drift.
TEST(ModelOps, RopeMatchesFp64RotationWithinTheF32AngleDrift) {
  std::mt19937 rng(2);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kNorm}) {
    for (int d : {64, 256}) {
      for (double base : {10000.0, 1000000.0}) {
        for (int64_t p : {0LL, 1LL, 17LL, 4095LL, 32767LL}) {
          const auto x = randn(rng, d, 1.0f);
          std::vector<float> cs(static_cast<size_t>(d / 2)), sn(static_cast<size_t>(d / 2));
          ops::rope_table(&p, 1, d, base, cs.data(), sn.data());
          std::vector<float> y = x;
          ops::rope_apply(y.data(), cs.data(), sn.data(), d, style);
          for (int i = 0; i < d / 2; ++i) {
            const double theta = double(p) * std::pow(base, -2.0 * i / d);
            const double drift = theta * (2 * i + 2) * 0x1p-24 + 1e-7;  // + cosf/sinf rounding
            const int a = style == RopeStyle::kNeox ? i : 2 * i;
            const int b = style == RopeStyle::kNeox ? i + d / 2 : 2 * i + 1;
            const double ya = x[a] * std::cos(theta) - x[b] * std::sin(theta);
            const double yb = x[a] * std::sin(theta) + x[b] * std::cos(theta);
            const double tol = (std::abs(x[a]) + std::abs(x[b])) * drift + 1e-6;
            EXPECT_NEAR(y[a], ya, tol) << "p=" << p << " i=" << i;
            EXPECT_NEAR(y[b], yb, tol) << "p=" << p << " i=" << i;
            // Small positions are exact to float rounding.
            if (p <= 17) {
              EXPECT_NEAR(y[a], ya, 1e-5) << "p=" << p << " i=" << i;
            }
          }
        }
      }
    }
  }
}

// The rotation itself, given the table: fp64 rotation by the table's own cos/sin, to ~1 ulp.
TEST(ModelOps, RopeApplyIsTheRotationByTheTable) {
  std::mt19937 rng(5);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kNorm}) {
    const int d = 128;
    int64_t p = 12345;
    const auto x = randn(rng, d, 3.0f);
    std::vector<float> cs(d / 2), sn(d / 2), y = x;
    ops::rope_table(&p, 1, d, 10000.0, cs.data(), sn.data());
    ops::rope_apply(y.data(), cs.data(), sn.data(), d, style);
    for (int i = 0; i < d / 2; ++i) {
      const int a = style == RopeStyle::kNeox ? i : 2 * i;
      const int b = style == RopeStyle::kNeox ? i + d / 2 : 2 * i + 1;
      const double ya = double(x[a]) * cs[i] - double(x[b]) * sn[i];
      const double yb = double(x[a]) * sn[i] + double(x[b]) * cs[i];
      const double mag = std::abs(x[a]) + std::abs(x[b]);
      EXPECT_NEAR(y[a], ya, 2.5e-7 * mag) << i;
      EXPECT_NEAR(y[b], yb, 2.5e-7 * mag) << i;
    }
  }
}

// q·k after RoPE depends only on the distance between the two positions.
TEST(ModelOps, RopeDotProductDependsOnlyOnDistance) {
  std::mt19937 rng(3);
  const int d = 128;
  const auto q = randn(rng, d, 1.0f), k = randn(rng, d, 1.0f);
  auto rotated_dot = [&](int64_t pq, int64_t pk) {
    std::vector<float> a = q, b = k, c1(d / 2), s1(d / 2), c2(d / 2), s2(d / 2);
    ops::rope_table(&pq, 1, d, 10000.0, c1.data(), s1.data());
    ops::rope_table(&pk, 1, d, 10000.0, c2.data(), s2.data());
    ops::rope_apply(a.data(), c1.data(), s1.data(), d, RopeStyle::kNeox);
    ops::rope_apply(b.data(), c2.data(), s2.data(), d, RopeStyle::kNeox);
    double s = 0;
    for (int i = 0; i < d; ++i) s += double(a[i]) * b[i];
    return s;
  };
  EXPECT_NEAR(rotated_dot(10, 3), rotated_dot(1010, 1003), 1e-3);
  EXPECT_NEAR(rotated_dot(7, 7), rotated_dot(20000, 20000), 1e-3);
}

// The vectorised gated SiLU is the scalar one lane by lane (same operations, same rounding), over
// a sweep through both tails (exp overflow to inf, results below 2^-126).
TEST(ModelOps, GatedSiluEqualsScalarSiluBitForBit) {
  std::vector<float> g, u;
  for (float x = -120.0f; x <= 120.0f; x += 0.00731f) g.push_back(x);
  g.push_back(0.0f), g.push_back(-0.0f), g.push_back(88.7f), g.push_back(-88.8f);
  while (g.size() % 8) g.push_back(1.0f);
  u.assign(g.size(), 1.0f);
  std::vector<float> y(g.size());
  ops::gated_activation(Activation::kSilu, g.data(), u.data(), y.data(),
                        static_cast<int64_t>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const float want = ops::silu(g[i]);
    EXPECT_TRUE(want == y[i] || (std::isnan(want) && std::isnan(y[i]))) << "x=" << g[i];
  }
}

// GELU as llama.cpp evaluates it: the input rounded to f16, GELU(tanh) of that in f32, the result
// rounded to f16 (its lookup table), 0 below -10 and the identity above 10. The f16 roundings are
// done here with the compiler's _Float16 (independent of our f32_to_f16). Against fp64 GELU the
// table may differ by one f16 step of the result (2^-10 relative, or 2^-24 absolute for f16
// subnormals) when the f32 evaluation lands across a rounding boundary, plus the f32 error of
// 1 + tanh(u), which cancels for negative x: ~|x| 2^-23. Away
// from that cancellation (x > -1) at most a few results sit close enough to an f16 rounding
// boundary to round the other way. SiLU: fp64 to ~1e-6 relative.
TEST(ModelOps, GatedActivationsMatchFp64) {
  std::mt19937 rng(4);
  const int n = 4096;
  auto g = randn(rng, n, 3.0f);
  const auto u = randn(rng, n, 1.0f);
  g[0] = -10.0f, g[1] = -10.5f, g[2] = 10.0f, g[3] = 12.25f, g[4] = 9.99f, g[5] = 0.0f;
  std::vector<float> y(static_cast<size_t>(n));
  ops::gated_activation(Activation::kGeluTanh, g.data(), u.data(), y.data(), n);
  auto gelu64 = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  int exact = 0, near_zero = 0;
  for (int i = 0; i < n; ++i) {
    const float x = g[i];
    double want;
    if (x <= -10.0f) {
      want = 0.0;
    } else if (x >= 10.0f) {
      want = x;
    } else {
      const double xh = static_cast<float>(static_cast<_Float16>(x));
      want = static_cast<float>(static_cast<_Float16>(gelu64(xh)));
    }
    const float got = ops::gelu_tanh_f16(x);
    EXPECT_NEAR(got, want, 0x1p-10 * std::abs(want) + 0x1p-22 * std::abs(x) + 0x1p-24) << "x=" << x;
    if (x > -1.0f) {
      ++near_zero;
      exact += got == static_cast<float>(want);
    }
    EXPECT_EQ(got * u[i], y[i]) << "gelu_tanh_f16 and gated_activation disagree at " << x;
  }
  EXPECT_GE(exact, near_zero * 99 / 100);
  ops::gated_activation(Activation::kSilu, g.data(), u.data(), y.data(), n);
  for (int i = 0; i < n; ++i) {
    const double x = g[i];
    const double silu = x / (1.0 + std::exp(-x));
    EXPECT_NEAR(y[i], silu * u[i], 1e-6 * (1 + std::abs(silu * u[i])));
  }
  // A sweep far into both tails: finite, and within 2e-5 relative of fp64 (the float argument of
  // exp carries ~1 ulp, i.e. |arg|·6e-8 relative error in the result, up to ~88·6e-8 in the tails).
  // (0.5 (1 + tanh u) = 1 / (1 + e^(−2u)) exactly; the second form keeps fp64 accurate where
  // tanh u rounds to −1.)
  for (double x = -120.0; x <= 120.0; x += 0.0371) {
    const double gelu =
        x / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    const double silu = x / (1.0 + std::exp(-x));
    const float gx = ops::gelu_tanh(static_cast<float>(x)), sx = ops::silu(static_cast<float>(x));
    ASSERT_TRUE(std::isfinite(gx) && std::isfinite(sx)) << x;
    EXPECT_NEAR(gx, gelu, 2e-5 * std::abs(gelu) + 1e-20) << x;
    EXPECT_NEAR(sx, silu, 2e-5 * std::abs(silu) + 1e-20) << x;
  }
  // Known values: GELU(0) = 0, GELU(x) → x for large x, SiLU(0) = 0.
  EXPECT_EQ(ops::gelu_tanh(0.0f), 0.0f);
  EXPECT_NEAR(ops::gelu_tanh(8.0f), 8.0f, 1e-6);
  EXPECT_NEAR(ops::gelu_tanh(1.0f), 0.8411919906082768, 1e-6);  // 0.5(1 + tanh(√(2/π)·1.044715))
  EXPECT_EQ(ops::silu(0.0f), 0.0f);
}

}  // namespace
}  // namespace cisa
