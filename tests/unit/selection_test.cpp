// Selection: top-k tie rule, query groups, page-list contents, QShare semantics, errors.
#include <algorithm>
#include <bit>
#include <numeric>

#include "cisa/cpu/selection.h"
#include "test_util.h"

namespace cisa {
namespace {

using test::append_random;

// Independent reference: a full stable sort of all indices by descending score (NaN last).
std::vector<int32_t> topk_by_full_sort(const std::vector<float>& s, int64_t k) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
    if (na || nb) return !na && nb;
    return s[a] > s[b];
  });
  idx.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(s.size()))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(TopK, MatchesFullSortWithManyTies) {
  std::mt19937 rng(10);
  std::vector<int32_t> got, scratch;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 400);
    const int levels = 1 + static_cast<int>(rng() % 6);  // few distinct values: many ties
    std::vector<float> s(static_cast<size_t>(n));
    for (auto& x : s) {
      x = static_cast<float>(static_cast<int>(rng() % levels)) - 2.0f;
      if (rng() % 50 == 0) x = NAN;
      if (rng() % 60 == 0) x = -INFINITY;
    }
    const int64_t k = static_cast<int64_t>(rng() % (n + 3));
    select_topk(s, k, &got, &scratch);
    ASSERT_EQ(got, topk_by_full_sort(s, k)) << "trial " << trial << " n " << n << " k " << k;
  }
}

TEST(TopK, AllEqualScoresPickSmallestIndices) {
  std::vector<float> s(100, 0.5f);
  std::vector<int32_t> got, scratch;
  select_topk(s, 7, &got, &scratch);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
}

struct Fixture {
  std::unique_ptr<PagedKvCache> cache;
  SeqId seq = 0;
};

Fixture make_cache(int64_t len, int hkv, int d, std::mt19937& rng, RepKind rep = RepKind::kMean,
                   KvDtype dt = KvDtype::kF32) {
  Fixture f;
  f.cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                             .num_kv_heads = hkv,
                                             .head_dim = d,
                                             .page_size = 16,
                                             .num_pages = 2 * (len / 16 + 2),
                                             .dtype = dt,
                                             .rep = rep}));
  // A dummy sequence interleaved with the real one scatters its physical pages.
  SeqId other = *f.cache->add_sequence();
  f.seq = *f.cache->add_sequence();
  for (int64_t done = 0; done < len;) {
    const int64_t n = std::min<int64_t>(len - done, 1 + static_cast<int64_t>(rng() % 40));
    append_random(*f.cache, f.seq, n, rng);
    append_random(*f.cache, other, 16, rng);
    done += n;
  }
  return f;
}

// fp64 score of chunk j for one KV group.
double ref_score(const PagedKvCache& c, SeqId seq, int g, const std::vector<double>& q, int64_t j) {
  const int d = c.head_dim();
  const auto page = (*c.block_table(seq))[static_cast<size_t>(j)];
  double s = 0;
  if (c.config().rep == RepKind::kMean) {
    for (int i = 0; i < d; ++i) {
      double m = 0;
      for (int t = 0; t < 16; ++t) m += test::stored(c, true, 0, seq, j * 16 + t, g, i);
      s += q[static_cast<size_t>(i)] * (m / 16);
    }
  } else if (c.config().rep == RepKind::kMoment) {
    // log E[exp(q·k/√d)] for k ~ N(μ, diag σ²) of the page's keys: q·μ/√d + Σ q_i²σ_i²/(2d).
    for (int i = 0; i < d; ++i) {
      double m = 0, v = 0;
      for (int t = 0; t < 16; ++t) m += test::stored(c, true, 0, seq, j * 16 + t, g, i);
      m /= 16;
      for (int t = 0; t < 16; ++t) {
        const double x = test::stored(c, true, 0, seq, j * 16 + t, g, i) - m;
        v += x * x;
      }
      v /= 16;
      const double qi = q[static_cast<size_t>(i)];
      s += qi * m + qi * qi * v / (2 * std::sqrt(static_cast<double>(d)));
    }
  } else {
    for (int i = 0; i < d; ++i) {
      double lo = INFINITY, hi = -INFINITY;
      for (int t = 0; t < 16; ++t) {
        lo = std::min<double>(lo, test::stored(c, true, 0, seq, j * 16 + t, g, i));
        hi = std::max<double>(hi, test::stored(c, true, 0, seq, j * 16 + t, g, i));
      }
      s += std::max(q[static_cast<size_t>(i)] * lo, q[static_cast<size_t>(i)] * hi);
    }
  }
  (void)page;
  return s / std::sqrt(static_cast<double>(d));
}

TEST(Selection, QueryGroupsSplitDensePrefixThenQShare) {
  std::mt19937 rng(11);
  auto f = make_cache(1200, 1, 8, rng);
  SelectionParams p{.budget = 20, .window = 4, .qshare = 16};
  // t_sparse = (k + W + 1)·B = 25·16 = 400.
  std::vector<BatchEntry> batch = {{f.seq, 350, 100}};
  PageLists lists;
  ASSERT_TRUE(plan_query_groups(*f.cache, batch, p, &lists).ok());
  ASSERT_EQ(lists.groups.size(), 1u + 4u);  // dense 350..399, then 400..415, …, 448..449
  EXPECT_TRUE(lists.groups[0].dense);
  EXPECT_EQ(lists.groups[0].first, 350);
  EXPECT_EQ(lists.groups[0].last, 399);
  EXPECT_FALSE(lists.groups[1].dense);
  EXPECT_EQ(lists.groups[1].first, 400);
  EXPECT_EQ(lists.groups[1].last, 415);
  EXPECT_EQ(lists.groups[1].row, 50);
  EXPECT_EQ(lists.groups[4].first, 448);
  EXPECT_EQ(lists.groups[4].last, 449);
  EXPECT_EQ(eligible_count(399, 16, p), 20);  // = k: still dense
  EXPECT_EQ(eligible_count(400, 16, p), 21);
}

TEST(Selection, ListsHoldSinksTopKWindowAndTailAgainstFp64Scores) {
  for (RepKind rep : {RepKind::kMean, RepKind::kQuest, RepKind::kMoment}) {
    std::mt19937 rng(12);
    const int d = 32, hkv = 2;
    auto f = make_cache(2000, hkv, d, rng, rep);
    SelectionParams p{.budget = 10, .window = 3, .qshare = 8, .sink_pages = 2};
    std::vector<BatchEntry> batch = {{f.seq, 1900, 40}};
    auto iq = test::random_vec(rng, static_cast<size_t>(40 * hkv * d));
    PageLists lists;
    ThreadPool pool(2);
    ASSERT_TRUE(select_pages(*f.cache, 0, batch, iq.data(), p, &pool, &lists).ok());
    auto table = *f.cache->block_table(f.seq);
    for (size_t gi = 0; gi < lists.groups.size(); ++gi) {
      const auto& grp = lists.groups[gi];
      ASSERT_FALSE(grp.dense);
      const int64_t ca = grp.first / 16, cb = grp.last / 16;
      for (int g = 0; g < hkv; ++g) {
        // fp64 mean index query and scores over the eligible chunks [sinks, c(a) − W).
        std::vector<double> q(static_cast<size_t>(d), 0.0);
        for (int64_t t = grp.first; t <= grp.last; ++t)
          for (int i = 0; i < d; ++i)
            q[static_cast<size_t>(i)] += iq[static_cast<size_t>(((t - 1900) * hkv + g) * d + i)];
        for (auto& x : q) x /= static_cast<double>(grp.last - grp.first + 1);
        std::vector<std::pair<double, int64_t>> sc;
        for (int64_t j = 2; j < ca - 3; ++j)
          sc.push_back({-ref_score(*f.cache, f.seq, g, q, j), j});
        std::sort(sc.begin(), sc.end());
        if (sc[9].first + 1e-4 > sc[10].first) continue;  // a near-tie: f32 may legitimately differ
        std::vector<int32_t> want = {0, 1};
        std::vector<int32_t> top;
        for (int i = 0; i < 10; ++i)
          top.push_back(static_cast<int32_t>(sc[static_cast<size_t>(i)].second));
        std::sort(top.begin(), top.end());
        want.insert(want.end(), top.begin(), top.end());
        for (int64_t j = ca - 3; j <= cb; ++j) want.push_back(static_cast<int32_t>(j));
        auto chunks = lists.list_chunks(static_cast<int64_t>(gi), g);
        ASSERT_EQ(std::vector<int32_t>(chunks.begin(), chunks.end()), want)
            << rep_kind_name(rep) << " group " << gi;
        auto pages = lists.list_pages(static_cast<int64_t>(gi), g);
        for (size_t i = 0; i < pages.size(); ++i)
          ASSERT_EQ(pages[i], table[static_cast<size_t>(chunks[i])]);
        EXPECT_EQ(lists.num_selected[gi * hkv + static_cast<size_t>(g)], 10);
      }
    }
  }
}

// Two pages with the same mean key: the moment representative ranks the one whose keys spread
// along the query above the one whose keys do not (its expected exp(q·k/√d) is larger), where the
// mean key ties them.
TEST(Selection, MomentRepresentativeRanksSpreadAlongTheQueryFirst) {
  const int d = 16;
  for (RepKind rep : {RepKind::kMean, RepKind::kMoment}) {
    auto c = std::move(*PagedKvCache::create({.num_layers = 1,
                                              .num_kv_heads = 1,
                                              .head_dim = d,
                                              .page_size = 16,
                                              .num_pages = 4,
                                              .rep = rep}));
    const SeqId s = *c->add_sequence();
    std::vector<float> k(static_cast<size_t>(32 * d), 0.0f), v(k.size(), 0.0f);
    for (int t = 0; t < 16; ++t) {
      k[static_cast<size_t>(t * d)] = 1.0f;                             // page 0: constant
      k[static_cast<size_t>((16 + t) * d)] = t % 2 == 0 ? 0.0f : 2.0f;  // page 1: spread
    }
    ASSERT_TRUE(c->reserve(s, 32).ok());
    ASSERT_TRUE(c->append(0, s, 32, k.data(), v.data()).ok());
    std::vector<float> q(static_cast<size_t>(d), 0.0f);
    q[0] = 4.0f;
    float scores[2];
    score_chunks(*c, 0, *c->block_table(s), 0, q.data(), 0, 2, scores);
    const double mean_term = 4.0 / std::sqrt(16.0);  // q·μ/√d, the same for both pages
    EXPECT_NEAR(scores[0], mean_term, 1e-6);
    if (rep == RepKind::kMean) {
      EXPECT_NEAR(scores[1], mean_term, 1e-6);
    } else {
      EXPECT_NEAR(scores[1], mean_term + 16.0 * 1.0 / (2 * 16), 1e-6);  // q_0²σ_0²/(2d), σ² = 1
      EXPECT_GT(scores[1], scores[0]);
    }
  }
}

// Pages whose keys repeat one of three patterns have equal representatives, so their scores must
// be bit-equal wherever the chunk sits in the scored range: the spec's tie rule (smaller index
// first) depends on it. A range whose length is not a multiple of the vector kernel's width once
// scored its last 1-3 chunks in another summation order, which flipped ties against the GPU.
TEST(Selection, EqualRepresentativesScoreEqualAtEveryPosition) {
  std::mt19937 rng(12);
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kBF16})
    for (int d : {16, 64, 128}) {
      const int64_t pages = 23;
      auto c = std::move(*PagedKvCache::create({.num_layers = 1,
                                                .num_kv_heads = 1,
                                                .head_dim = d,
                                                .page_size = 16,
                                                .num_pages = pages,
                                                .dtype = dt}));
      const SeqId s = *c->add_sequence();
      std::normal_distribution<float> nd;
      std::vector<float> pat(static_cast<size_t>(3 * d)), q(static_cast<size_t>(d));
      for (auto& x : pat) x = nd(rng);
      for (auto& x : q) x = nd(rng);
      std::vector<float> k(static_cast<size_t>(pages * 16 * d)), v(k.size(), 0.0f);
      for (int64_t t = 0; t < pages * 16; ++t)
        for (int i = 0; i < d; ++i)
          k[static_cast<size_t>(t * d + i)] = pat[static_cast<size_t>((t / 16) % 3 * d + i)];
      ASSERT_TRUE(c->reserve(s, pages * 16).ok());
      ASSERT_TRUE(c->append(0, s, pages * 16, k.data(), v.data()).ok());
      const auto table = *c->block_table(s);
      for (int64_t first = 0; first < 4; ++first)
        for (int64_t n = 1; first + n <= pages; ++n) {
          std::vector<float> sc(static_cast<size_t>(n));
          score_chunks(*c, 0, table, 0, q.data(), first, n, sc.data());
          for (int64_t j = 0; j < n; ++j) {
            float one;  // the chunk scored alone
            score_chunks(*c, 0, table, 0, q.data(), first + j, 1, &one);
            ASSERT_EQ(std::bit_cast<uint32_t>(sc[static_cast<size_t>(j)]),
                      std::bit_cast<uint32_t>(one))
                << "d " << d << " first " << first << " n " << n << " chunk " << first + j;
            const int64_t same = (first + j) % 3;  // the first chunk of its pattern
            float ref;
            score_chunks(*c, 0, table, 0, q.data(), same, 1, &ref);
            ASSERT_EQ(std::bit_cast<uint32_t>(one), std::bit_cast<uint32_t>(ref))
                << "d " << d << " chunk " << first + j << " vs chunk " << same;
          }
        }
    }
}

TEST(Selection, QShareOfOneEqualsPerPositionSelection) {
  std::mt19937 rng(13);
  const int d = 16, hkv = 2;
  auto f = make_cache(1500, hkv, d, rng, RepKind::kMean, KvDtype::kBF16);
  SelectionParams p{.budget = 12, .window = 2, .qshare = 1};
  const int64_t first = 1400, n = 30;
  auto iq = test::random_vec(rng, static_cast<size_t>(n * hkv * d));
  std::vector<BatchEntry> batch = {{f.seq, first, static_cast<int32_t>(n)}};
  PageLists block, single;
  ASSERT_TRUE(select_pages(*f.cache, 0, batch, iq.data(), p, nullptr, &block).ok());
  ASSERT_EQ(block.groups.size(), static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<BatchEntry> one = {{f.seq, first + t, 1}};
    ASSERT_TRUE(select_pages(*f.cache, 0, one, iq.data() + t * hkv * d, p, nullptr, &single).ok());
    for (int g = 0; g < hkv; ++g) {
      auto a = block.list_pages(t, g), b = single.list_pages(0, g);
      ASSERT_EQ(std::vector<int32_t>(a.begin(), a.end()), std::vector<int32_t>(b.begin(), b.end()));
    }
  }
}

TEST(Selection, MeanQueryEqualsAveragedPerPositionScores) {
  std::mt19937 rng(14);
  const int d = 64, hkv = 1;
  auto f = make_cache(3000, hkv, d, rng);
  SelectionParams p{.budget = 16, .window = 4, .qshare = 32};
  const int64_t first = 2944, n = 32;  // one group
  auto iq = test::random_vec(rng, static_cast<size_t>(n * d));
  std::vector<BatchEntry> batch = {{f.seq, first, static_cast<int32_t>(n)}};
  PageLists lists;
  ASSERT_TRUE(select_pages(*f.cache, 0, batch, iq.data(), p, nullptr, &lists).ok());
  ASSERT_EQ(lists.groups.size(), 1u);
  // Average the per-position fp64 scores (not the queries), then take the top-k.
  const int64_t ca = first / 16;
  std::vector<std::pair<double, int64_t>> avg;
  for (int64_t j = 0; j < ca - 4; ++j) {
    double s = 0;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> q(iq.begin() + t * d, iq.begin() + (t + 1) * d);
      s += ref_score(*f.cache, f.seq, 0, q, j);
    }
    avg.push_back({-s / n, j});
  }
  std::sort(avg.begin(), avg.end());
  ASSERT_GT(avg[16].first - avg[15].first, 1e-5) << "near-tie in the fixture; change the seed";
  std::vector<int32_t> want;
  for (int i = 0; i < 16; ++i)
    want.push_back(static_cast<int32_t>(avg[static_cast<size_t>(i)].second));
  std::sort(want.begin(), want.end());
  auto chunks = lists.list_chunks(0, 0);
  EXPECT_EQ(std::vector<int32_t>(chunks.begin(), chunks.begin() + 16), want);

  // `last` uses only the final position's query: same selected set as that position alone.
  p.qshare_query = QShareQuery::kLast;
  ASSERT_TRUE(select_pages(*f.cache, 0, batch, iq.data(), p, nullptr, &lists).ok());
  PageLists alone;
  SelectionParams p1 = p;
  p1.qshare = 1;
  std::vector<BatchEntry> last = {{f.seq, first + n - 1, 1}};
  ASSERT_TRUE(select_pages(*f.cache, 0, last, iq.data() + (n - 1) * d, p1, nullptr, &alone).ok());
  auto a = lists.list_chunks(0, 0), b = alone.list_chunks(0, 0);
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 16),
            std::vector<int32_t>(b.begin(), b.begin() + 16));
}

TEST(Selection, DecodeScoredInParallelSlicesEqualsSerial) {
  std::mt19937 rng(17);
  const int d = 64;
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kBF16}) {
    auto f = make_cache(3000, 1, d, rng, RepKind::kMean, dt);
    std::vector<BatchEntry> batch = {{f.seq, 2999, 1}};  // one list: fewer lists than threads
    auto iq = test::random_vec(rng, static_cast<size_t>(d));
    SelectionParams p{.budget = 17, .window = 5, .qshare = 1, .sink_pages = 1};
    PageLists serial, parallel;
    ThreadPool pool(3);
    SelectionWorkspace ws;
    ASSERT_TRUE(select_pages(*f.cache, 0, batch, iq.data(), p, nullptr, &serial).ok());
    ASSERT_TRUE(select_pages(*f.cache, 0, batch, iq.data(), p, &pool, &parallel, &ws).ok());
    ASSERT_FALSE(ws.score_offsets.empty()) << "the sliced scoring path did not run";
    EXPECT_EQ(serial.pages, parallel.pages);
    EXPECT_EQ(serial.chunks, parallel.chunks);
    EXPECT_EQ(parallel.num_selected[0], 17);
  }
}

TEST(Selection, DenseFallbackWhenEligibleAtMostBudget) {
  std::mt19937 rng(15);
  auto f = make_cache(500, 1, 8, rng);
  SelectionParams p{.budget = 100, .window = 4, .qshare = 4};
  std::vector<BatchEntry> batch = {{f.seq, 490, 10}};
  auto iq = test::random_vec(rng, 80);
  PageLists lists;
  ASSERT_TRUE(select_pages(*f.cache, 0, batch, iq.data(), p, nullptr, &lists).ok());
  ASSERT_EQ(lists.groups.size(), 1u);
  EXPECT_TRUE(lists.groups[0].dense);
  EXPECT_EQ(lists.list_pages(0, 0).size(), 500u / 16 + 1);
  EXPECT_EQ(lists.num_selected[0], 0);
}

TEST(Selection, RejectsBadInput) {
  std::mt19937 rng(16);
  auto f = make_cache(100, 1, 8, rng);
  std::vector<BatchEntry> batch = {{f.seq, 90, 5}};
  std::vector<float> iq(40);
  PageLists lists;
  auto bad = [&](SelectionParams p, std::vector<BatchEntry> b, const char* what) {
    Status s = select_pages(*f.cache, 0, b, iq.data(), p, nullptr, &lists);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_FALSE(s.message().empty());
  };
  bad({.budget = -1}, batch, "negative k");
  bad({.budget = 4, .qshare = 0}, batch, "G = 0");
  bad({.budget = 4, .window = -2}, batch, "negative window");
  bad({.budget = 4}, {{f.seq, 90, 20}}, "queries past the written tokens");
  bad({.budget = 4}, {{42, 0, 1}}, "unknown sequence");
  bad({.budget = 4}, {{f.seq, 0, 0}}, "empty entry");
  EXPECT_FALSE(select_pages(*f.cache, 0, batch, nullptr, {.budget = 4}, nullptr, &lists).ok());
  auto no_reps = std::move(*PagedKvCache::create(
      {.num_layers = 1, .head_dim = 8, .num_pages = 8, .rep_layers = {false}}));
  SeqId s = *no_reps->add_sequence();
  append_random(*no_reps, s, 20, rng);
  std::vector<BatchEntry> b2 = {{s, 10, 1}};
  EXPECT_EQ(select_pages(*no_reps, 0, b2, iq.data(), {.budget = 1}, nullptr, &lists).code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cisa
