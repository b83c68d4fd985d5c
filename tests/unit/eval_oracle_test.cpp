// Oracle page selection against a brute-force fp64 computation of the dense attention mass from
// the keys the test wrote (not read back from the cache), and against select_pages' list layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cisa/core/bf16.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/eval.h"

namespace cisa::eval {
namespace {

struct OracleFixture {
  static constexpr int kKv = 2, kHeadsPerGroup = 3, kDim = 8, kPage = 4, kTokens = 72;
  std::unique_ptr<PagedKvCache> cache;
  SeqId seq = 0;
  std::vector<float> keys;  // [tokens][kv][dim]
  std::vector<float> q;     // [rows][kv·hg][dim] for positions first … tokens−1
  int64_t first = 40;

  explicit OracleFixture(KvDtype dtype, uint32_t seed) {
    cache = *PagedKvCache::create({.num_layers = 1,
                                   .num_kv_heads = kKv,
                                   .head_dim = kDim,
                                   .page_size = kPage,
                                   .num_pages = 64,
                                   .dtype = dtype});
    seq = *cache->add_sequence();
    EXPECT_TRUE(cache->reserve(seq, kTokens).ok());
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    keys.resize(static_cast<size_t>(kTokens * kKv * kDim));
    for (auto& x : keys) x = 1.5f * nd(rng);
    if (dtype == KvDtype::kBF16)  // the cache stores bf16: compare against what it holds
      for (auto& x : keys) x = bf16_to_f32(f32_to_bf16(x));
    std::vector<float> v(keys.size());
    for (auto& x : v) x = nd(rng);
    EXPECT_TRUE(cache->append(0, seq, kTokens, keys.data(), v.data()).ok());
    q.resize(static_cast<size_t>((kTokens - first) * kKv * kHeadsPerGroup * kDim));
    for (auto& x : q) x = nd(rng);
  }

  // Σ over positions [a, b] and the group's heads of the softmax mass per chunk, in long double.
  std::vector<long double> mass(int g, int64_t a, int64_t b, float scale) const {
    std::vector<long double> m(static_cast<size_t>(kTokens / kPage + 1), 0.0L);
    const int hq = kKv * kHeadsPerGroup;
    for (int64_t t = a; t <= b; ++t)
      for (int h = 0; h < kHeadsPerGroup; ++h) {
        const float* qv = q.data() + ((t - first) * hq + g * kHeadsPerGroup + h) * kDim;
        std::vector<long double> e(static_cast<size_t>(t + 1));
        long double mx = -INFINITY, z = 0;
        for (int64_t s = 0; s <= t; ++s) {
          long double acc = 0;
          for (int i = 0; i < kDim; ++i)
            acc += static_cast<long double>(qv[i]) *
                   keys[static_cast<size_t>((s * kKv + g) * kDim + i)];
          e[static_cast<size_t>(s)] = acc * scale;
          mx = std::max(mx, e[static_cast<size_t>(s)]);
        }
        for (auto& x : e) z += (x = std::exp(x - mx));
        for (int64_t s = 0; s <= t; ++s)
          m[static_cast<size_t>(s / kPage)] += e[static_cast<size_t>(s)] / z;
      }
    return m;
  }
};

class OracleTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(OracleTest, SelectsTheChunksOfLargestDenseMass) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    OracleFixture s(GetParam(), seed);
    const SelectionParams p{
        .budget = 3, .window = 2, .qshare = 4, .qshare_query = QShareQuery::kMean, .sink_pages = 1};
    const float scale = 0.4f;
    const std::vector<BatchEntry> batch = {
        {.seq = s.seq,
         .first = s.first,
         .count = static_cast<int32_t>(OracleFixture::kTokens - s.first)}};
    PageLists got, ref;
    ThreadPool pool(2);
    ASSERT_TRUE(select_pages_oracle(*s.cache, 0, batch, s.q.data(),
                                    OracleFixture::kKv * OracleFixture::kHeadsPerGroup, scale, p,
                                    &pool, &got)
                    .ok());
    // select_pages with any index query gives the layout every list must share.
    std::vector<float> iq(static_cast<size_t>((OracleFixture::kTokens - s.first) *
                                              OracleFixture::kKv * OracleFixture::kDim),
                          0.5f);
    ASSERT_TRUE(select_pages(*s.cache, 0, batch, iq.data(), p, &pool, &ref).ok());
    ASSERT_EQ(got.groups.size(), ref.groups.size());
    ASSERT_EQ(got.offsets, ref.offsets);
    auto table = *s.cache->block_table(s.seq);
    int sparse = 0;
    for (size_t i = 0; i < got.groups.size(); ++i) {
      const auto& grp = got.groups[i];
      EXPECT_EQ(grp.first, ref.groups[i].first);
      EXPECT_EQ(grp.dense, ref.groups[i].dense);
      for (int g = 0; g < OracleFixture::kKv; ++g) {
        auto chunks = got.list_chunks(static_cast<int64_t>(i), g);
        auto pages = got.list_pages(static_cast<int64_t>(i), g);
        for (size_t k = 0; k < chunks.size(); ++k)
          EXPECT_EQ(pages[k], table[static_cast<size_t>(chunks[k])]);
        if (grp.dense) {
          auto rc = ref.list_chunks(static_cast<int64_t>(i), g);
          EXPECT_EQ(std::vector<int32_t>(chunks.begin(), chunks.end()),
                    std::vector<int32_t>(rc.begin(), rc.end()));
          continue;
        }
        ++sparse;
        // Expected: sink 0, the 3 eligible chunks of largest brute-force mass, then the window and
        // tail.
        const int64_t ca = grp.first / OracleFixture::kPage, cb = grp.last / OracleFixture::kPage;
        const auto m = s.mass(g, grp.first, grp.last, scale);
        std::vector<int32_t> elig;
        for (int64_t j = p.sink_pages; j < ca - p.window; ++j)
          elig.push_back(static_cast<int32_t>(j));
        std::stable_sort(elig.begin(), elig.end(), [&](int32_t a, int32_t b) {
          return m[static_cast<size_t>(a)] > m[static_cast<size_t>(b)];
        });
        elig.resize(static_cast<size_t>(p.budget));
        std::sort(elig.begin(), elig.end());
        std::vector<int32_t> want = {0};
        want.insert(want.end(), elig.begin(), elig.end());
        for (int64_t j = ca - p.window; j <= cb; ++j) want.push_back(static_cast<int32_t>(j));
        EXPECT_EQ(std::vector<int32_t>(chunks.begin(), chunks.end()), want)
            << "group " << i << " kv " << g;
        EXPECT_EQ(got.num_selected[i * OracleFixture::kKv + static_cast<size_t>(g)], 3);
      }
    }
    EXPECT_GT(sparse, 0);
  }
}

TEST_P(OracleTest, FullBudgetIsDense) {
  OracleFixture s(GetParam(), 9);
  const SelectionParams p{.budget = 100, .window = 2, .qshare = 4};
  const std::vector<BatchEntry> batch = {
      {.seq = s.seq,
       .first = s.first,
       .count = static_cast<int32_t>(OracleFixture::kTokens - s.first)}};
  PageLists got;
  ASSERT_TRUE(select_pages_oracle(*s.cache, 0, batch, s.q.data(), 6, 0.3f, p, nullptr, &got).ok());
  for (size_t i = 0; i < got.groups.size(); ++i) EXPECT_TRUE(got.groups[i].dense);
}

TEST(Oracle, Errors) {
  OracleFixture s(KvDtype::kF32, 4);
  const SelectionParams p{.budget = 2, .window = 1, .qshare = 2};
  std::vector<BatchEntry> batch = {{.seq = s.seq, .first = s.first, .count = 4}};
  PageLists out;
  EXPECT_FALSE(select_pages_oracle(*s.cache, 0, batch, nullptr, 6, 1.0f, p, nullptr, &out).ok());
  EXPECT_FALSE(select_pages_oracle(*s.cache, 0, batch, s.q.data(), 5, 1.0f, p, nullptr, &out).ok());
  batch[0].first = OracleFixture::kTokens;  // positions whose K/V were never written
  EXPECT_FALSE(select_pages_oracle(*s.cache, 0, batch, s.q.data(), 6, 1.0f, p, nullptr, &out).ok());
  batch[0].first = s.first;
  SelectionParams bad = p;
  bad.qshare = 0;
  EXPECT_FALSE(
      select_pages_oracle(*s.cache, 0, batch, s.q.data(), 6, 1.0f, bad, nullptr, &out).ok());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OracleTest, ::testing::Values(KvDtype::kF32, KvDtype::kBF16),
                         [](const auto& info) { return std::string(kv_dtype_name(info.param)); });

}  // namespace
}  // namespace cisa::eval
