// Calibration math of SPEC §6 against brute force in long double, and the winner on synthetic
// attention where one candidate is built to produce the dense attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "cisa/model/indexer.h"

namespace cisa {
namespace {

// Brute-force reference: π from exp/normalise in long double, KL term by term, top-k by a full
// sort of (score, index) pairs.
struct Reference {
  long double kl = 0, captured = 0, oracle = 0;
};

Reference brute_force(const std::vector<double>& mass, const std::vector<float>& reps,
                      const float* q, int d, int64_t k) {
  const size_t n = mass.size();
  long double total = 0;
  for (double m : mass) total += m;
  std::vector<long double> s(n), pi(n);
  long double z = 0;
  for (size_t j = 0; j < n; ++j) {
    long double dot = 0;
    for (int i = 0; i < d; ++i)
      dot += static_cast<long double>(q[i]) * reps[j * size_t(d) + size_t(i)];
    s[j] = dot / std::sqrt(static_cast<long double>(d));
  }
  for (size_t j = 0; j < n; ++j) z += std::exp(s[j]);
  Reference r;
  for (size_t j = 0; j < n; ++j) {
    pi[j] = std::exp(s[j]) / z;
    const long double p = mass[j] / total;
    if (p > 0) r.kl += p * std::log(p / pi[j]);
  }
  auto topk_mass = [&](const std::vector<long double>& key) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(),
              [&](size_t a, size_t b) { return key[a] != key[b] ? key[a] > key[b] : a < b; });
    long double got = 0;
    for (size_t i = 0; i < std::min<size_t>(n, static_cast<size_t>(k)); ++i) got += mass[idx[i]];
    return got / total;
  };
  r.captured = topk_mass(s);
  std::vector<long double> m(mass.begin(), mass.end());
  r.oracle = topk_mass(m);
  return r;
}

TEST(CalibMath, ScoresMatchBruteForce) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 40; ++trial) {
    const int d = 8 * (1 + static_cast<int>(rng() % 4));
    const int n = 3 + static_cast<int>(rng() % 200);
    const int C = 1 + static_cast<int>(rng() % 5);
    const int64_t k = 1 + static_cast<int64_t>(rng() % 40);
    std::vector<double> mass(static_cast<size_t>(n));
    for (auto& m : mass)
      m = trial % 3 == 0 ? std::floor(u(rng) * 4) : std::exp(3 * u(rng));  // zeros and ties
    mass[0] += 0.5;
    std::vector<float> reps(size_t(n) * size_t(d)), q(size_t(C) * size_t(d));
    for (auto& x : reps) x = nd(rng);
    for (auto& x : q) x = 2.0f * nd(rng);
    auto got = score_position(mass, reps, q, d, k);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    for (int c = 0; c < C; ++c) {
      const Reference ref = brute_force(mass, reps, q.data() + size_t(c) * size_t(d), d, k);
      EXPECT_NEAR(got->kl[size_t(c)], static_cast<double>(ref.kl),
                  1e-10 * (1 + static_cast<double>(ref.kl)));
      EXPECT_NEAR(got->captured[size_t(c)], static_cast<double>(ref.captured), 1e-12);
      EXPECT_NEAR(got->oracle, static_cast<double>(ref.oracle), 1e-12);
      EXPECT_LE(got->captured[size_t(c)], got->oracle + 1e-12);
    }
  }
}

TEST(CalibMath, KlStaysFiniteWhenSoftmaxUnderflows) {
  // Scores 2000 apart: exp underflows in double, log π does not.
  const int d = 1;
  std::vector<double> mass = {0.5, 0.5};
  std::vector<float> reps = {1.0f, -1.0f};
  std::vector<float> q = {1000.0f};
  auto got = score_position(mass, reps, q, d, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(std::isfinite(got->kl[0]));
  EXPECT_NEAR(got->kl[0], 0.5 * std::log(0.5) + 0.5 * (std::log(0.5) + 2000.0), 1e-6);
  EXPECT_DOUBLE_EQ(got->captured[0], 0.5);
}

TEST(CalibMath, RejectsBadInputs) {
  std::vector<double> mass = {1, 2};
  std::vector<float> reps(8), q(4);
  EXPECT_TRUE(score_position(mass, reps, q, 4, 1).ok());
  EXPECT_FALSE(score_position(mass, std::vector<float>(7), q, 4, 1).ok());
  EXPECT_FALSE(score_position(mass, reps, std::vector<float>(5), 4, 1).ok());
  EXPECT_FALSE(score_position(mass, reps, q, 4, 0).ok());
  EXPECT_FALSE(score_position(std::vector<double>{0, 0}, reps, q, 4, 1).ok());
  EXPECT_FALSE(score_position(std::vector<double>{1, NAN}, reps, q, 4, 1).ok());
  EXPECT_FALSE(score_position(std::vector<double>{}, {}, q, 4, 1).ok());
}

// A group of 3 query heads over chunks whose keys scatter around their representative. The dense
// attention is that of a hidden query q*; candidate 2 is q*, the others are unrelated queries and
// their mean. Both criteria must pick candidate 2, and its KL must be the smallest by a margin.
TEST(CalibMath, PicksTheCandidateThatMatchesDenseAttention) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  const int d = 32, B = 16, n_chunks = 300;
  const int64_t k = 16;
  GroupAccumulator kl_acc(5, 1, {3, 4, 5, -1}), mass_acc(5, 1, {3, 4, 5, -1});
  for (int pos = 0; pos < 20; ++pos) {
    std::vector<float> keys(size_t(n_chunks) * B * d), reps(size_t(n_chunks) * d, 0.0f);
    for (int j = 0; j < n_chunks; ++j) {
      std::vector<float> centre(static_cast<size_t>(d));
      for (auto& x : centre) x = 1.5f * nd(rng);
      for (int s = 0; s < B; ++s)
        for (int i = 0; i < d; ++i) {
          const float v = centre[size_t(i)] + 0.3f * nd(rng);
          keys[(size_t(j) * B + size_t(s)) * d + size_t(i)] = v;
          reps[size_t(j) * d + size_t(i)] += v / static_cast<float>(B);
        }
    }
    std::vector<float> q(4 * size_t(d));
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < d; ++i) q[size_t(c) * d + size_t(i)] = 1.5f * nd(rng);
    const float* qstar = q.data() + 2 * d;
    // Dense attention of q* over every token (one head standing for the group), chunk masses.
    std::vector<double> logits(size_t(n_chunks) * B), mass(size_t(n_chunks), 0.0);
    double mx = -1e300, z = 0;
    for (size_t t = 0; t < logits.size(); ++t) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(qstar[i]) * keys[t * d + size_t(i)];
      logits[t] = dot / std::sqrt(double(d));
      mx = std::max(mx, logits[t]);
    }
    for (double l : logits) z += std::exp(l - mx);
    for (size_t t = 0; t < logits.size(); ++t) mass[t / B] += std::exp(logits[t] - mx) / z;
    for (int i = 0; i < d; ++i)
      q[3 * size_t(d) + size_t(i)] = (q[size_t(i)] + q[size_t(d + i)] + q[size_t(2 * d + i)]) / 3;
    auto s = score_position(mass, reps, q, d, k);
    ASSERT_TRUE(s.ok());
    kl_acc.add(*s);
    mass_acc.add(*s);
  }
  const GroupCalibration by_kl = kl_acc.result(CalibCriterion::kKl);
  const GroupCalibration by_mass = mass_acc.result(CalibCriterion::kMass);
  EXPECT_EQ(by_kl.positions, 20);
  EXPECT_EQ(by_kl.chosen, 2);
  EXPECT_EQ(by_mass.chosen, 2);
  EXPECT_EQ(by_kl.candidates[2].head, 5);
  EXPECT_EQ(by_kl.candidates[3].head, -1);
  for (int c : {0, 1, 3}) {
    EXPECT_GT(by_kl.candidates[size_t(c)].kl, 2 * by_kl.candidates[2].kl) << c;
    EXPECT_LT(by_kl.candidates[size_t(c)].captured, by_kl.candidates[2].captured) << c;
  }
  EXPECT_GT(by_kl.candidates[2].captured, 0.9 * by_kl.oracle);
  EXPECT_LE(by_kl.candidates[2].captured, by_kl.oracle + 1e-12);
}

TEST(CalibMath, SamplePositionsRespectEligibility) {
  CalibSettings s{.budget = 8, .window = 4, .page_size = 16};
  const int64_t t_min = (4 + 32) * 16;
  auto p = sample_positions(4000, 50, s, 3);
  ASSERT_EQ(p.size(), 50u);
  EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
  for (int64_t t : p) {
    EXPECT_GE(t / 16 - s.window, 4 * s.budget);
    EXPECT_LT(t, 4000);
    EXPECT_GE(t, t_min);
  }
  EXPECT_EQ(p, sample_positions(4000, 50, s, 3));  // deterministic
  EXPECT_NE(p, sample_positions(4000, 50, s, 4));
  EXPECT_TRUE(sample_positions(t_min, 10, s, 1).empty());
  EXPECT_EQ(sample_positions(t_min + 1, 10, s, 1).size(), 1u);
  s.sink_pages = 2;
  for (int64_t t : sample_positions(4000, 50, s, 3))
    EXPECT_GE(t / 16 - s.window - s.sink_pages, 4 * s.budget);
  EXPECT_TRUE(sample_positions(t_min + 1, 10, s, 1).empty());
}

TEST(CalibMath, CriterionNames) {
  EXPECT_EQ(*parse_calib_criterion("kl"), CalibCriterion::kKl);
  EXPECT_EQ(*parse_calib_criterion("mass"), CalibCriterion::kMass);
  EXPECT_FALSE(parse_calib_criterion("KL2").ok());
  EXPECT_STREQ(calib_criterion_name(CalibCriterion::kMass), "mass");
}

}  // namespace
}  // namespace cisa
