// GPU decode attention (page-split plans: the warps of a block split each tile's pages) against
// the CPU engine on the same page lists: decode batches, the merge fused into the attention
// launch, shares of equal size or sized by each SM's rate, and tasks across page-ID segments.
#include <gtest/gtest.h>

#ifdef CISA_WITH_CUDA
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/tile_sizes.cuh"
#include "gpu/attention_world.h"
#include "gpu/plan_shares_util.h"

namespace cisa::test {
namespace {

// Decode-only batches (≤ 32 rows per list) let the warps of a block split each tile's pages
// (page_warps 4 or 2) and merge their softmax states at the end; dense and CISA plans.
TEST(CudaAttention, DecodeBatchesMatchCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(19);
  for (Shape sh :
       {Shape{1, 4, 128}, Shape{2, 8, 64}, Shape{1, 32, 128}, Shape{1, 16, 64}, Shape{1, 4, 256}}) {
    const int hg = sh.hq / sh.hkv;
    const int want_pw = sh.d > cuda::tiles::kPageSplitMaxHeadDim ? 1 : hg <= 16 ? 4 : 2;
    SCOPED_TRACE(sh.name());
    auto w = decode_world(sh, rng);
    DeviceMirror m;
    m.build(*w.cache, 0, 4);
    {
      cuda::Plan plan;
      ASSERT_TRUE(cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, 0, &plan).ok());
      EXPECT_EQ(plan.impl()->page_warps, want_pw);
      ASSERT_TRUE(cuda::run_select(plan, m.layer, nullptr, nullptr).ok());
      expect_dense_lists(w, plan, 0);  // the 40,000-token entry spans two assembly blocks
      run_and_compare(w, m, plan, 0);
    }
    SelectionParams p{.budget = 40, .window = 8, .qshare = 1};
    cuda::Plan plan;
    ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, &plan).ok());
    EXPECT_EQ(plan.impl()->page_warps, want_pw);
    // Page-split plans never hold more tasks than the split target (no partial extra wave).
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    EXPECT_LE(static_cast<int64_t>(plan.impl()->tasks.size()),
              int64_t{sms} * cuda::tiles::kDecodeBlocksPerSm);
    auto iq = random_vec(rng, static_cast<size_t>(w.rows * sh.hkv * sh.d));
    DevVec<float> diq;
    diq.upload(iq);
    ASSERT_TRUE(cuda::run_select(plan, m.layer, diq.data(), nullptr).ok());
    run_and_compare(w, m, plan, 0);
  }
}

// The cases of the split-plan tests: three page-split shapes (decode_world), each with its mirror
// and random index queries, a budget of 192 chunks (lists of ~200 pages split in 3,
// tiles::kMinSplitPages, where the 40 of DecodeBatchesMatchCpu make lists too short to split);
// f(w, m, sparse, p, iq) runs on the dense plan's case (iq null) and then the CISA plan's.
template <class F>
void for_split_decode_cases(uint32_t seed, F&& f) {
  std::mt19937 rng(seed);
  for (Shape sh : {Shape{1, 4, 128}, Shape{2, 8, 64}, Shape{1, 32, 128}}) {
    SCOPED_TRACE(sh.name());
    auto w = decode_world(sh, rng);
    DeviceMirror m;
    m.build(*w.cache, 0, 4);
    auto iq = random_vec(rng, static_cast<size_t>(w.rows * sh.hkv * sh.d));
    DevVec<float> diq;
    diq.upload(iq);
    const SelectionParams p{.budget = 192, .window = 8, .qshare = 1};
    for (const bool sparse : {false, true}) {
      SCOPED_TRACE(sparse ? "cisa" : "dense");
      f(w, m, sparse, p, sparse ? diq.data() : nullptr);
    }
  }
}

// PlanOptions::fused_merge: the last split block of each list merges the partials inside the
// attention launch. The merge is the merge launch's own code (merge_row), so outputs and LSEs
// must equal the merge launch's bit for bit, dense and CISA, in every page-split shape, with a
// list of more than 32 splits (two LSE passes); a second and third run check that the tickets
// wrapped back to zero, and the CPU engine checks the fused plan on its own.
TEST(CudaAttention, FusedMergeEqualsMergeLaunch) {
  CISA_REQUIRE_GPU();
  for_split_decode_cases(23, [](const World& w, const DeviceMirror& m, bool sparse,
                                const SelectionParams& p, const float* iq) {
    const auto run = [&](bool fused, int runs, std::vector<float>* out_h,
                         std::vector<float>* lse_h) {
      cuda::Plan plan;
      const cuda::PlanOptions opt{.fused_merge = fused};
      ASSERT_TRUE(plan_decode(w, m, sparse, p, opt, &plan).ok());
      const auto* P = plan.impl();
      ASSERT_GT(P->page_warps, 1);
      ASSERT_FALSE(P->merges.empty());
      EXPECT_EQ(P->fused_merge, fused);
      EXPECT_EQ(plan.kernels().find("split merge in the last split block") != std::string::npos,
                fused);
      if (!sparse) {
        EXPECT_TRUE(std::any_of(P->merges.begin(), P->merges.end(), [](const auto& mt) {
          return mt.splits > 32;
        })) << "a list of more than 32 splits";
      }
      ASSERT_TRUE(cuda::run_select(plan, m.layer, iq, nullptr).ok());
      for (int i = 0; i < runs; ++i) {
        std::vector<float> out, lse;
        ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out, &lse));
        if (i == 0) {
          *out_h = out;
          *lse_h = lse;
        } else {
          EXPECT_EQ(out, *out_h) << "run " << i;
          EXPECT_EQ(lse, *lse_h) << "run " << i;
        }
      }
      if (fused) run_and_compare(w, m, plan, 0);
    };
    std::vector<float> out0, lse0, out1, lse1;
    ASSERT_NO_FATAL_FAILURE(run(false, 1, &out0, &lse0));
    ASSERT_NO_FATAL_FAILURE(run(true, 3, &out1, &lse1));
    ASSERT_EQ(out0.size(), out1.size());
    EXPECT_EQ(0, std::memcmp(out0.data(), out1.data(), out0.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(lse0.data(), lse1.data(), lse0.size() * sizeof(float)));
  });
}

// PlanOptions::even_shares: the plan's pages cut into equal shares, one a block, a share that
// crosses a list's end running a task of each list. The tasks must tile every list's pages
// exactly once (block-major slots, unused slots rows = 0), some block must hold two tasks, the
// outputs must match the CPU engine on the same lists, and repeated runs the same bits.
TEST(CudaAttention, EvenSharesMatchCpu) {
  CISA_REQUIRE_GPU();
  for_split_decode_cases(31, [](const World& w, const DeviceMirror& m, bool sparse,
                                const SelectionParams& p, const float* iq) {
    cuda::Plan plan;
    const cuda::PlanOptions opt{.even_shares = true};
    ASSERT_TRUE(plan_decode(w, m, sparse, p, opt, &plan).ok());
    const auto* P = plan.impl();
    ASSERT_GT(P->page_warps, 1);
    ASSERT_GT(P->tasks_per_block, 1) << "a share crossing a list's end";
    EXPECT_NE(plan.kernels().find("even shares"), std::string::npos);
    ASSERT_EQ(P->tasks.size() % static_cast<size_t>(P->tasks_per_block), 0u);
    // Every list's pages covered once, in order, by its tasks; equal shares.
    const auto shares = slot_shares(*P);
    const auto [lo, hi] = std::minmax_element(shares.begin(), shares.end());
    EXPECT_LE(*hi - *lo, 1) << "equal shares";
    ASSERT_NO_FATAL_FAILURE(select_run_thrice_and_compare(w, m, plan, iq));
  });
}

// PlanOptions::even_shares with fused_merge: the last task of each split list merges inside the
// launch, where a block can run two tasks. The same partial boundaries and merge code as the
// even-shares plan's merge launch, so the same bits; three runs (the tickets wrap back to zero)
// and the CPU engine check the fused plan on its own.
TEST(CudaAttention, EvenSharesFusedMergeEqualsMergeLaunch) {
  CISA_REQUIRE_GPU();
  for_split_decode_cases(41, [](const World& w, const DeviceMirror& m, bool sparse,
                                const SelectionParams& p, const float* iq) {
    std::vector<float> out[2], lse[2];
    for (const bool fused : {false, true}) {
      cuda::Plan plan;
      const cuda::PlanOptions opt{.fused_merge = fused, .even_shares = true};
      ASSERT_TRUE(plan_decode(w, m, sparse, p, opt, &plan).ok());
      const auto* P = plan.impl();
      ASSERT_GT(P->tasks_per_block, 1) << "a share crossing a list's end";
      ASSERT_FALSE(P->merges.empty());
      EXPECT_EQ(P->fused_merge, fused);
      EXPECT_EQ(plan.kernels().find("split merge in the last split block") != std::string::npos,
                fused);
      ASSERT_TRUE(cuda::run_select(plan, m.layer, iq, nullptr).ok());
      ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out[fused], &lse[fused]));
      if (fused) {
        ASSERT_NO_FATAL_FAILURE(select_run_thrice_and_compare(w, m, plan, iq));
      }
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * sizeof(float)));
  });
}

// measure_sm_rates refuses its bad arguments before it touches a device.
TEST(CudaAttention, MeasureSmRatesRefusesBadArguments) {
  std::vector<float> r;
  EXPECT_EQ(cuda::measure_sm_rates(nullptr).code(), StatusCode::kInvalidArgument);
  for (const int64_t pages : {int64_t{-1}, int64_t{63}, int64_t{4097}, int64_t{1} << 40})
    EXPECT_EQ(cuda::measure_sm_rates(&r, pages).code(), StatusCode::kInvalidArgument) << pages;
  for (const int repeats : {0, 1001})
    EXPECT_EQ(cuda::measure_sm_rates(&r, 264, repeats).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.empty());
}

// PlanOptions::sm_rates: shares sized by each SM's rate, a block running the share of a slot of
// the SM it landed on (claimed at its start, counters zeroed by the launch's last block). The
// rates measure_sm_rates returns (one an SM, mean 1: attention timed block by block), and skewed
// ones with the merge inside the launch; three runs give the same bits (the claims were reset) and
// the outputs match the CPU engine.
TEST(CudaAttention, EvenSharesBySmRateMatchCpu) {
  CISA_REQUIRE_GPU();
  const int sms = cuda::device_sms();
  std::vector<float> measured;
  ASSERT_TRUE(cuda::measure_sm_rates(&measured, 64, 3).ok());
  ASSERT_EQ(measured.size(), static_cast<size_t>(sms));
  double mean = 0.0;
  for (float r : measured) {
    EXPECT_GT(r, 0.2f);
    EXPECT_LT(r, 5.0f);
    mean += r / sms;
  }
  EXPECT_NEAR(mean, 1.0, 1e-3);
  std::vector<float> skewed(static_cast<size_t>(sms));
  for (int s = 0; s < sms; ++s)
    skewed[static_cast<size_t>(s)] = 1.0f + 0.5f * static_cast<float>(s % 3);
  std::mt19937 rng(37);
  // 4 x 80,000 tokens: 20,000 pages, more than kMinSplitPages a block slot.
  auto w = make_world(1, 4, 128, {80000, 80000, 80000, 80000},
                      {{0, 79999, 1}, {1, 79999, 1}, {2, 79999, 1}, {3, 79999, 1}}, rng);
  DeviceMirror m;
  m.build(*w.cache, 0, 4);
  auto iq = random_vec(rng, static_cast<size_t>(w.rows * 128));
  DevVec<float> diq;
  diq.upload(iq);
  const SelectionParams p{.budget = 4500, .window = 8, .qshare = 1};
  for (const auto* rates : {&measured, &skewed}) {
    for (const bool sparse : {false, true}) {
      SCOPED_TRACE(std::string(rates == &measured ? "measured" : "skewed") +
                   (sparse ? " cisa" : " dense"));
      cuda::Plan plan;
      // The skewed rates with the merge inside the launch (fused_merge), the measured without.
      const bool fused = rates == &skewed;
      const cuda::PlanOptions opt{.fused_merge = fused, .even_shares = true, .sm_rates = *rates};
      ASSERT_TRUE(plan_decode(w, m, sparse, p, opt, &plan).ok());
      ASSERT_TRUE(plan.impl()->sm_claims);
      EXPECT_EQ(plan.impl()->fused_merge, fused);
      EXPECT_NE(plan.kernels().find("even shares by SM rate"), std::string::npos);
      ASSERT_NO_FATAL_FAILURE(
          select_run_thrice_and_compare(w, m, plan, sparse ? diq.data() : nullptr));
    }
  }
}

// Page-split (decode) tasks longer than one page-ID segment (kSegPages), as the planner makes
// them: the pipeline restarts mid-task and the last tile of each segment is ragged (zero-filled
// rows). LongTasksMatchCpu covers the row-tile kernel; the benchmark's dense decode tasks are
// 4,096 pages (8 segments) on this one. PlanOptions::blocks_per_sm = 1 makes 70 lists one task
// each.
TEST(CudaAttention, DecodeTasksAcrossSegmentsMatchCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(29);
  std::vector<int64_t> lengths;
  std::vector<BatchEntry> batch;
  for (int i = 0; i < 70; ++i) {
    lengths.push_back(16 * (cuda::tiles::kSegPages + 1) + 37 * i);  // 513 … 675 pages
    batch.push_back({i, lengths.back() - 1, 1});
  }
  auto w = make_world(1, 4, 64, lengths, batch, rng);
  DeviceMirror m;
  m.build(*w.cache, 0, 70);
  cuda::Plan plan;
  ASSERT_TRUE(
      cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, 0, &plan, {.blocks_per_sm = 1})
          .ok());
  const auto* P = plan.impl();
  ASSERT_EQ(P->page_warps, 4);
  int64_t longest = 0;
  for (const auto& t : P->tasks) longest = std::max<int64_t>(longest, t.page1 - t.page0);
  ASSERT_GT(longest, cuda::tiles::kSegPages) << "no task crosses a page-ID segment";
  ASSERT_TRUE(cuda::run_select(plan, m.layer, nullptr, nullptr).ok());
  run_and_compare(w, m, plan, 0);
}

}  // namespace
}  // namespace cisa::test
#else
TEST(CudaDecodeAttention, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without the CUDA backend)";
}
#endif
