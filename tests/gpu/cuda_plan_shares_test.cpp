// The page-split decode decomposition of PlanOptions::even_shares (plan_attention.cpp), planned
// on the host: no GPU needed (without one the planner assumes 132 SMs, an H100's or H200's count).
// The kernel side (outputs against the CPU engine) is CudaAttention.EvenSharesMatchCpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "cuda/plan_impl.h"
#include "cuda/tile_sizes.cuh"
#include "gpu/plan_shares_util.h"

namespace cisa {
namespace {

// Decode lists as the layer benchmark's 4:1 x 16 geometry has them (1M tokens, k = 4096, W =
// 128): one row of hq / hkv heads per sequence and KV group, `pages` entries a list.
void decode_plan(cuda::Plan::Impl& P, int seqs, int hq, int hkv, const std::vector<int>& pages,
                 const cuda::PlanOptions& opt) {
  P.num_q_heads = hq;
  P.num_kv_heads = hkv;
  P.head_dim = 128;
  P.options = opt;
  P.groups.clear();
  P.lists.clear();
  int64_t out = 0;
  for (int s = 0; s < seqs; ++s) {
    const int32_t pos = 1 << 20;
    P.groups.push_back({.entry = s, .first = pos, .last = pos, .row = s, .dense = false});
    for (int kv = 0; kv < hkv; ++kv) {
      cuda::detail::ListDesc d{};
      d.out_begin = out;
      d.first_pos = d.last_pos = pos;
      d.kv = kv;
      const int n = pages[static_cast<size_t>(s) % pages.size()];
      d.k = std::max(0, n - 9);
      d.post_begin = pos / 16 - (n - d.k) + 1;
      d.post_end = pos / 16 + 1;
      d.reuse_seq = -1;
      out += n;
      P.lists.push_back(d);
    }
  }
}

TEST(CudaPlanShares, EqualSharesTileEveryList) {
  for (const int hq : {4, 32}) {
    SCOPED_TRACE("hq = " + std::to_string(hq));
    cuda::Plan plan;
    auto& P = *plan.impl();
    decode_plan(P, hq == 4 ? 16 : 32, hq, 1, {4105}, {.even_shares = false});
    ASSERT_TRUE(cuda::plan_attention(P).ok());
    ASSERT_GT(P.page_warps, 1);
    EXPECT_EQ(P.tasks_per_block, 1);
    const int sms = cuda::device_sms();
    const auto split_tasks = static_cast<int64_t>(P.tasks.size());
    EXPECT_LT(split_tasks, 2 * sms) << "the split plan leaves block slots empty";

    decode_plan(P, hq == 4 ? 16 : 32, hq, 1, {4105}, {.even_shares = true});
    ASSERT_TRUE(cuda::plan_attention(P).ok());
    ASSERT_EQ(P.tasks_per_block, 2);
    const auto S = static_cast<size_t>(P.tasks_per_block);
    ASSERT_EQ(P.tasks.size(), S * static_cast<size_t>(2 * sms)) << "one share a block slot";
    EXPECT_FALSE(P.fused_merge);
    // Coverage: each list's pages once, in order; equal shares (±1 page).
    std::map<int32_t, std::vector<const cuda::detail::AttnTask*>> by_list;
    const auto shares = slot_shares(P, &by_list);
    const auto [lo, hi] = std::minmax_element(shares.begin(), shares.end());
    EXPECT_LE(*hi - *lo, 1);
    for (const auto& t : P.tasks) EXPECT_TRUE(t.rows == 0 || t.rows == hq);
    // Merges: one a list, its tasks' partial slots s · rows apart in page order, all distinct
    // and inside partial_rows.
    ASSERT_EQ(P.merges.size(), P.lists.size());
    std::vector<bool> used(static_cast<size_t>(P.partial_rows), false);
    for (const auto& M : P.merges) {
      const auto& ts = by_list[M.list];
      ASSERT_EQ(static_cast<size_t>(M.splits), ts.size());
      for (size_t s = 0; s < ts.size(); ++s) {
        EXPECT_EQ(ts[s]->partial, M.partial + static_cast<int64_t>(s) * M.rows);
        EXPECT_EQ(ts[s]->merge, &M - P.merges.data());
        for (int r = 0; r < M.rows; ++r) {
          const auto row = static_cast<size_t>(ts[s]->partial + r);
          ASSERT_LT(row, used.size());
          EXPECT_FALSE(used[row]) << "partial row " << row << " twice";
          used[row] = true;
        }
      }
    }
    EXPECT_TRUE(std::all_of(used.begin(), used.end(), [](bool u) { return u; }));
  }
}

// A list no longer than a share fits one task: no partial, no merge.
TEST(CudaPlanShares, ShortListsWriteTheirOutput) {
  cuda::Plan plan;
  auto& P = *plan.impl();
  // More lists than block slots: the split plan (one task a list) already fills them.
  decode_plan(P, 300, 4, 1, {200}, {.even_shares = true});
  ASSERT_TRUE(cuda::plan_attention(P).ok());
  EXPECT_EQ(P.tasks_per_block, 1);
  // 100 lists of 100 and 700 pages: shares of ~152 pages, so some short lists lie in one block.
  decode_plan(P, 100, 4, 1, {100, 700}, {.even_shares = true});
  ASSERT_TRUE(cuda::plan_attention(P).ok());
  ASSERT_GT(P.tasks_per_block, 1);
  int64_t whole = 0;
  for (const auto& t : P.tasks) {
    if (t.rows == 0) continue;
    const auto& d = P.lists[static_cast<size_t>(t.list)];
    if (t.page1 - t.page0 == list_pages(d)) {
      ++whole;
      EXPECT_EQ(t.partial, -1);
      EXPECT_EQ(t.merge, -1);
    } else {
      EXPECT_GE(t.partial, 0);
      EXPECT_GE(t.merge, 0);
    }
  }
  EXPECT_GT(whole, 0);
}

// PlanOptions::sm_rates: one slot an SM per decode block slot, each sized by its SM's rate; a
// rate vector of the wrong size, or with a non-positive value, leaves equal shares.
TEST(CudaPlanShares, SharesFollowSmRates) {
  const int sms = cuda::device_sms();
  std::vector<float> rates(static_cast<size_t>(sms), 1.0f);
  for (int s = 0; s < sms; s += 5) rates[static_cast<size_t>(s)] = 1.25f;
  cuda::Plan plan;
  auto& P = *plan.impl();
  decode_plan(P, 16, 4, 1, {4105}, {.even_shares = true, .sm_rates = rates});
  P.sm_rates = rates;  // start_plan's copy (decode_plan sets only P.options)
  ASSERT_TRUE(cuda::plan_attention(P).ok());
  ASSERT_TRUE(P.sm_claims);
  const int per_sm = P.slots_per_sm;
  ASSERT_EQ(per_sm, cuda::tiles::kDecodeBlocksPerSm);
  const auto S = static_cast<size_t>(P.tasks_per_block);
  ASSERT_EQ(P.tasks.size(), S * static_cast<size_t>(sms * per_sm));
  double rate_sum = 0.0;
  for (float r : rates) rate_sum += r * per_sm;
  int64_t total = 0;
  for (const auto& d : P.lists) total += list_pages(d);
  const auto shares = slot_shares(P);
  for (size_t b = 0; b < shares.size(); ++b) {
    const double want =
        static_cast<double>(total) * rates[b / static_cast<size_t>(per_sm)] / rate_sum;
    EXPECT_NEAR(static_cast<double>(shares[b]), want, 1.0) << "slot " << b;
  }
  for (const auto& bad : {std::vector<float>(rates.begin(), rates.end() - 1),
                          std::vector<float>(static_cast<size_t>(sms), 0.0f)}) {
    decode_plan(P, 16, 4, 1, {4105}, {.even_shares = true});
    P.sm_rates = bad;
    ASSERT_TRUE(cuda::plan_attention(P).ok());
    EXPECT_FALSE(P.sm_claims);
    EXPECT_EQ(P.tasks_per_block, 2);
  }
}

// Even shares with the fused merge: the same shares, tasks and merges as without it, and the
// last task of each split list merges inside the launch (Plan::Impl::fused_merge).
TEST(CudaPlanShares, FusedMergeKeepsEvenShares) {
  cuda::Plan plan;
  auto& P = *plan.impl();
  decode_plan(P, 16, 4, 1, {4105}, {.even_shares = true});
  ASSERT_TRUE(cuda::plan_attention(P).ok());
  EXPECT_FALSE(P.fused_merge);
  const auto tasks = P.tasks;
  const size_t merges = P.merges.size();
  const int per_block = P.tasks_per_block;
  ASSERT_GT(per_block, 1);
  ASSERT_GT(merges, 0u);
  decode_plan(P, 16, 4, 1, {4105}, {.fused_merge = true, .even_shares = true});
  ASSERT_TRUE(cuda::plan_attention(P).ok());
  EXPECT_TRUE(P.fused_merge);
  EXPECT_EQ(P.tasks_per_block, per_block);
  EXPECT_EQ(P.merges.size(), merges);
  ASSERT_EQ(P.tasks.size(), tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    const auto &a = P.tasks[i], &b = tasks[i];
    EXPECT_TRUE(a.list == b.list && a.rows == b.rows && a.page0 == b.page0 && a.page1 == b.page1 &&
                a.partial == b.partial && a.merge == b.merge)
        << "task " << i;
  }
}

// Where even shares do not apply the split plan is kept: batch invariance, prefill-sized groups
// (no page-split warps) and a list without pages.
TEST(CudaPlanShares, FallsBackToTheSplitPlan) {
  cuda::Plan plan;
  auto& P = *plan.impl();
  const auto split_tasks = [&](cuda::PlanOptions opt, std::vector<int> pages, int hq) {
    opt.even_shares = false;
    decode_plan(P, 16, hq, 1, pages, opt);
    EXPECT_TRUE(cuda::plan_attention(P).ok());
    return P.tasks.size();
  };
  for (const auto& [opt, pages, hq] :
       {std::tuple{cuda::PlanOptions{.batch_invariant = true}, std::vector<int>{4105}, 4},
        std::tuple{cuda::PlanOptions{}, std::vector<int>{4105}, 128},
        std::tuple{cuda::PlanOptions{}, std::vector<int>{4105, 0}, 4}}) {
    const size_t want = split_tasks(opt, pages, hq);
    auto on = opt;
    on.even_shares = true;
    decode_plan(P, 16, hq, 1, pages, on);
    ASSERT_TRUE(cuda::plan_attention(P).ok());
    EXPECT_EQ(P.tasks_per_block, 1);
    EXPECT_EQ(P.tasks.size(), want);
  }
}

}  // namespace
}  // namespace cisa
