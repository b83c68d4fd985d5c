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

#include "cuda/tile_sizes.cuh"
#include "gpu/attention_world.h"

namespace cisa::test {
namespace {

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
    // (and on wgmma as an ordinary launch: PlanOptions::attention_pdl off)
    for (const auto& [on_wgmma, pdl] : {std::pair{true, true}, {true, false}, {false, true}}) {
      SCOPED_TRACE(std::string(on_wgmma ? "unions on wgmma" : "unions on mma.sync") +
                   (pdl ? "" : ", ordinary launch"));
      cuda::Plan plan;
      ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, &plan,
                                    {.wgmma_unions = on_wgmma, .attention_pdl = pdl})
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
  auto iq = random_vec(rng, static_cast<size_t>(w.rows * 128));
  DevVec<float> diq;
  diq.upload(iq);
  DevVec<uint16_t> dq;
  dq.upload(w.qh);
  const size_t n = static_cast<size_t>(w.rows * w.hq * 128);
  uint64_t keys[2] = {};
  std::vector<float> first_out;
  // The attention launch as a programmatic dependent (default) and as an ordinary launch
  // (PlanOptions::attention_pdl off): the same bits, directly and replayed; other launch keys.
  for (const bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "dependent launch" : "ordinary launch");
    cuda::Plan plan;
    ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, &plan,
                                  {.attention_pdl = pdl})
                    .ok());
    keys[pdl] = cuda::plan_launch_key(plan);
    DevVec<float> out1(n), out2(n), lse1(n / 128), lse2(n / 128);
    out1.poison();
    out2.poison();
    ASSERT_TRUE(cuda::run_select(plan, m.layer, diq.data(), nullptr).ok());
    ASSERT_TRUE(
        cuda::run_attention(plan, m.layer, dq.data(), 0.0f, out1.data(), lse1.data(), nullptr)
            .ok());
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
    const auto out = out1.download();
    EXPECT_EQ(out, out2.download());
    EXPECT_EQ(lse1.download(), lse2.download());
    if (pdl)
      first_out = out;
    else
      EXPECT_EQ(out, first_out);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  EXPECT_NE(keys[0], keys[1]);
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
