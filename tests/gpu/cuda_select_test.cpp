// GPU selection path against the CPU engine: representatives (bit-exact), index queries and
// scores (f32 tolerance), top-k with the tie rule and the assembled page lists (exact sets).
#include <gtest/gtest.h>

#ifdef CISA_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cisa/cpu/selection.h"
#include "cuda/plan_impl.h"
#include "gpu/gpu_test_util.h"
#include "test_util.h"

namespace cisa::test {
namespace {

struct Inputs {
  std::unique_ptr<PagedKvCache> cache;
  std::vector<BatchEntry> batch;
  std::vector<float> index_q;  // [rows][H][d]
};

// Sequences grown in interleaved rounds, so one sequence's physical pages are scattered.
Inputs make_setup(int hkv, int d, RepKind rep, const std::vector<int64_t>& lengths,
                  const std::vector<BatchEntry>& batch, std::mt19937& rng,
                  RepPrecision prec = RepPrecision::kNative) {
  Inputs s;
  int64_t total = 0;
  for (auto n : lengths) total += n / 16 + 2;
  s.cache = *PagedKvCache::create({.num_layers = 1,
                                   .num_kv_heads = hkv,
                                   .head_dim = d,
                                   .page_size = 16,
                                   .num_pages = total + 8,
                                   .dtype = KvDtype::kBF16,
                                   .rep = rep,
                                   .rep_precision = prec});
  for (size_t i = 0; i < lengths.size(); ++i)
    EXPECT_EQ(*s.cache->add_sequence(), static_cast<SeqId>(i));
  std::vector<int64_t> done(lengths.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t n = std::min<int64_t>(lengths[i] - done[i], 16 * (1 + rng() % 7));
      if (n <= 0) continue;
      append_random(*s.cache, static_cast<SeqId>(i), n, rng);
      done[i] += n;
      more = true;
    }
  }
  s.batch = batch;
  int64_t rows = 0;
  for (auto& b : batch) rows += b.count;
  s.index_q = random_vec(rng, static_cast<size_t>(rows * hkv * d));
  return s;
}

TEST(CudaReps, MatchCpuBitExact) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (RepKind rep : {RepKind::kMean, RepKind::kQuest})
    for (int d : {64, 128, 256}) {
      SCOPED_TRACE(std::string(rep_kind_name(rep)) + " d=" + std::to_string(d));
      auto s = make_setup(2, d, rep, {700, 333}, {{0, 0, 1}}, rng);
      DeviceMirror m;
      m.build(*s.cache, 0, 2, /*copy_reps=*/false);
      std::vector<int32_t> full;
      for (SeqId q = 0; q < 2; ++q) {
        auto t = *s.cache->block_table(q);
        const int64_t n_full = *s.cache->length(q) / 16;
        full.insert(full.end(), t.begin(), t.begin() + n_full);
      }
      DevVec<int32_t> pages;
      pages.upload(full);
      ASSERT_TRUE(
          cuda::run_update_reps(m.layer, pages.data(), static_cast<int64_t>(full.size()), nullptr)
              .ok());
      CUDA_OK(cudaDeviceSynchronize());
      auto got = m.reps.download();
      const int rw = s.cache->rep_width();
      for (int32_t p : full)
        for (int g = 0; g < 2; ++g) {
          auto* want = static_cast<const uint16_t*>(s.cache->rep(0, p, g));
          const uint16_t* have = got.data() + (static_cast<size_t>(p) * 2 + g) * rw;
          ASSERT_EQ(0, std::memcmp(want, have, rw * 2)) << "page " << p << " head " << g;
        }
    }
}

// int8 representatives built on the device from the keys: code · 2^e equals the CPU cache's
// value (quantize_rep of the f32 representative, stored exactly in bf16) for every channel, codes
// lie in [−127, 127], the exponent byte e lies in [−126, 127] and is the smallest that fits
// (some |code| ≥ 64).
TEST(CudaReps, Int8MatchCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (RepKind rep : {RepKind::kMean, RepKind::kQuest})
    for (int d : {64, 128, 256}) {
      SCOPED_TRACE(std::string(rep_kind_name(rep)) + " d=" + std::to_string(d));
      auto s = make_setup(2, d, rep, {700, 333}, {{0, 0, 1}}, rng, RepPrecision::kInt8);
      DeviceMirror m;
      m.build(*s.cache, 0, 2);
      ASSERT_FALSE(m.full_pages.empty());
      const auto codes = m.codes.download();
      const auto exps = m.exps.download();
      const int rw = s.cache->rep_width();
      for (int32_t p : m.full_pages)
        for (int g = 0; g < 2; ++g) {
          const size_t r = static_cast<size_t>(p) * 2 + static_cast<size_t>(g);
          const int e = exps[r];
          ASSERT_GE(e, kMinRepScaleExp);
          const float sc = std::ldexp(1.0f, e);
          auto* want = static_cast<const uint16_t*>(s.cache->rep(0, p, g));
          int top = 0;
          for (int i = 0; i < rw; ++i) {
            const int c = static_cast<int8_t>(codes[r * static_cast<size_t>(rw) + i]);
            ASSERT_LE(std::abs(c), 127);
            top = std::max(top, std::abs(c));
            ASSERT_EQ(static_cast<float>(c) * sc, bf16_to_f32(want[i]))
                << "page " << p << " head " << g << " channel " << i;
          }
          EXPECT_GE(top, 64) << "page " << p << " head " << g << ": a smaller scale would fit";
        }
    }
}

// Selected chunks implied by the GPU's own scores under the CPU's select_topk.
void expect_lists_consistent(const Inputs& s, const SelectionParams& p, const PageLists& gpu,
                             const std::vector<float>& scores,
                             const std::vector<int64_t>& score_off) {
  PageLists cpu;
  ThreadPool pool(2);
  ASSERT_TRUE(select_pages(*s.cache, 0, s.batch, s.index_q.data(), p, &pool, &cpu).ok());
  ASSERT_EQ(cpu.groups.size(), gpu.groups.size());
  for (size_t i = 0; i < cpu.groups.size(); ++i) {
    EXPECT_EQ(cpu.groups[i].first, gpu.groups[i].first);
    EXPECT_EQ(cpu.groups[i].last, gpu.groups[i].last);
    EXPECT_EQ(cpu.groups[i].row, gpu.groups[i].row);
    EXPECT_EQ(cpu.groups[i].dense, gpu.groups[i].dense);
  }
  ASSERT_EQ(cpu.offsets, gpu.offsets);
  EXPECT_EQ(cpu.num_selected, gpu.num_selected);
  const int H = s.cache->num_kv_heads(), d = s.cache->head_dim();
  std::vector<int32_t> top, tmp;
  int64_t boundary_swaps = 0;
  for (int64_t L = 0; L < cpu.num_lists(); ++L) {
    const auto& grp = cpu.groups[static_cast<size_t>(L / H)];
    const int g = static_cast<int>(L % H);
    auto gp = gpu.list_pages(L / H, g);
    auto gc = gpu.list_chunks(L / H, g);
    auto cp = cpu.list_pages(L / H, g);
    auto cc = cpu.list_chunks(L / H, g);
    if (grp.dense || cpu.num_selected[static_cast<size_t>(L)] == 0) {
      EXPECT_TRUE(std::equal(cp.begin(), cp.end(), gp.begin())) << "dense list " << L;
      EXPECT_TRUE(std::equal(cc.begin(), cc.end(), gc.begin())) << "dense list " << L;
      continue;
    }
    // Scores: GPU vs CPU score_chunks on the CPU's index query (bit-identical q̄ by construction).
    std::vector<float> qbar(static_cast<size_t>(d), 0.0f);
    const int64_t r1 = grp.row + (grp.last - grp.first);
    const int64_t r0 = p.qshare_query == QShareQuery::kMean ? grp.row : r1;
    for (int64_t r = r0; r <= r1; ++r)
      for (int i = 0; i < d; ++i)
        qbar[static_cast<size_t>(i)] += s.index_q[static_cast<size_t>((r * H + g) * d + i)];
    const float inv = 1.0f / static_cast<float>(r1 - r0 + 1);
    for (auto& x : qbar) x *= inv;
    const int64_t e0 = p.sink_pages, e1 = grp.first / 16 - p.window;
    std::vector<float> want(static_cast<size_t>(e1 - e0));
    auto table = *s.cache->block_table(s.batch[static_cast<size_t>(grp.entry)].seq);
    score_chunks(*s.cache, 0, table, g, qbar.data(), e0, e1 - e0, want.data());
    std::span<const float> have(scores.data() + score_off[static_cast<size_t>(L)],
                                static_cast<size_t>(score_off[static_cast<size_t>(L) + 1] -
                                                    score_off[static_cast<size_t>(L)]));
    ASSERT_EQ(have.size(), want.size());
    const bool quest = s.cache->config().rep == RepKind::kQuest;
    for (size_t j = 0; j < want.size(); ++j) {
      // |error| of an f32 sum of d products is below d·2^-24·Σ|q_i r_i|; bound Σ|q_i r_i| by
      // Σ|q_i|·max|r|.
      double mag = 0;
      const auto* r =
          static_cast<const uint16_t*>(s.cache->rep(0, table[static_cast<size_t>(e0) + j], g));
      for (int i = 0; i < d; ++i) {
        double rmax = std::fabs(bf16_to_f32(r[i]));
        if (quest) rmax = std::max(rmax, static_cast<double>(std::fabs(bf16_to_f32(r[d + i]))));
        mag += std::fabs(qbar[static_cast<size_t>(i)]) * rmax;
      }
      const double tol =
          2.0 * d * std::ldexp(1.0, -24) * mag / std::sqrt(static_cast<double>(d)) + 1e-30;
      ASSERT_FALSE(std::isnan(have[j])) << "list " << L << " chunk " << j;
      ASSERT_NEAR(have[j], want[j], tol) << "list " << L << " chunk " << j;
    }
    // Exact: the GPU's selection is the spec's top-k of the GPU's scores.
    select_topk(have, p.budget, &top, &tmp);
    std::vector<int32_t> expect_chunks;
    for (int64_t j = 0; j < p.sink_pages; ++j) expect_chunks.push_back(static_cast<int32_t>(j));
    for (int32_t j : top) expect_chunks.push_back(static_cast<int32_t>(e0 + j));
    for (int64_t j = e1; j <= grp.last / 16; ++j) expect_chunks.push_back(static_cast<int32_t>(j));
    ASSERT_EQ(expect_chunks.size(), gc.size());
    for (size_t i = 0; i < gc.size(); ++i) {
      ASSERT_EQ(expect_chunks[i], gc[i]) << "list " << L << " entry " << i;
      ASSERT_EQ(table[static_cast<size_t>(gc[i])], gp[i]) << "list " << L << " entry " << i;
    }
    // Against the CPU's own selection: a difference is allowed only between chunks whose CPU
    // scores lie within the score tolerance of each other (a near-tie at the k-th place).
    std::vector<int32_t> a(cc.begin(), cc.end()), b(gc.begin(), gc.end()), only_cpu, only_gpu;
    std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_cpu));
    std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(only_gpu));
    ASSERT_EQ(only_cpu.size(), only_gpu.size());
    for (size_t i = 0; i < only_cpu.size(); ++i) {
      const float x = want[static_cast<size_t>(only_cpu[i] - e0)],
                  y = want[static_cast<size_t>(only_gpu[i] - e0)];
      EXPECT_NEAR(x, y, 1e-4f * (1 + std::fabs(x))) << "list " << L;
    }
    boundary_swaps += static_cast<int64_t>(only_cpu.size());
  }
  ::testing::Test::RecordProperty("boundary_swaps", static_cast<int>(boundary_swaps));
}

// Runs the plan's selection on the device index queries iq with everything it writes poisoned
// first, then checks its lists and scores with expect_lists_consistent; hands them back in gpu
// and scores.
void run_and_check_lists(const Inputs& s, const SelectionParams& p, DeviceMirror& m,
                         const float* iq, const cuda::Plan& plan, PageLists* gpu,
                         std::vector<float>* scores) {
  auto* P = plan.impl();
  cudaMemset(P->d_pages.as<void>(), 0xff, P->d_pages.bytes());
  cudaMemset(P->d_chunks.as<void>(), 0xff, P->d_chunks.bytes());
  cudaMemset(P->d_scores.as<void>(), 0xff, P->d_scores.bytes());
  ASSERT_TRUE(cuda::run_select(plan, m.layer, iq, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(cuda::download_page_lists(plan, gpu).ok());
  std::vector<int64_t> off;
  ASSERT_TRUE(cuda::download_scores(plan, scores, &off).ok());
  expect_lists_consistent(s, p, *gpu, *scores, off);
}

// Runs the plan's selection and compares its lists with the CPU engine's, entry by entry;
// *gpu and *cpu hold both for a caller that names the first difference.
void run_and_compare_with_cpu(const Inputs& s, const SelectionParams& p, DeviceMirror& m,
                              const float* iq, const cuda::Plan& plan, PageLists* gpu,
                              PageLists* cpu) {
  ASSERT_TRUE(cuda::run_select(plan, m.layer, iq, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(cuda::download_page_lists(plan, gpu).ok());
  ThreadPool pool(1);
  ASSERT_TRUE(select_pages(*s.cache, 0, s.batch, s.index_q.data(), p, &pool, cpu).ok());
  EXPECT_EQ(cpu->offsets, gpu->offsets);
  EXPECT_EQ(cpu->pages, gpu->pages) << "budget " << p.budget;
  EXPECT_EQ(cpu->chunks, gpu->chunks) << "budget " << p.budget;
}

struct Case {
  int hkv, d;
  RepKind rep;
  SelectionParams p;
};

// Prefill and mixed batches: the tensor-core (mean, d ≤ 128), tiled (quest, d = 256) and few-list
// scoring kernels, both top-k paths, against the CPU engine, with representatives of precision
// `prec` in both caches.
void random_inputs_match_cpu(RepPrecision prec) {
  std::mt19937 rng(23);
  const std::vector<Case> cases = {
      {1, 128, RepKind::kMean, {.budget = 32, .window = 8, .qshare = 16}},
      {2, 64, RepKind::kMean, {.budget = 20, .window = 4, .qshare = 4, .sink_pages = 2}},
      {2,
       128,
       RepKind::kQuest,
       {.budget = 40, .window = 8, .qshare = 32, .qshare_query = QShareQuery::kLast}},
      {1, 256, RepKind::kMean, {.budget = 64, .window = 16, .qshare = 1}},
      // Mean representatives at d ≤ 128 with more than 8 lists per stream take score_regs_kernel;
      // G = 3 gives streams of ~70 lists: two shared-memory query passes, the second partial.
      {2, 128, RepKind::kMean, {.budget = 48, .window = 8, .qshare = 3}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("hkv=" + std::to_string(c.hkv) + " d=" + std::to_string(c.d) +
                 " G=" + std::to_string(c.p.qshare));
    // Entry 0: prefill deep in the sparse region; entry 1 straddles the dense/sparse split;
    // entry 2: one decode query; entry 3: dense only.
    const int64_t split = (c.p.budget + c.p.window + c.p.sink_pages + 1) * 16;
    auto s = make_setup(
        c.hkv, c.d, c.rep, {3000 + split, split + 400, split + 2000, 200},
        {{0, 2900 + split - 77, 77}, {1, split - 90, 300}, {2, split + 1999, 1}, {3, 120, 50}}, rng,
        prec);
    DeviceMirror m;
    m.build(*s.cache, 0, 4);
    DevVec<float> iq;
    iq.upload(s.index_q);
    // Top-k on the one-block kernel, then staged (v7, the default).
    for (const bool staged : {false, true}) {
      SCOPED_TRACE(staged ? "top-k staged" : "top-k one block");
      cuda::Plan plan;
      ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), s.batch, 4 * c.hkv, c.p, &plan,
                                    {.topk_staged = staged})
                      .ok());
      EXPECT_EQ(plan.impl()->topk_staged, staged);
      EXPECT_GT(plan.selected_lists(), 0);
      PageLists gpu;
      std::vector<float> scores;
      ASSERT_NO_FATAL_FAILURE(run_and_check_lists(s, c.p, m, iq.data(), plan, &gpu, &scores));
    }
  }
}

TEST(CudaSelect, MatchesCpuOnRandomInputs) {
  CISA_REQUIRE_GPU();
  random_inputs_match_cpu(RepPrecision::kNative);
}

// int8 representatives (RepPrecision::kInt8): the device's codes and scales (built by the update
// kernel from the keys) score against the CPU cache's code · 2^e values.
TEST(CudaSelect, Int8MatchesCpuOnRandomInputs) {
  CISA_REQUIRE_GPU();
  random_inputs_match_cpu(RepPrecision::kInt8);
}

// Lists long enough that staging takes several rounds (8 keys a thread, 8,192 a block a round):
// a prefill batch in groups of 16 at the end of a 150,000-token sequence and a decode query of an
// 80,000-token one, top-k staged (v7) and on the one-block kernel, against the spec's top-k of the
// GPU's scores and the CPU's selection.
TEST(CudaSelect, TopkStagedOnLongLists) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(41);
  const int64_t n = 150000;
  const SelectionParams p{.budget = 600, .window = 8, .qshare = 16, .sink_pages = 2};
  auto s = make_setup(1, 64, RepKind::kMean, {n, 80000}, {{0, n - 96, 95}, {1, 79999, 1}}, rng);
  DeviceMirror m;
  m.build(*s.cache, 0, 2);
  DevVec<float> iq;
  iq.upload(s.index_q);
  for (const bool staged : {true, false}) {
    SCOPED_TRACE(staged ? "top-k staged" : "top-k one block");
    cuda::Plan plan;
    ASSERT_TRUE(
        cuda::plan_sparse(m.layer, m.block_tables(), s.batch, 4, p, &plan, {.topk_staged = staged})
            .ok());
    EXPECT_EQ(plan.impl()->topk_staged, staged);  // ~9,370 chunks a list: one block a list
    EXPECT_EQ(plan.selected_lists(), 7);          // 6 prefill groups and the decode query
    PageLists gpu;
    std::vector<float> scores;
    ASSERT_NO_FATAL_FAILURE(run_and_check_lists(s, p, m, iq.data(), plan, &gpu, &scores));
  }
}

// Decode lists long enough for the register clusters of top-k (topk.cu, clusters of 8 blocks of
// 512 threads, 16 keys a thread): a 600,000-token sequence (37,500 chunks: slices of ~4,700 keys,
// in registers, topk_cluster.cuh) and a 1,100,000-token one (68,750 chunks: slices over 8,192 keys,
// so its cluster takes the radix select from global memory), in one launch.
TEST(CudaSelect, TopkClustersOnLongDecodeLists) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(43);
  const std::vector<int64_t> len = {600000, 1100000};
  const SelectionParams p{.budget = 2000, .window = 64, .qshare = 1, .sink_pages = 1};
  auto s = make_setup(1, 64, RepKind::kMean, len, {{0, len[0] - 1, 1}, {1, len[1] - 1, 1}}, rng,
                      RepPrecision::kInt8);
  DeviceMirror m;
  m.build(*s.cache, 0, 2);
  DevVec<float> iq;
  iq.upload(s.index_q);
  cuda::Plan plan;
  ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), s.batch, 4, p, &plan).ok());
  EXPECT_GT(plan.impl()->topk_clusters, 0);
  EXPECT_EQ(plan.selected_lists(), 2);
  PageLists gpu;
  std::vector<float> scores;
  ASSERT_NO_FATAL_FAILURE(run_and_check_lists(s, p, m, iq.data(), plan, &gpu, &scores));
}

// Decode batches (one query per sequence, one list per score stream) take the few-lists score
// kernel with one list in registers, then either top-k path (one block per list: these lists are
// short; or a cluster per list); spans of 500–1,300 eligible chunks cover several of its
// 512-chunk tiles and a partial last tile, scored a tile a block or 2 and 3 tiles a block (the
// tile loop, PlanOptions::score_tiles_per_block). With mean representatives they also take the
// fused selection (select_fused.cu) at the cluster size the planner picks and at forced sizes 1, 4
// and 16, whose scores and lists must equal the two-kernel path's bit for bit.
void decode_batch_matches_cpu(RepPrecision prec) {
  std::mt19937 rng(31);
  const std::vector<Case> cases = {
      {1, 128, RepKind::kMean, {.budget = 200, .window = 8, .qshare = 1}},
      {2, 64, RepKind::kMean, {.budget = 37, .window = 4, .qshare = 1, .sink_pages = 3}},
      {2, 128, RepKind::kQuest, {.budget = 64, .window = 16, .qshare = 1}},
      {1, 256, RepKind::kQuest, {.budget = 500, .window = 8, .qshare = 1}},
      {2, 256, RepKind::kMean, {.budget = 900, .window = 8, .qshare = 1}},
  };
  struct Variant {
    const char* name;
    cuda::PlanOptions options;
    bool iq_unaligned = false;  // index queries 4 bytes off 16: q̄ by the index-query kernel
  };
  const std::vector<Variant> variants = {
      {"two kernels, top-k one block per list", {.topk_staged = false}},
      {"two kernels, q̄ from the index-query kernel", {.topk_staged = false}, true},
      {"two kernels, top-k in clusters", {.topk_cluster_min_scores = 0}},
      {"two kernels, top-k staged (v7, the default)", {}},
      {"two kernels, 2 score tiles a block", {.score_tiles_per_block = 2}},
      {"two kernels, 3 score tiles a block", {.score_tiles_per_block = 3}},
      {"fused, planner's cluster", {.fused_select_cluster = -1}},
      {"fused, cluster 1", {.fused_select_cluster = 1}},
      {"fused, cluster 4", {.fused_select_cluster = 4}},
      {"fused, cluster 16", {.fused_select_cluster = 16}},
  };
  for (const auto& c : cases) {
    const std::vector<int64_t> len = {9000, 16 * 1300 + 5, 16 * 700, 12345};
    std::vector<BatchEntry> batch;
    for (size_t i = 0; i < len.size(); ++i) batch.push_back({static_cast<SeqId>(i), len[i] - 1, 1});
    auto s = make_setup(c.hkv, c.d, c.rep, len, batch, rng, prec);
    DeviceMirror m;
    m.build(*s.cache, 0, static_cast<int>(len.size()));
    DevVec<float> iq, iq_off;
    iq.upload(s.index_q);
    std::vector<float> shifted(s.index_q.size() + 1, 7.0f);
    std::copy(s.index_q.begin(), s.index_q.end(), shifted.begin() + 1);
    iq_off.upload(shifted);
    PageLists first;
    std::vector<float> first_scores;
    for (const auto& v : variants) {
      SCOPED_TRACE(std::string("decode hkv=") + std::to_string(c.hkv) + " d=" +
                   std::to_string(c.d) + " k=" + std::to_string(c.p.budget) + ", " + v.name);
      cuda::Plan plan;
      ASSERT_TRUE(
          cuda::plan_sparse(m.layer, m.block_tables(), s.batch, 4 * c.hkv, c.p, &plan, v.options)
              .ok());
      auto* P = plan.impl();
      ASSERT_EQ(P->max_stream_lists, 1);
      const int forced = v.options.fused_select_cluster;
      if (c.rep == RepKind::kQuest || forced == 0)
        EXPECT_EQ(P->fused_cluster, 0);
      else if (forced > 0)
        EXPECT_EQ(P->fused_cluster, forced);
      else
        EXPECT_GT(P->fused_cluster, 0);
      PageLists gpu;
      std::vector<float> scores;
      ASSERT_NO_FATAL_FAILURE(run_and_check_lists(
          s, c.p, m, v.iq_unaligned ? iq_off.data() + 1 : iq.data(), plan, &gpu, &scores));
      if (&v == &variants.front()) {
        first = gpu;
        first_scores = scores;
        continue;
      }
      EXPECT_EQ(gpu.pages, first.pages);
      EXPECT_EQ(gpu.chunks, first.chunks);
      ASSERT_EQ(scores.size(), first_scores.size());
      EXPECT_EQ(0, std::memcmp(scores.data(), first_scores.data(), scores.size() * sizeof(float)))
          << "scores differ from the two-kernel path's";
    }
  }
}

TEST(CudaSelect, DecodeBatchMatchesCpu) {
  CISA_REQUIRE_GPU();
  decode_batch_matches_cpu(RepPrecision::kNative);
}

// The decode kernels on int8 representatives: the few-list scoring kernel, the fused selection
// and (cuda_selection_reuse_test) the reuse check, 16 codes a lane instead of 8 bf16 values.
TEST(CudaSelect, Int8DecodeBatchMatchesCpu) {
  CISA_REQUIRE_GPU();
  decode_batch_matches_cpu(RepPrecision::kInt8);
}

// One sequence of n tokens (keys k, n·d of them; random values) in a one-layer, one-KV-head bf16
// cache of 16-token pages, with `queries` random index queries; *seq names the sequence.
void one_sequence(const std::vector<float>& k, int64_t n, int d, int64_t queries, std::mt19937& rng,
                  Inputs* s, SeqId* seq, RepPrecision prec = RepPrecision::kNative) {
  auto cache = *PagedKvCache::create({.num_layers = 1,
                                      .num_kv_heads = 1,
                                      .head_dim = d,
                                      .page_size = 16,
                                      .num_pages = n / 16 + 4,
                                      .dtype = KvDtype::kBF16,
                                      .rep_precision = prec});
  *seq = *cache->add_sequence();
  ASSERT_TRUE(cache->reserve(*seq, n).ok());
  const auto v = random_vec(rng, static_cast<size_t>(n * d));
  ASSERT_TRUE(cache->append(0, *seq, n, k.data(), v.data()).ok());
  s->cache = std::move(cache);
  s->index_q = random_vec(rng, static_cast<size_t>(queries * d));
}

// Keys drawn from 3 patterns make representatives repeat exactly, so scores tie exactly in both
// engines; a few pages hold NaN keys (NaN scores), a few an infinite channel (±inf scores). The
// lists must equal the CPU's, entry by entry.
void ties_and_nan_follow_the_spec_order(RepPrecision prec) {
  std::mt19937 rng(5);
  const int d = 64;
  const int64_t n = 300 * 16;
  auto patterns = random_vec(rng, 3 * d);
  std::vector<float> k(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t page = t / 16;
    const int pat = static_cast<int>((page * 7) % 3);
    for (int i = 0; i < d; ++i)
      k[static_cast<size_t>(t * d + i)] =
          page % 37 == 5             ? std::numeric_limits<float>::quiet_NaN()
          : page % 41 == 7 && i == 3 ? std::numeric_limits<float>::infinity()  // ±inf scores
                                     : patterns[static_cast<size_t>(pat * d + i)];
  }
  Inputs s;
  SeqId seq = 0;
  ASSERT_NO_FATAL_FAILURE(one_sequence(k, n, d, 160, rng, &s, &seq, prec));
  DeviceMirror m;
  m.build(*s.cache, 0, 1);
  // 64 queries in groups of 16 (4 lists per score stream: few-lists kernel), 160 (10 lists: the
  // prefill kernel, tensor cores with its f32 path for non-finite representatives), then one
  // decode query (one list).
  // The decode query also runs the fused selection (select_fused.cu).
  // Each also takes top-k on the one-block kernel, staged (v7) and in register clusters (v8,
  // whose slices of ~37 keys here put the tied keys of the threshold in several blocks).
  for (int64_t count : {64, 160, 1})
    // 0: one block; 1: staged (v7); 2: fused selection; 3: register clusters (v8)
    for (const int variant : {0, 1, 2, 3})
      for (int64_t budget : {10, 97, 150}) {
        const int fused = variant == 2 ? -1 : 0;
        const bool staged = variant == 1, clusters = variant == 3;
        if (fused != 0 && count != 1) continue;
        SCOPED_TRACE("queries " + std::to_string(count) + (fused ? ", fused selection" : "") +
                     (staged ? ", top-k staged" : "") + (clusters ? ", top-k clusters" : ""));
        s.batch = {{seq, n - count, static_cast<int32_t>(count)}};
        SelectionParams p{.budget = budget, .window = 8, .qshare = 16};
        cuda::PlanOptions options{.topk_staged = staged, .fused_select_cluster = fused};
        if (clusters) options.topk_cluster_min_scores = 0;
        cuda::Plan plan;
        ASSERT_TRUE(
            cuda::plan_sparse(m.layer, m.block_tables(), s.batch, 2, p, &plan, options).ok());
        ASSERT_EQ(plan.impl()->fused_cluster > 0, fused != 0);
        ASSERT_EQ(plan.impl()->topk_staged, staged);
        ASSERT_EQ(plan.impl()->topk_clusters > 0, clusters);
        DevVec<float> iq;
        iq.upload(s.index_q);
        PageLists gpu, cpu;
        ASSERT_NO_FATAL_FAILURE(run_and_compare_with_cpu(s, p, m, iq.data(), plan, &gpu, &cpu));
        // Name the first difference: its list, its place in the list, and the scores of both
        // chunks.
        for (size_t i = 0; i < std::min(cpu.chunks.size(), gpu.chunks.size()); ++i) {
          if (cpu.chunks[i] == gpu.chunks[i]) continue;
          const auto list =
              std::upper_bound(cpu.offsets.begin(), cpu.offsets.end(), static_cast<int64_t>(i)) -
              cpu.offsets.begin() - 1;
          std::vector<float> sc;
          std::vector<int64_t> so;
          ASSERT_TRUE(cuda::download_scores(plan, &sc, &so).ok());
          const auto& g = cpu.groups[static_cast<size_t>(list)];
          const int64_t first = p.sink_pages;  // scores start at the first eligible chunk
          auto score = [&](int32_t c) {
            const int64_t j = so[static_cast<size_t>(list)] + (c - first);
            return j < so[static_cast<size_t>(list) + 1] ? sc[static_cast<size_t>(j)] : NAN;
          };
          ADD_FAILURE() << "first difference at entry " << i << " (list " << list << ", group "
                        << g.first << ".." << g.last << ", entry "
                        << i - static_cast<size_t>(cpu.offsets[static_cast<size_t>(list)])
                        << "): CPU chunk " << cpu.chunks[i] << " (GPU score "
                        << score(cpu.chunks[i]) << "), GPU chunk " << gpu.chunks[i]
                        << " (GPU score " << score(gpu.chunks[i]) << ")";
          break;
        }
      }
}

TEST(CudaSelect, TiesAndNaNFollowTheSpecOrder) {
  CISA_REQUIRE_GPU();
  ties_and_nan_follow_the_spec_order(RepPrecision::kNative);
}

// int8: tied representatives have equal codes and scales; a page with a NaN or an infinite key
// has a NaN scale on the device and NaN values in the CPU cache (core/rep_quant.h), so its
// scores are NaN in both engines.
TEST(CudaSelect, Int8TiesAndNaNFollowTheSpecOrder) {
  CISA_REQUIRE_GPU();
  ties_and_nan_follow_the_spec_order(RepPrecision::kInt8);
}

// Top-k v7 resolves at most tiles::kTopkStagedCandidates keys tied with the threshold's top 16
// bits from their full keys; a list with more falls back to the radix select from global memory.
// Every page here has the same keys, so every score ties and a 6,000-chunk list has 6,000
// candidates: the staged and one-block kernels must both give the spec's order (the smaller
// index first), the CPU's lists, for a prefill batch (many lists) and a decode query.
TEST(CudaSelect, TopkStagedFallsBackOnWideTies) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(17);
  const int d = 64;
  const int64_t n = 6100 * 16;
  const auto pattern = random_vec(rng, d);
  std::vector<float> k(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) std::copy(pattern.begin(), pattern.end(), k.begin() + t * d);
  Inputs s;
  SeqId seq = 0;
  ASSERT_NO_FATAL_FAILURE(one_sequence(k, n, d, 128, rng, &s, &seq));
  DeviceMirror m;
  m.build(*s.cache, 0, 1);
  DevVec<float> iq;
  iq.upload(s.index_q);
  for (const int64_t count : {128, 1})
    for (const bool staged : {false, true}) {
      SCOPED_TRACE("queries " + std::to_string(count) + (staged ? ", staged" : ", one block"));
      s.batch = {{seq, n - count, static_cast<int32_t>(count)}};
      const SelectionParams p{.budget = 300, .window = 8, .qshare = 16};
      cuda::Plan plan;
      ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), s.batch, 2, p, &plan,
                                    {.topk_staged = staged})
                      .ok());
      ASSERT_EQ(plan.impl()->topk_staged, staged);
      PageLists gpu, cpu;
      ASSERT_NO_FATAL_FAILURE(run_and_compare_with_cpu(s, p, m, iq.data(), plan, &gpu, &cpu));
    }
}

}  // namespace
}  // namespace cisa::test

#else
TEST(CudaSelect, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without the CUDA backend)";
}
#endif
