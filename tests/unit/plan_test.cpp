// The core's plan rules (plan.h) and page table (page_table.h): parameter bounds, list layout
// against the lists select_pages writes, the per-position traffic count against a brute-force
// count over those lists, and the page table's all-or-nothing reservations.
#include <algorithm>
#include <limits>
#include <random>

#include "cisa/core/plan.h"
#include "cisa/cpu/selection.h"
#include "test_util.h"

namespace cisa {
namespace {

TEST(SelectionParamsBounds, RejectsHugeAndNegativeValues) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (int64_t v : {big, big / 2, kMaxSelectionPages + 1}) {
    EXPECT_EQ(validate_selection_params({.budget = v}).code(), StatusCode::kInvalidArgument) << v;
    EXPECT_EQ(validate_selection_params({.window = v}).code(), StatusCode::kInvalidArgument) << v;
    EXPECT_EQ(validate_selection_params({.qshare = v}).code(), StatusCode::kInvalidArgument) << v;
    EXPECT_EQ(validate_selection_params({.sink_pages = v}).code(), StatusCode::kInvalidArgument)
        << v;
  }
  EXPECT_EQ(validate_selection_params({.budget = -1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(validate_selection_params({.qshare = 0}).code(), StatusCode::kInvalidArgument);
  const SelectionParams edge{.budget = kMaxSelectionPages,
                             .window = kMaxSelectionPages,
                             .qshare = kMaxSelectionPages,
                             .sink_pages = kMaxSelectionPages};
  EXPECT_TRUE(validate_selection_params(edge).ok());
  const Status s = validate_selection_params({.budget = big});
  EXPECT_NE(s.message().find("budget"), std::string::npos) << s.message();
}

TEST(PlanQueryGroups, HugeParametersAreRefusedNotOverflowed) {
  const std::vector<BatchEntry> batch = {{.seq = 0, .first = 0, .count = 100}};
  PageLists lists;
  EXPECT_EQ(
      plan_query_groups(16, batch, {.budget = std::numeric_limits<int64_t>::max()}, &lists).code(),
      StatusCode::kInvalidArgument);
  // At the bound every position is dense: one group, no overflow in the split point.
  ASSERT_TRUE(plan_query_groups(16, batch,
                                {.budget = kMaxSelectionPages,
                                 .window = kMaxSelectionPages,
                                 .sink_pages = kMaxSelectionPages},
                                &lists)
                  .ok());
  ASSERT_EQ(lists.groups.size(), 1u);
  EXPECT_TRUE(lists.groups[0].dense);
}

// Builds a one-layer cache with sequences of the given lengths and runs select_pages over a batch
// that mixes a prefill run and decode rows, then checks layout, sizes and the traffic count.
TEST(PlanLayout, MatchesSelectPagesAndBruteForceTraffic) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 40; ++trial) {
    const int hkv = 1 + static_cast<int>(rng() % 3), d = 16, B = 16;
    const SelectionParams p{.budget = 1 + static_cast<int64_t>(rng() % 6),
                            .window = static_cast<int64_t>(rng() % 4),
                            .qshare = 1 + static_cast<int64_t>(rng() % 8),
                            .qshare_query = rng() % 2 ? QShareQuery::kMean : QShareQuery::kLast,
                            .sink_pages = static_cast<int64_t>(rng() % 3)};
    auto cache = std::move(*PagedKvCache::create(
        {.num_layers = 1, .num_kv_heads = hkv, .head_dim = d, .page_size = B, .num_pages = 400}));
    std::vector<BatchEntry> batch;
    for (int s = 0; s < 3; ++s) {
      const SeqId id = *cache->add_sequence();
      const int64_t len = 1 + static_cast<int64_t>(rng() % 900);
      test::append_random(*cache, id, len, rng);
      const int32_t count =
          s == 0 ? static_cast<int32_t>(std::min<int64_t>(len, 1 + rng() % 200)) : 1;
      batch.push_back({.seq = id, .first = len - count, .count = count});
    }
    std::vector<float> iq(static_cast<size_t>((batch[0].count + 2) * hkv * d));
    for (auto& x : iq) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    PageLists lists;
    ThreadPool pool(1);
    ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), p, &pool, &lists).ok());
    for (size_t i = 0; i < lists.groups.size(); ++i) {
      const QueryGroup& g = lists.groups[i];
      const ListLayout l = list_layout(g, B, p);
      int64_t brute = 0, brute_dense = 0;
      for (int kv = 0; kv < hkv; ++kv) {
        const auto chunks = lists.list_chunks(static_cast<int64_t>(i), kv);
        ASSERT_EQ(static_cast<int64_t>(chunks.size()), l.size()) << "trial " << trial;
        for (int64_t t = g.first; t <= g.last; ++t) {
          brute +=
              std::count_if(chunks.begin(), chunks.end(), [&](int32_t c) { return c <= t / B; });
          brute_dense += t / B + 1;
        }
        // Fixed and tail ranges appear verbatim; the selected part lies in the eligible range.
        for (int64_t j = 0; j < l.fixed_end - l.fixed_begin; ++j)
          ASSERT_EQ(chunks[static_cast<size_t>(j)], l.fixed_begin + j);
        for (int64_t j = 0; j < l.selected; ++j) {
          const int32_t c = chunks[static_cast<size_t>(l.fixed_end - l.fixed_begin + j)];
          ASSERT_GE(c, l.eligible_begin);
          ASSERT_LT(c, l.eligible_end);
        }
      }
      EXPECT_EQ(pages_read(g, B, p) * hkv, brute) << "trial " << trial << " group " << i;
      EXPECT_EQ(pages_read_dense(g, B) * hkv, brute_dense);
    }
  }
}

TEST(DenseChunkRange, WindowCoversEveryQuery) {
  for (int64_t first = 0; first < 100; first += 7)
    for (int32_t count = 1; count < 40; count += 5)
      for (int64_t w : {0, 1, 5, 16, 33}) {
        const ChunkRange r = dense_chunk_range({.seq = 0, .first = first, .count = count}, 16, w);
        const int64_t lo = w > 0 ? std::max<int64_t>(0, first - w + 1) : 0;  // oldest visible
        EXPECT_EQ(r.begin, lo / 16);
        EXPECT_EQ(r.end, (first + count - 1) / 16 + 1);
      }
}

// Adopted sequences (block tables made by a caller) mixed with reservations and releases: every
// page is owned by at most one sequence, the free count is exact, and pages are handed out in the
// order of a reference stack from which each adopted page was erased when it was adopted.
TEST(PageTable, AdoptedPagesAreNeverHandedOutTwice) {
  std::mt19937 rng(3);
  const int64_t P = 64;
  PageTable t(1, 16, P);
  std::vector<int32_t> ref;  // the free stack, kept eagerly
  for (int64_t p = P - 1; p >= 0; --p) ref.push_back(static_cast<int32_t>(p));
  std::vector<SeqId> live;
  for (int step = 0; step < 400; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 && ref.size() >= 3) {  // adopt 1-3 free pages, picked anywhere in the stack
      std::vector<int32_t> pages;
      const size_t n = 1 + rng() % 3;
      while (pages.size() < n) {
        const int32_t p = ref[rng() % ref.size()];
        if (std::find(pages.begin(), pages.end(), p) == pages.end()) pages.push_back(p);
      }
      auto s = t.adopt_sequence(pages, static_cast<int64_t>(n) * 16 - 5);
      ASSERT_TRUE(s.ok()) << s.status().message();
      std::erase_if(
          ref, [&](int32_t p) { return std::find(pages.begin(), pages.end(), p) != pages.end(); });
      live.push_back(*s);
    } else if (op == 1 && !ref.empty()) {  // a new sequence reserves 1-2 pages
      const SeqId s = *t.add_sequence();
      const int64_t n = std::min<int64_t>(1 + rng() % 2, static_cast<int64_t>(ref.size()));
      ASSERT_TRUE(t.reserve(s, n * 16).ok());
      const auto table = t.block_table(s);
      ASSERT_TRUE(table.ok());
      for (int32_t p : *table) {
        ASSERT_EQ(p, ref.back()) << "step " << step;
        ref.pop_back();
      }
      live.push_back(s);
    } else if (!live.empty()) {  // release one
      const size_t i = rng() % live.size();
      const auto table = t.block_table(live[i]);
      ASSERT_TRUE(table.ok());
      const std::vector<int32_t> pages(table->begin(), table->end());
      ASSERT_TRUE(t.release_sequence(live[i]).ok());
      for (auto it = pages.rbegin(); it != pages.rend(); ++it) ref.push_back(*it);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_EQ(t.free_pages(), static_cast<int64_t>(ref.size())) << "step " << step;
    std::vector<int> owners(static_cast<size_t>(P), 0);
    for (SeqId s : live) {
      const auto table = t.block_table(s);  // kept alive through the loop
      ASSERT_TRUE(table.ok());
      for (int32_t p : *table) ++owners[static_cast<size_t>(p)];
    }
    for (int64_t p = 0; p < P; ++p) ASSERT_LE(owners[static_cast<size_t>(p)], 1) << "page " << p;
  }
}

TEST(PageTable, ReservationsAreAllOrNothing) {
  PageTable t(2, 16, 10);
  const SeqId a = *t.add_sequence(), b = *t.add_sequence();
  const uint64_t v0 = t.version();
  ASSERT_TRUE(t.reserve(a, 100).ok());  // 7 pages
  EXPECT_EQ(t.free_pages(), 3);
  EXPECT_GT(t.version(), v0);
  EXPECT_EQ(t.reserve(b, 49).code(), StatusCode::kResourceExhausted);  // needs 4 pages
  EXPECT_EQ(t.reserve(b, std::numeric_limits<int64_t>::max()).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(t.free_pages(), 3);
  EXPECT_EQ(t.block_table(b)->size(), 0u);
  ASSERT_TRUE(t.reserve(a, 12).ok());  // fits in the 7th page: no new page
  EXPECT_EQ(t.free_pages(), 3);
  EXPECT_EQ(t.mark_written(0, a, 113).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.mark_written(0, a, 112).ok());
  EXPECT_EQ(*t.tokens(0, a), 112);
  EXPECT_EQ(*t.length(a), 0);  // layer 1 wrote nothing
  EXPECT_EQ(t.mark_written(2, a, 1).code(), StatusCode::kOutOfRange);
  // The Result must outlive the loop (a range-for over *temporary dangles; ASan saw it).
  const auto table_a = t.block_table(a);
  ASSERT_TRUE(table_a.ok());
  for (int32_t p : *table_a) EXPECT_EQ(t.page_owner(p), a);
  ASSERT_TRUE(t.release_sequence(a).ok());
  EXPECT_EQ(t.free_pages(), 10);
  EXPECT_FALSE(t.has_sequence(a));
  EXPECT_EQ(t.sequences(), std::vector<SeqId>{b});
  EXPECT_EQ(t.page_owner(0), -1);
  EXPECT_EQ(t.page_owner(-5), -1);
}

}  // namespace
}  // namespace cisa
