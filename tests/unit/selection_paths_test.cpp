// The CPU selection's fast paths against simple references: select_topk (radix select) against a
// full sort under the spec's tie rule, on continuous scores with the values that stress an
// order-preserving bit encoding (+0 and −0 equal, NaN below every number, ±∞, subnormals, many
// exact ties); and select_pages scoring page blocks across KV groups on a pool against scoring one
// list at a time without one.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "cisa/cpu/selection.h"
#include "test_util.h"

namespace cisa {
namespace {

// Indices of the k best: descending score by IEEE comparison (so −0 == +0), NaN after every
// number, equal scores (and NaNs among themselves) to the smaller index; returned ascending.
std::vector<int32_t> reference_topk(const std::vector<float>& s, int64_t k) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    const bool na = std::isnan(s[static_cast<size_t>(a)]),
               nb = std::isnan(s[static_cast<size_t>(b)]);
    if (na || nb) return !na && nb;
    return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)];
  });
  idx.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(s.size()))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

float special(std::mt19937& rng, std::normal_distribution<float>& nd) {
  switch (rng() % 12) {
    case 0:
      return 0.0f;
    case 1:
      return -0.0f;
    case 2:
      return std::numeric_limits<float>::quiet_NaN();
    case 3:
      return std::numeric_limits<float>::infinity();
    case 4:
      return -std::numeric_limits<float>::infinity();
    case 5:
      return std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 5);
    case 6:
      return -std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 5);
    case 7:
      return std::numeric_limits<float>::max();
    case 8:
      return std::numeric_limits<float>::lowest();
    default:
      return std::round(nd(rng) * 4.0f) / 4.0f;  // coarse values: exact ties
  }
}

TEST(TopKRadix, MatchesFullSortOnContinuousAndSpecialScores) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd;
  std::vector<int32_t> got, scratch;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % (trial < 300 ? 600 : 70000));
    const int mix = static_cast<int>(rng() % 3);  // 0: continuous, 1: mostly special, 2: half
    std::vector<float> s(static_cast<size_t>(n));
    for (auto& x : s) {
      const bool sp = mix == 1 ? rng() % 8 != 0 : mix == 2 ? rng() % 2 == 0 : rng() % 40 == 0;
      x = sp ? special(rng, nd) : nd(rng) * 100.0f;
    }
    const int64_t k = trial % 5 == 0 ? n - 1 : static_cast<int64_t>(rng() % (n + 2));
    select_topk(s, k, &got, &scratch);
    ASSERT_EQ(got, reference_topk(s, k)) << "trial " << trial << " n " << n << " k " << k;
  }
}

TEST(TopKRadix, SignedZerosAreOneValueAndNanRanksLast) {
  // −0 and +0 tie: the smaller indices win whatever their signs.
  const std::vector<float> zeros = {-0.0f, 0.0f, -0.0f, 0.0f, -1.0f};
  std::vector<int32_t> got, scratch;
  select_topk(zeros, 3, &got, &scratch);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  // Every number, −∞ included, ranks above NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> s = {nan, -std::numeric_limits<float>::infinity(), nan, -3.0f};
  select_topk(s, 2, &got, &scratch);
  EXPECT_EQ(got, (std::vector<int32_t>{1, 3}));
  select_topk(s, 3, &got, &scratch);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 3}));
}

// With a pool and several KV groups, select_pages scores page blocks across the groups first; with
// no pool it scores each list on its own. Same scores, so the same lists, entry for entry.
TEST(SelectPagesPaths, BlockedScoringAcrossKvGroupsEqualsPerListScoring) {
  std::mt19937 rng(78);
  for (const int hkv : {2, 8}) {
    auto cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                                  .num_kv_heads = hkv,
                                                  .head_dim = 64,
                                                  .page_size = 16,
                                                  .num_pages = 400,
                                                  .dtype = KvDtype::kBF16}));
    const SeqId a = *cache->add_sequence(), b = *cache->add_sequence();
    for (int i = 0; i < 12; ++i) {  // interleaved appends scatter both sequences' pages
      test::append_random(*cache, a, 1 + static_cast<int64_t>(rng() % 300), rng);
      test::append_random(*cache, b, 1 + static_cast<int64_t>(rng() % 200), rng);
    }
    const int64_t la = *cache->length(a), lb = *cache->length(b);
    for (const bool decode_only : {true, false}) {
      std::vector<BatchEntry> batch = {{a, la - 1, 1}};
      if (!decode_only) batch = {{a, la - 100, 100}, {b, lb - 1, 1}};
      const int64_t rows = batch_row_offsets(batch).back();
      const auto iq = test::random_vec(rng, static_cast<size_t>(rows * hkv * 64));
      const SelectionParams sp{.budget = 7, .window = 2, .qshare = 16, .sink_pages = 1};
      ThreadPool pool(2);
      PageLists serial, pooled;
      ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), sp, nullptr, &serial).ok());
      ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), sp, &pool, &pooled).ok());
      EXPECT_EQ(pooled.offsets, serial.offsets);
      EXPECT_EQ(pooled.pages, serial.pages)
          << "hkv " << hkv << (decode_only ? " decode" : " mixed");
      EXPECT_EQ(pooled.chunks, serial.chunks);
      EXPECT_EQ(pooled.num_selected, serial.num_selected);
      for (int32_t n : pooled.num_selected) EXPECT_LE(n, 7);
      EXPECT_EQ(pooled.num_selected[0], 7);  // the decode list of `a` really ran top-k
    }
  }
}

}  // namespace
}  // namespace cisa
