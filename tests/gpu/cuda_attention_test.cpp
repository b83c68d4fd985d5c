// GPU paged attention against the CPU engine (cisa::attend) on the same page lists: dense plans
// (with and without a sliding window, split-KV decode) and CISA plans (lists from the GPU's
// selection), head dims 64/128/256, several GQA ratios. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#ifdef CISA_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cisa/cpu/attention.h"
#include "cisa/cpu/selection.h"
#include "cuda/plan_impl.h"
#include "cuda/tile_sizes.cuh"
#include "gpu/gpu_test_util.h"
#include "gpu/plan_shares_util.h"
#include "test_util.h"

namespace cisa::test {
namespace {

struct World {
  std::unique_ptr<PagedKvCache> cache;
  std::vector<BatchEntry> batch;
  std::vector<float> q;      // [rows][hq][d], values exactly representable in bf16
  std::vector<uint16_t> qh;  // the same in bf16
  int hq = 0;
  int64_t rows = 0;
};

World make_world(int hkv, int hq, int d, const std::vector<int64_t>& lengths,
                 const std::vector<BatchEntry>& batch, std::mt19937& rng) {
  World w;
  int64_t total = 0;
  for (auto n : lengths) total += n / 16 + 2;
  w.cache = *PagedKvCache::create({.num_layers = 1,
                                   .num_kv_heads = hkv,
                                   .head_dim = d,
                                   .page_size = 16,
                                   .num_pages = total + 4,
                                   .dtype = KvDtype::kBF16});
  for (size_t i = 0; i < lengths.size(); ++i)
    EXPECT_EQ(*w.cache->add_sequence(), static_cast<SeqId>(i));
  std::vector<int64_t> done(lengths.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t n = std::min<int64_t>(lengths[i] - done[i], 16 * (1 + rng() % 9));
      if (n <= 0) continue;
      append_random(*w.cache, static_cast<SeqId>(i), n, rng);
      done[i] += n;
      more = true;
    }
  }
  w.batch = batch;
  w.hq = hq;
  for (auto& b : batch) w.rows += b.count;
  // Scale 2 makes the softmax peaked enough that masking and page errors show.
  w.q = random_vec(rng, static_cast<size_t>(w.rows * hq * d), 2.0f);
  for (auto& x : w.q) {
    w.qh.push_back(f32_to_bf16(x));
    x = bf16_to_f32(w.qh.back());
  }
  return w;
}

// P is rounded to bf16 before P·V (relative error ≤ 2^-9 per weight) and V is exact, so each
// output element is off by at most ~2^-8·max|v| in the worst case; the L2 error, a sum of
// independent roundings, sits far below. lse comes from f32 scores of exact bf16 products.
void expect_close(const World& w, const std::vector<float>& want_out,
                  const std::vector<float>& want_lse, const std::vector<float>& out,
                  const std::vector<float>& lse) {
  ASSERT_EQ(want_out.size(), out.size());
  double err2 = 0, ref2 = 0, max_err = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << "output element " << i << " is NaN (unwritten?)";
    const double e = std::fabs(static_cast<double>(out[i]) - want_out[i]);
    max_err = std::max(max_err, e);
    err2 += e * e;
    ref2 += static_cast<double>(want_out[i]) * want_out[i];
  }
  // max|v| of N(0,1) values over the test sizes stays below 6.
  EXPECT_LT(max_err, 6.0 * std::ldexp(1.0, -8));
  EXPECT_LT(std::sqrt(err2 / ref2), 4e-3) << "relative L2 error";
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_FALSE(std::isnan(lse[i])) << "lse " << i;
    ASSERT_NEAR(lse[i], want_lse[i], 1e-3 * (1 + std::fabs(want_lse[i]))) << "lse " << i;
  }
}

// Runs the GPU plan's attention on w's queries into outputs poisoned with NaN; *out_h, *lse_h:
// what it wrote.
void attend_on_device(const World& w, const DeviceMirror& m, const cuda::Plan& plan,
                      std::vector<float>* out_h, std::vector<float>* lse_h) {
  const int d = w.cache->head_dim();
  DevVec<uint16_t> dq;
  dq.upload(w.qh);
  DevVec<float> out(static_cast<size_t>(w.rows * w.hq * d)),
      lse(static_cast<size_t>(w.rows * w.hq));
  out.poison();
  lse.poison();
  const Status run =
      cuda::run_attention(plan, m.layer, dq.data(), 0.0f, out.data(), lse.data(), nullptr);
  ASSERT_TRUE(run.ok()) << run.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  *out_h = out.download();
  *lse_h = lse.download();
}

// Runs the GPU plan's attention and the CPU's on the GPU's lists; compares.
void run_and_compare(const World& w, const DeviceMirror& m, const cuda::Plan& plan,
                     int64_t window) {
  std::vector<float> out, lse;
  ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out, &lse));
  PageLists lists;
  ASSERT_TRUE(cuda::download_page_lists(plan, &lists).ok());
  std::vector<float> want_out(out.size()), want_lse(lse.size());
  ThreadPool pool(2);
  AttentionWorkspace ws;
  auto st = attend(*w.cache, 0, w.batch, lists, w.q.data(), w.hq, {.sliding_window = window},
                   want_out.data(), want_lse.data(), pool, &ws);
  ASSERT_TRUE(st.ok()) << st.to_string();
  expect_close(w, want_out, want_lse, out, lse);
}

// A sparse plan end to end: the union lists poisoned, selection on the device index queries diq,
// attention against the CPU (run_and_compare); *read: the pages its attention reads.
void select_attend_and_compare(const World& w, const DeviceMirror& m, const DevVec<float>& diq,
                               const cuda::Plan& plan, int64_t* read) {
  auto* P = plan.impl();
  cudaMemset(P->d_upages.as<void>(), 0xff, P->d_upages.bytes());
  cudaMemset(P->d_uchunks.as<void>(), 0xff, P->d_uchunks.bytes());
  ASSERT_TRUE(cuda::run_select(plan, m.layer, diq.data(), nullptr).ok());
  run_and_compare(w, m, plan, 0);
  ASSERT_TRUE(cuda::count_read_pages(plan, read).ok());
}

// A dense plan's lists must be exactly chunks lo/16 … last/16 of each entry (lo = first − window
// + 1 with a window, else 0) with pages from the block table: checked on their own, since the
// attention comparison runs the CPU on the lists downloaded from the GPU.
void expect_dense_lists(const World& w, const cuda::Plan& plan, int64_t window) {
  PageLists lists;
  ASSERT_TRUE(cuda::download_page_lists(plan, &lists).ok());
  ASSERT_EQ(lists.groups.size(), w.batch.size());
  for (size_t gi = 0; gi < lists.groups.size(); ++gi) {
    const auto& b = w.batch[static_cast<size_t>(lists.groups[gi].entry)];
    const int64_t c0 = (window > 0 ? std::max<int64_t>(0, b.first - window + 1) : 0) / 16;
    const int64_t c1 = (b.first + b.count - 1) / 16;
    const auto table = *w.cache->block_table(b.seq);
    for (int kv = 0; kv < w.cache->num_kv_heads(); ++kv) {
      const auto c = lists.list_chunks(static_cast<int64_t>(gi), kv);
      const auto p = lists.list_pages(static_cast<int64_t>(gi), kv);
      ASSERT_EQ(static_cast<int64_t>(c.size()), c1 - c0 + 1) << "group " << gi << " kv " << kv;
      for (size_t i = 0; i < c.size(); ++i) {
        ASSERT_EQ(c[i], c0 + static_cast<int64_t>(i))
            << "group " << gi << " kv " << kv << " entry " << i;
        ASSERT_EQ(p[i], table[static_cast<size_t>(c[i])])
            << "group " << gi << " kv " << kv << " entry " << i;
      }
    }
  }
}

struct Shape {
  int hkv, hq, d;
  std::string name() const {
    return "hkv=" + std::to_string(hkv) + " hq=" + std::to_string(hq) + " d=" + std::to_string(d);
  }
};

// Four decode entries (one query row each). The 40,000-token entry is split into more than 32
// parts (2,500 pages / kMinSplitPages): a merge reads the split LSEs in two passes of 32 lanes.
World decode_world(const Shape& sh, std::mt19937& rng) {
  return make_world(sh.hkv, sh.hq, sh.d, {5000, 3001, 12000, 40000},
                    {{0, 4999, 1}, {1, 3000, 1}, {2, 11999, 1}, {3, 39999, 1}}, rng);
}

// A CISA plan with selection p, or a dense one (no window), of w's batch with `opt`.
Status plan_decode(const World& w, const DeviceMirror& m, bool sparse, const SelectionParams& p,
                   const cuda::PlanOptions& opt, cuda::Plan* plan) {
  return sparse ? cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, plan, opt)
                : cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, 0, plan, opt);
}

TEST(CudaAttention, DenseMatchesCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (Shape sh : {Shape{1, 4, 128}, Shape{2, 8, 64}, Shape{1, 32, 128}, Shape{2, 4, 256}}) {
    SCOPED_TRACE("hkv=" + std::to_string(sh.hkv) + " hq=" + std::to_string(sh.hq) +
                 " d=" + std::to_string(sh.d));
    // Prefill blocks (one crossing a page boundary mid-block), decode entries (split-KV).
    auto w = make_world(sh.hkv, sh.hq, sh.d, {5000, 1200, 3333, 40},
                        {{0, 4999, 1}, {1, 1000, 200}, {2, 3300 - 37, 33}, {3, 0, 40}}, rng);
    DeviceMirror m;
    m.build(*w.cache, 0, 4);
    // Mixed tiles (PlanOptions::mixed_tiles): entries 1, 2 and 3 (over 64 rows in every shape)
    // take 128-row tiles in a first launch, the decode entry (h_g rows) 64-row tiles in a second.
    for (const bool mixed : {false, true})
      for (int64_t window : {int64_t{0}, int64_t{100}}) {
        SCOPED_TRACE("window " + std::to_string(window) + (mixed ? ", mixed tiles" : ""));
        cuda::Plan plan;
        ASSERT_TRUE(cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, window, &plan,
                                     {.mixed_tiles = mixed})
                        .ok());
        // 128-row prefill tiles at d = 128 run on the wgmma kernel (attention_wgmma.cu).
        const bool wgmma = cuda::tiles::kWgmmaAttention && sh.d == 128;
        EXPECT_EQ(plan.impl()->wgmma, wgmma);
        EXPECT_EQ(plan.impl()->big_tasks > 0, mixed);  // the decode entry's group has h_g rows
        EXPECT_EQ(plan.impl()->wgmma_big, mixed && wgmma);
        ASSERT_TRUE(cuda::run_select(plan, m.layer, nullptr, nullptr).ok());
        expect_dense_lists(w, plan, window);
        run_and_compare(w, m, plan, window);
      }
  }
}

TEST(CudaAttention, SparseMatchesCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(9);
  for (Shape sh : {Shape{1, 4, 128}, Shape{2, 8, 64}, Shape{1, 32, 128}, Shape{1, 4, 256}}) {
    for (int64_t G : {4, 32}) {
      SCOPED_TRACE("hkv=" + std::to_string(sh.hkv) + " hq=" + std::to_string(sh.hq) +
                   " d=" + std::to_string(sh.d) + " G=" + std::to_string(G));
      SelectionParams p{.budget = 40, .window = 8, .qshare = G, .sink_pages = 1};
      const int64_t split = (p.budget + p.window + p.sink_pages + 1) * 16;
      // 102 queries: the last QShare group of entry 0 is partial (a ragged union member at G = 4).
      auto w = make_world(sh.hkv, sh.hq, sh.d, {split + 3002, split + 500, split + 64},
                          {{0, split + 2900, 102}, {1, split - 50, 130}, {2, split + 63, 1}}, rng);
      DeviceMirror m;
      m.build(*w.cache, 0, 3);
      auto iq = random_vec(rng, static_cast<size_t>(w.rows * sh.hkv * sh.d));
      DevVec<float> diq;
      diq.upload(iq);
      // Lists of at most 16 rows are attended in unions of groups (KV-outer) unless switched off;
      // every path must match the CPU on the same lists. Union tasks run on mma.sync by default
      // and, with PlanOptions::wgmma_unions at d = 128, on the wgmma kernel's paired tiles
      // (beside the plain tasks of the same launch). Entry 1's dense group has 200 rows, so this
      // batch takes 8-warp blocks for every task, and the wgmma variant falls back to mma.sync
      // for the whole launch (UnionTasksOnWgmmaMatchCpu runs it in 64-row tiles), unless mixed
      // tiles (PlanOptions::mixed_tiles, variants 3 and 4) give that group a launch of its own.
      const bool small = G * (sh.hq / sh.hkv) <= 16 && sh.d <= cuda::tiles::kUnionMaxHeadDim;
      const bool ws_unions = cuda::tiles::kWgmmaWarpSpecialized && cuda::tiles::kWsPairedTiles;
      for (int variant = 0; variant < 5; ++variant) {
        const bool unions = variant != 2, on_wgmma = variant == 1 || variant == 4,
                   mixed = variant >= 3;
        if ((!unions || on_wgmma) && !small) continue;
        SCOPED_TRACE(std::string(!unions    ? "unions off"
                                 : on_wgmma ? "unions on wgmma"
                                            : "unions on") +
                     (mixed ? ", mixed tiles" : ""));
        cuda::Plan plan;
        ASSERT_TRUE(cuda::plan_sparse(
                        m.layer, m.block_tables(), w.batch, w.hq, p, &plan,
                        {.group_unions = unions, .wgmma_unions = on_wgmma, .mixed_tiles = mixed})
                        .ok());
        EXPECT_EQ(!plan.impl()->unions.empty(), unions && small);
        EXPECT_EQ(plan.impl()->big_tasks > 0, mixed);  // entry 2's decode group has h_g rows
        EXPECT_EQ(plan.impl()->warps, mixed ? 4 : 8);
        EXPECT_EQ(plan.impl()->wgmma,
                  cuda::tiles::kWgmmaAttention && sh.d == 128 &&
                      (!(unions && small) || (on_wgmma && ws_unions && plan.impl()->warps == 4)));
        int64_t read = 0;
        ASSERT_NO_FATAL_FAILURE(select_attend_and_compare(w, m, diq, plan, &read));
        if (unions && small) {
          EXPECT_LT(read, plan.total_pages());
        }
      }
    }
  }
}

// Union tasks on the warp-specialised wgmma kernel's paired 64-row tiles (v10,
// PlanOptions::wgmma_unions), 4:1 at G = 4 and d = 128, in a batch whose groups all fit 64 rows (a
// larger one puts the whole launch on 8-warp mma.sync blocks). The unions: six of 4 members and a
// 3-member one whose last member has 3 queries (entry 0, 107 queries), a 3-member one whose last
// member has 1 (entry 1, after its 64-row dense group), a 2-member one (entry 3); a plain sparse
// task (entry 2, decode) in the same launch; at the larger budget, lists long enough for split-KV.
// Every output row and LSE must match the CPU engine on the same page lists.
TEST(CudaAttention, UnionTasksOnWgmmaMatchCpu) {
  CISA_REQUIRE_GPU();
  if (!cuda::tiles::kWgmmaAttention || !cuda::tiles::kWgmmaWarpSpecialized ||
      !cuda::tiles::kWsPairedTiles)
    GTEST_SKIP() << "built without the warp-specialised wgmma kernel's paired tiles";
  std::mt19937 rng(13);
  for (const int64_t budget : {40, 120}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    SelectionParams p{.budget = budget, .window = 8, .qshare = 4, .sink_pages = 1};
    const int64_t split = (p.budget + p.window + p.sink_pages + 1) * 16;
    auto w = make_world(
        1, 4, 128, {split + 3002, split + 300, split + 64, split + 500},
        {{0, split + 2890, 107}, {1, split - 16, 25}, {2, split + 63, 1}, {3, split + 492, 8}},
        rng);
    DeviceMirror m;
    m.build(*w.cache, 0, 4);
    auto iq = random_vec(rng, static_cast<size_t>(w.rows * 128));
    DevVec<float> diq;
    diq.upload(iq);
    for (const bool on_wgmma : {true, false}) {
      SCOPED_TRACE(on_wgmma ? "unions on wgmma" : "unions on mma.sync");
      cuda::Plan plan;
      ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, &plan,
                                    {.wgmma_unions = on_wgmma})
                      .ok());
      auto* P = plan.impl();
      ASSERT_FALSE(P->unions.empty());
      ASSERT_EQ(P->warps, 4);
      ASSERT_EQ(P->wgmma, on_wgmma);
      int64_t read = 0;
      ASSERT_NO_FATAL_FAILURE(select_attend_and_compare(w, m, diq, plan, &read));
      EXPECT_LT(read, plan.total_pages());
    }
  }
}

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

// PlanOptions::fused_merge: the last split block of each list merges the partials inside the
// attention launch. The merge is the merge launch's own code (merge_row), so outputs and LSEs
// must equal the merge launch's bit for bit, dense and CISA, in every page-split shape, with a
// list of more than 32 splits (two LSE passes); a second and third run check that the tickets
// wrapped back to zero, and the CPU engine checks the fused plan on its own.
TEST(CudaAttention, FusedMergeEqualsMergeLaunch) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(23);
  for (Shape sh : {Shape{1, 4, 128}, Shape{2, 8, 64}, Shape{1, 32, 128}}) {
    SCOPED_TRACE(sh.name());
    auto w = decode_world(sh, rng);
    DeviceMirror m;
    m.build(*w.cache, 0, 4);
    auto iq = random_vec(rng, static_cast<size_t>(w.rows * sh.hkv * sh.d));
    DevVec<float> diq;
    diq.upload(iq);
    // A budget of 192 chunks: lists of ~200 pages split in 3 (tiles::kMinSplitPages), where the
    // 40 of the other decode tests make lists too short to split.
    const SelectionParams p{.budget = 192, .window = 8, .qshare = 1};
    for (const bool sparse : {false, true}) {
      SCOPED_TRACE(sparse ? "cisa" : "dense");
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
        ASSERT_TRUE(cuda::run_select(plan, m.layer, sparse ? diq.data() : nullptr, nullptr).ok());
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
    }
  }
}

// Selection (index queries iq, or none for a dense plan), then attention three times: the same
// bits every run (nothing a launch leaves behind changes the next), and the CPU engine's result
// on the same lists.
void select_run_thrice_and_compare(const World& w, const DeviceMirror& m, const cuda::Plan& plan,
                                   const float* iq) {
  ASSERT_TRUE(cuda::run_select(plan, m.layer, iq, nullptr).ok());
  std::vector<float> out0, lse0;
  ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out0, &lse0));
  for (int i = 0; i < 2; ++i) {
    std::vector<float> out, lse;
    ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out, &lse));
    EXPECT_EQ(out, out0) << "run " << i;
    EXPECT_EQ(lse, lse0) << "run " << i;
  }
  run_and_compare(w, m, plan, 0);
}

// PlanOptions::even_shares: the plan's pages cut into equal shares, one a block, a share that
// crosses a list's end running a task of each list. The tasks must tile every list's pages
// exactly once (block-major slots, unused slots rows = 0), some block must hold two tasks, the
// outputs must match the CPU engine on the same lists, and repeated runs the same bits.
TEST(CudaAttention, EvenSharesMatchCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(31);
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
      ASSERT_NO_FATAL_FAILURE(
          select_run_thrice_and_compare(w, m, plan, sparse ? diq.data() : nullptr));
    }
  }
}

// PlanOptions::sm_rates: shares sized by each SM's rate, a block running the share of a slot of
// the SM it landed on (claimed at its start, counters zeroed by the launch's last block). The
// rates measure_sm_rates returns (one an SM, mean 1), and skewed ones; three runs give the same
// bits (the claims were reset) and the outputs match the CPU engine.
TEST(CudaAttention, EvenSharesBySmRateMatchCpu) {
  CISA_REQUIRE_GPU();
  const int sms = cuda::device_sms();
  std::vector<float> measured;
  ASSERT_TRUE(cuda::measure_sm_rates(&measured, int64_t{1} << 20, 3).ok());
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
      const cuda::PlanOptions opt{.even_shares = true, .sm_rates = *rates};
      ASSERT_TRUE(plan_decode(w, m, sparse, p, opt, &plan).ok());
      ASSERT_TRUE(plan.impl()->sm_claims);
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

// The wgmma kernel (d = 128) and the mma.sync kernel on the same plans: tiles of one warpgroup
// (33–64 rows) and of two (65–128 rows, the second warpgroup partly or wholly past the list's
// rows), dense with and without a window, CISA at G = 16 and 32, GQA 4:1, 8:2 and 32:1. Both
// must match the CPU; the plan must pick wgmma by default.
TEST(CudaAttention, WgmmaAndMmaSyncMatchCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(23);
  for (Shape sh : {Shape{1, 4, 128}, Shape{2, 8, 128}, Shape{1, 32, 128}}) {
    const int hg = sh.hq / sh.hkv;
    SCOPED_TRACE("hkv=" + std::to_string(sh.hkv) + " hq=" + std::to_string(sh.hq));
    // Entry rows at h_g = 4: 64 (one full warpgroup), 36, 100 (second warpgroup partly active),
    // 260 (a 4-row last tile); a decode entry (split-KV partials through the same kernel). All
    // entries start past the CISA plans' dense prefix, so at G = 64 / h_g every tile has ≤ 64 rows
    // (4 warps: one warpgroup per block); dense plans and G = 32 use two.
    auto w =
        make_world(sh.hkv, sh.hq, sh.d, {6000, 2100, 4000, 1000, 3000},
                   {{0, 5984, 16}, {1, 2091, 9}, {2, 3975, 25}, {3, 935, 65}, {4, 2999, 1}}, rng);
    DeviceMirror m;
    m.build(*w.cache, 0, 5);
    auto iq = random_vec(rng, static_cast<size_t>(w.rows * sh.hkv * sh.d));
    DevVec<float> diq;
    diq.upload(iq);
    for (int variant = 0; variant < 4; ++variant) {
      cuda::Plan plan;
      int64_t window = 0;
      if (variant < 2) {
        window = variant == 0 ? 0 : 300;
        ASSERT_TRUE(cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, window, &plan).ok());
        ASSERT_TRUE(cuda::run_select(plan, m.layer, nullptr, nullptr).ok());
      } else {
        SelectionParams p{.budget = 48,
                          .window = 6,
                          .qshare = variant == 2 ? std::max(1, 64 / hg) : 32,
                          .sink_pages = 1};
        ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, &plan).ok());
        ASSERT_TRUE(cuda::run_select(plan, m.layer, diq.data(), nullptr).ok());
      }
      auto* P = plan.impl();
      EXPECT_EQ(P->wgmma, cuda::tiles::kWgmmaAttention) << "variant " << variant;
      EXPECT_EQ(P->warps, variant == 2 ? 4 : 8) << "variant " << variant;
      // 128-row tiles: the warp-specialised kernel (v6), then the v4/v5 kernel
      // (AttentionKernel::kWgmmaV5), then mma.sync.
      for (int mode = 0; mode < 3; ++mode) {
        const bool wg = mode < 2;
        SCOPED_TRACE("variant " + std::to_string(variant) +
                     (mode == 0   ? " wgmma"
                      : mode == 1 ? " wgmma-v5"
                                  : " mma.sync") +
                     " warps " + std::to_string(P->warps));
        P->wgmma = wg;
        P->options.attention_kernel =
            mode == 1 ? cuda::AttentionKernel::kWgmmaV5 : cuda::AttentionKernel::kAuto;
        run_and_compare(w, m, plan, window);
      }
    }
  }
}

// Tasks longer than kSegPages pages stage their page IDs in several passes. The planner splits
// long lists across blocks, so the test rewrites the plan's tasks to one per row tile (all pages,
// no split-KV) to reach ~750 pages per task.
// PlanOptions pick the mainloop at plan time (kMma: never wgmma) and the split target; the plan
// keeps them for run_attention. Every choice must still match the CPU.
TEST(CudaAttention, PlanOptionsChooseKernelAndSplits) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(31);
  auto w = make_world(1, 4, 128, {6000, 3000}, {{0, 5984, 16}, {1, 2999, 1}}, rng);
  DeviceMirror m;
  m.build(*w.cache, 0, 2);
  int64_t default_tasks = 0;
  for (auto kernel : {cuda::AttentionKernel::kAuto, cuda::AttentionKernel::kMma,
                      cuda::AttentionKernel::kWgmmaV5}) {
    for (int blocks_per_sm : {0, 1}) {
      SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)) + " blocks/SM " +
                   std::to_string(blocks_per_sm));
      cuda::Plan plan;
      const cuda::PlanOptions o{.attention_kernel = kernel, .blocks_per_sm = blocks_per_sm};
      ASSERT_TRUE(cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, 0, &plan, o).ok());
      const auto* P = plan.impl();
      EXPECT_EQ(P->options.attention_kernel, kernel);
      if (kernel == cuda::AttentionKernel::kMma) {
        EXPECT_FALSE(P->wgmma);
      }
      const auto tasks = static_cast<int64_t>(P->tasks.size());
      if (blocks_per_sm == 0 && kernel == cuda::AttentionKernel::kAuto) default_tasks = tasks;
      if (blocks_per_sm == 1) {
        EXPECT_LE(tasks, default_tasks) << "fewer splits with a lower target";
      }
      ASSERT_TRUE(cuda::run_select(plan, m.layer, nullptr, nullptr).ok());
      run_and_compare(w, m, plan, 0);
    }
  }
}

TEST(CudaAttention, LongTasksMatchCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(17);
  for (Shape sh : {Shape{1, 4, 128}, Shape{2, 8, 64}}) {
    SCOPED_TRACE("hkv=" + std::to_string(sh.hkv) + " d=" + std::to_string(sh.d));
    auto w = make_world(sh.hkv, sh.hq, sh.d, {12000, 9000}, {{0, 11936, 64}, {1, 8999, 1}}, rng);
    DeviceMirror m;
    m.build(*w.cache, 0, 2);
    cuda::Plan plan;
    ASSERT_TRUE(cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, 0, &plan).ok());
    ASSERT_TRUE(cuda::run_select(plan, m.layer, nullptr, nullptr).ok());
    auto* P = plan.impl();
    std::vector<cuda::detail::AttnTask> whole;
    int64_t max_pages = 0;
    for (const auto& t : P->tasks) {
      if (!whole.empty() && whole.back().list == t.list && whole.back().row0 == t.row0) {
        whole.back().page1 = t.page1;
      } else {
        whole.push_back(t);
        whole.back().partial = -1;
      }
      max_pages = std::max(max_pages, whole.back().page1 - whole.back().page0);
    }
    ASSERT_GT(max_pages, cuda::tiles::kSegPages);
    P->tasks = whole;
    P->merges.clear();
    CUDA_OK(cudaMemcpy(P->d_tasks, whole.data(), whole.size() * sizeof(whole[0]),
                       cudaMemcpyHostToDevice));
    run_and_compare(w, m, plan, 0);
  }
}

// The run step replayed from a CUDA graph gives bit-identical results to a direct run.
TEST(CudaAttention, GraphReplayMatchesDirectRun) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(13);
  SelectionParams p{.budget = 30, .window = 4, .qshare = 8};
  auto w = make_world(1, 4, 128, {4000, 4000}, {{0, 3900, 64}, {1, 3999, 1}}, rng);
  DeviceMirror m;
  m.build(*w.cache, 0, 2);
  cuda::Plan plan;
  ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, &plan).ok());
  auto iq = random_vec(rng, static_cast<size_t>(w.rows * 128));
  DevVec<float> diq;
  diq.upload(iq);
  DevVec<uint16_t> dq;
  dq.upload(w.qh);
  const size_t n = static_cast<size_t>(w.rows * w.hq * 128);
  DevVec<float> out1(n), out2(n), lse1(n / 128), lse2(n / 128);
  out1.poison();
  out2.poison();
  ASSERT_TRUE(cuda::run_select(plan, m.layer, diq.data(), nullptr).ok());
  ASSERT_TRUE(
      cuda::run_attention(plan, m.layer, dq.data(), 0.0f, out1.data(), lse1.data(), nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ASSERT_TRUE(cuda::run_select(plan, m.layer, diq.data(), stream).ok());
  ASSERT_TRUE(
      cuda::run_attention(plan, m.layer, dq.data(), 0.0f, out2.data(), lse2.data(), stream).ok());
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(out1.download(), out2.download());
  EXPECT_EQ(lse1.download(), lse2.download());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// f32 queries (run_attention's float overload, which the model backend uses) give the results of
// their bf16 copy bit for bit, on every kernel: mma.sync, wgmma and the warp-specialised wgmma,
// dense and CISA plans, prefill tiles and decode rows. The values are not representable in bf16,
// so the rounding on load is exercised (ties to even included: host f32_to_bf16 is the rule).
TEST(CudaAttention, F32QueriesMatchTheirBf16Copy) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(29);
  auto w = make_world(2, 8, 128, {3000, 2100}, {{0, 2800, 200}, {1, 2099, 1}}, rng);
  std::vector<float> q32 = random_vec(rng, w.q.size(), 2.0f);
  q32[3] = bf16_to_f32(0x3f80) + std::ldexp(1.0f, -8);  // 1 + half an ulp of bf16: a tie
  q32[5] = -q32[3];
  std::vector<uint16_t> qh;
  for (float x : q32) qh.push_back(f32_to_bf16(x));
  DeviceMirror m;
  m.build(*w.cache, 0, 2);
  DevVec<float> dq32, diq;
  dq32.upload(q32);
  DevVec<uint16_t> dqh;
  dqh.upload(qh);
  diq.upload(random_vec(rng, static_cast<size_t>(w.rows * 2 * 128)));
  const size_t n = q32.size();
  for (const auto kernel : {cuda::AttentionKernel::kAuto, cuda::AttentionKernel::kMma,
                            cuda::AttentionKernel::kWgmmaV5}) {
    for (const bool sparse : {false, true}) {
      SCOPED_TRACE(std::string(sparse ? "cisa" : "dense") + ", kernel " +
                   std::to_string(static_cast<int>(kernel)));
      cuda::Plan plan;
      const cuda::PlanOptions opt{.attention_kernel = kernel};
      const Status planned =
          plan_decode(w, m, sparse, {.budget = 40, .window = 4, .qshare = 16}, opt, &plan);
      ASSERT_TRUE(planned.ok()) << planned.to_string();
      // Dense plans assemble their page lists in run_select's setup stage too.
      ASSERT_TRUE(cuda::run_select(plan, m.layer, sparse ? diq.data() : nullptr, nullptr).ok());
      DevVec<float> out1(n), out2(n), lse1(n / 128), lse2(n / 128);
      out1.poison();
      out2.poison();
      ASSERT_TRUE(
          cuda::run_attention(plan, m.layer, dqh.data(), 0.0f, out1.data(), lse1.data(), nullptr)
              .ok());
      ASSERT_TRUE(
          cuda::run_attention(plan, m.layer, dq32.data(), 0.0f, out2.data(), lse2.data(), nullptr)
              .ok());
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> a = out1.download(), b = out2.download();
      ASSERT_FALSE(std::any_of(a.begin(), a.end(), [](float x) { return std::isnan(x); }));
      EXPECT_EQ(a, b);
      EXPECT_EQ(lse1.download(), lse2.download());
    }
  }
  // A misaligned f32 pointer is refused, not read.
  cuda::Plan plan;
  ASSERT_TRUE(cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, 0, &plan).ok());
  DevVec<float> out(n);
  EXPECT_EQ(cuda::run_attention(plan, m.layer, dq32.data() + 1, 0.0f, out.data(), nullptr, nullptr)
                .code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cisa::test
#endif

// Argument checks run without a device: they fail before any CUDA call.
#ifdef CISA_WITH_CUDA
#include "cisa/cuda/backend.h"
TEST(CudaBackendErrors, BadInputsGiveClearStatuses) {
  const int32_t* fake = reinterpret_cast<const int32_t*>(16);
  const uint16_t* fk = reinterpret_cast<const uint16_t*>(16);
  std::vector<int64_t> off = {0, 10};
  cisa::cuda::DeviceBlockTables tables{fake, off};
  cisa::cuda::DeviceLayer layer{fk, fk, nullptr, 100, 1, 96, 16, cisa::RepKind::kMean};
  std::vector<cisa::BatchEntry> batch = {{0, 0, 16}};
  cisa::cuda::Plan plan;
  auto st = cisa::cuda::plan_dense(layer, tables, batch, 4, 0, &plan);
  EXPECT_EQ(st.code(), cisa::StatusCode::kUnimplemented) << st.to_string();
  layer.head_dim = 128;
  layer.page_size = 32;
  EXPECT_EQ(cisa::cuda::plan_dense(layer, tables, batch, 4, 0, &plan).code(),
            cisa::StatusCode::kUnimplemented);
  layer.page_size = 16;
  batch[0].seq = 3;
  EXPECT_EQ(cisa::cuda::plan_dense(layer, tables, batch, 4, 0, &plan).code(),
            cisa::StatusCode::kNotFound);
  batch[0] = {0, 150, 20};  // past the 10 pages of the table
  EXPECT_EQ(cisa::cuda::plan_dense(layer, tables, batch, 4, 0, &plan).code(),
            cisa::StatusCode::kOutOfRange);
  batch[0] = {0, 0, 16};
  EXPECT_EQ(cisa::cuda::plan_dense(layer, tables, batch, 0, 0, &plan).code(),
            cisa::StatusCode::kInvalidArgument);
  EXPECT_EQ(cisa::cuda::plan_sparse(layer, tables, batch, 4, {.budget = 8}, &plan).code(),
            cisa::StatusCode::kInvalidArgument);  // no representative pointer
  EXPECT_EQ(cisa::cuda::plan_sparse(layer, tables, batch, 4, {.budget = -1}, &plan).code(),
            cisa::StatusCode::kInvalidArgument);
  // Planner switches out of range are refused, whichever plan they are given to.
  for (cisa::cuda::PlanOptions bad :
       {cisa::cuda::PlanOptions{.blocks_per_sm = -1},
        cisa::cuda::PlanOptions{.blocks_per_sm = 1025}, cisa::cuda::PlanOptions{.ws_copy_warps = 2},
        cisa::cuda::PlanOptions{.score_tiles_per_block = -1},
        cisa::cuda::PlanOptions{.score_tiles_per_block = 1025}}) {
    st = cisa::cuda::plan_dense(layer, tables, batch, 4, 0, &plan, bad);
    EXPECT_EQ(st.code(), cisa::StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("PlanOptions::"), std::string::npos) << st.message();
  }
  layer.k = nullptr;
  EXPECT_EQ(cisa::cuda::plan_dense(layer, tables, batch, 4, 0, &plan).code(),
            cisa::StatusCode::kInvalidArgument);
}
#else
TEST(CudaAttention, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without the CUDA backend)";
}
#endif
