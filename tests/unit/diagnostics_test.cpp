// Selection diagnostics against brute-force computations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "cisa/core/diagnostics.h"

namespace cisa {
namespace {

TEST(Diagnostics, ChunkMassSumsHeadsAndPages) {
  std::vector<double> h0 = {0.1, 0.2, 0.3, 0.4, 0.0}, h1 = {0.5, 0.0, 0.0, 0.25, 0.25};
  std::vector<std::span<const double>> heads = {h0, h1};
  auto m = chunk_mass(heads, 2);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_DOUBLE_EQ(m[0], 0.8);
  EXPECT_DOUBLE_EQ(m[1], 0.95);
  EXPECT_DOUBLE_EQ(m[2], 0.25);
}

TEST(Diagnostics, OracleAndCapturedMassMatchBruteForce) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 5 + static_cast<int>(rng() % 60);
    std::vector<double> mass(static_cast<size_t>(n));
    for (auto& x : mass) x = std::floor(u(rng) * 5);  // ties
    const int64_t first = rng() % 3, end = n - static_cast<int64_t>(rng() % 3), k = rng() % 10;
    auto got = oracle_topk(mass, first, end, k);
    // Brute force: the best captured mass over all subsets is reached by the largest k values.
    std::vector<double> vals(mass.begin() + first, mass.begin() + end);
    std::sort(vals.rbegin(), vals.rend());
    const double want = std::accumulate(
        vals.begin(), vals.begin() + std::min<int64_t>(k, static_cast<int64_t>(vals.size())), 0.0);
    const double total = std::accumulate(mass.begin(), mass.end(), 0.0);
    if (total > 0) {
      EXPECT_NEAR(captured_mass(mass, got), want / total, 1e-12);
    }
    EXPECT_EQ(static_cast<int64_t>(got.size()), std::min<int64_t>(k, end - first));
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
    // Ties go to smaller indices: every unchosen chunk with equal mass to a chosen one comes later.
    std::set<int32_t> chosen(got.begin(), got.end());
    for (int32_t a : got)
      for (int64_t b = first; b < a; ++b)
        if (!chosen.count(static_cast<int32_t>(b))) {
          EXPECT_LT(mass[static_cast<size_t>(b)], mass[static_cast<size_t>(a)] + 1e-300);
        }
  }
}

TEST(Diagnostics, OverlapRetentionKl) {
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {3, 4, 5};
  EXPECT_DOUBLE_EQ(selection_overlap(a, b), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(qshare_retention(a, b, 4), 0.5);
  EXPECT_DOUBLE_EQ(selection_overlap({}, {}), 1.0);
  std::vector<double> p = {0.5, 0.5, 0}, q = {0.25, 0.75, 0};
  EXPECT_NEAR(kl_divergence(p, q), 0.5 * std::log(2.0) + 0.5 * std::log(0.5 / 0.75), 1e-12);
  EXPECT_EQ(kl_divergence(p, p), 0.0);
  std::vector<double> z = {1, 0, 0};
  EXPECT_TRUE(std::isinf(kl_divergence(p, z)));
  std::vector<double> s = {1.0, 2.0, 3.0};
  auto sm = softmax(s);
  const double den = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(sm[static_cast<size_t>(i)], std::exp(1.0 + i) / den, 1e-15);
}

TEST(Diagnostics, WindowTradeoff) {
  // Chunks 0..9; eligible 0..5, window 6..9. Selected {0, 1}.
  std::vector<double> mass = {5, 4, 3, 1, 2, 0, 1, 1, 1, 2};
  std::vector<int32_t> sel = {0, 1};
  auto w = window_tradeoff(mass, sel, 6, 6, 10);
  const double total = 20;
  EXPECT_DOUBLE_EQ(w.window_mass, 5 / total);
  EXPECT_DOUBLE_EQ(w.extra_mass, (3 + 2 + 1 + 0) / total);  // best 4 of {3,1,2,0}
}

}  // namespace
}  // namespace cisa
