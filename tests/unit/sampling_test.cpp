// Sampling: greedy tie rules, the filtered distribution against a brute-force fp64 computation,
// seeded reproducibility, and draw frequencies against the distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "cisa/model/sampling.h"

namespace cisa {
namespace {

TEST(Sampling, ArgmaxTiesAndNaN) {
  std::vector<float> l = {1.0f, 3.0f, 3.0f, -1.0f};
  EXPECT_EQ(argmax(l), 1);
  l = {NAN, 2.0f, NAN, 5.0f};
  EXPECT_EQ(argmax(l), 3);
  EXPECT_EQ(argmax(std::span<const float>()), -1);
  auto s = Sampler::create({.greedy = true});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->sample(std::vector<float>{0.5f, 0.7f, 0.7f}), 1);
  auto t0 = Sampler::create({.temperature = 0.0f});  // T = 0 is greedy too
  ASSERT_TRUE(t0.ok());
  EXPECT_EQ(t0->sample(std::vector<float>{0.5f, 0.9f, 0.7f}), 1);
}

TEST(Sampling, RejectsBadParameters) {
  EXPECT_FALSE(Sampler::create({.temperature = -1.0f}).ok());
  EXPECT_FALSE(Sampler::create({.temperature = NAN}).ok());
  EXPECT_FALSE(Sampler::create({.top_k = -3}).ok());
  EXPECT_FALSE(Sampler::create({.top_p = 0.0f}).ok());
  EXPECT_FALSE(Sampler::create({.top_p = 1.5f}).ok());
}

// Brute force: sort every token by logit (ties to the smaller id), keep k, softmax of l/T in
// fp64, keep the shortest prefix reaching p, renormalise.
std::vector<std::pair<int32_t, double>> reference(const std::vector<float>& l, double T, int k,
                                                  double p) {
  std::vector<int32_t> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  if (k > 0 && static_cast<size_t>(k) < idx.size()) idx.resize(static_cast<size_t>(k));
  std::vector<double> e;
  double z = 0;
  for (int32_t i : idx) e.push_back(std::exp(double(l[i]) / T)), z += e.back();
  std::vector<std::pair<int32_t, double>> out;
  double cum = 0;
  for (size_t j = 0; j < idx.size(); ++j) {
    out.push_back({idx[j], e[j] / z});
    cum += e[j] / z;
    if (p < 1.0 && cum >= p) break;  // p = 1 disables the filter
  }
  double s = 0;
  for (auto& q : out) s += q.second;
  for (auto& q : out) q.second /= s;
  return out;
}

TEST(Sampling, DistributionMatchesBruteForce) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> l(300);
    for (auto& x : l) x = std::round(nd(rng) * 4) / 4;  // coarse values: many ties
    const float T = trial % 5 == 0 ? 0.3f : 1.1f;
    const int k = trial % 3 == 0 ? 0 : 1 + trial;
    const float p = trial % 4 == 0 ? 1.0f : 0.5f + 0.01f * trial;
    std::vector<std::pair<int32_t, double>> got;
    ASSERT_TRUE(sampling_distribution(l, {.temperature = T, .top_k = k, .top_p = p}, &got).ok());
    const auto want = reference(l, T, k, p);
    ASSERT_EQ(got.size(), want.size()) << "trial " << trial;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first) << "trial " << trial << " rank " << i;
      EXPECT_NEAR(got[i].second, want[i].second, 1e-12);
    }
  }
}

TEST(Sampling, SeededDrawsRepeatAndFollowTheDistribution) {
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -5.0f};
  const SamplingParams sp{.temperature = 0.9f, .top_k = 4, .top_p = 0.95f, .seed = 42};
  auto a = Sampler::create(sp), b = Sampler::create(sp);
  ASSERT_TRUE(a.ok() && b.ok());
  std::map<int32_t, int> count;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const int32_t x = a->sample(l);
    ASSERT_EQ(x, b->sample(l)) << "draw " << i;
    count[x]++;
  }
  std::vector<std::pair<int32_t, double>> dist;
  ASSERT_TRUE(sampling_distribution(l, sp, &dist).ok());
  int covered = 0;
  for (const auto& [id, prob] : dist) {
    const double sd = std::sqrt(n * prob * (1 - prob));
    EXPECT_NEAR(count[id], n * prob, 5 * sd + 1) << "token " << id;
    covered += count[id];
  }
  EXPECT_EQ(covered, n);  // nothing outside the filtered set is ever drawn
  auto c = Sampler::create({.temperature = 0.9f, .top_k = 4, .top_p = 0.95f, .seed = 43});
  int same = 0;
  for (int i = 0; i < 1000; ++i) same += a->sample(l) == c->sample(l);
  EXPECT_LT(same, 1000);  // another seed gives another sequence
}

// Sampler::sample walks the best 64 tokens first and builds the sorted distribution only when
// the draw goes past them. Against the whole walk of sampling_distribution with the same uniform
// draws (a second sampler of the same seed, next_uniform()): the same token for every draw, at
// vocabularies of 40 (all in the head) to 152,064, with top-k inside and past the head, top-p
// cut inside and past it, flat logits (draws often pass the head) and non-finite ones.
TEST(Sampling, HeadWalkEqualsTheWholeDistribution) {
  std::mt19937 rng(5);
  int past_head = 0;
  for (const int64_t n : {int64_t{40}, int64_t{1000}, int64_t{49152}, int64_t{152064}})
    for (const float spread : {8.0f, 0.05f})  // peaked, and nearly flat
      for (const int32_t k : {0, 10, 64, 65, 500})
        for (const float p : {1.0f, 0.9f, 0.3f}) {
          SCOPED_TRACE("n " + std::to_string(n) + " spread " + std::to_string(spread) + " k " +
                       std::to_string(k) + " p " + std::to_string(p));
          std::normal_distribution<float> g(0.0f, spread);
          std::vector<float> l(static_cast<size_t>(n));
          for (float& v : l) v = g(rng);
          l[static_cast<size_t>(n / 3)] = l[static_cast<size_t>(n / 2)];  // a tie
          if (n == 1000 && spread < 1.0f && k == 0) l[7] = -INFINITY;     // the whole path
          const SamplingParams sp{.temperature = 0.8f, .top_k = k, .top_p = p, .seed = 9};
          auto a = Sampler::create(sp), b = Sampler::create(sp);
          ASSERT_TRUE(a.ok() && b.ok());
          std::vector<std::pair<int32_t, double>> dist;
          ASSERT_TRUE(sampling_distribution(l, sp, &dist).ok());
          const int draws = n > 10000 ? 40 : 400;
          for (int i = 0; i < draws; ++i) {
            const double u = b->next_uniform();
            double cum = 0.0;
            int32_t want = dist.back().first;
            size_t at = dist.size() - 1;
            for (size_t j = 0; j < dist.size(); ++j) {
              cum += dist[j].second;
              if (u < cum) {
                want = dist[j].first;
                at = j;
                break;
              }
            }
            past_head += at >= 64;
            ASSERT_EQ(a->sample(l), want) << "draw " << i << ", u = " << u;
          }
        }
  EXPECT_GT(past_head, 100);  // the flat cases exercise the whole path
}

}  // namespace
}  // namespace cisa
