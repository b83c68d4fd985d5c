// Selection reuse across decode steps (SelectionParams::reuse_steps, docs/design.md) on the GPU.
//
// DecodeListsFollowTheRule: the low-level API (plan_sparse + run_select with a ReuseState) over
// 72 decode steps of 3 sequences and 2 layers, against a host model of the core's rule
// (reuse_allowed, same_selection_sets, newly_eligible, and the CPU's new_chunk_outranks) fed
// with the GPU's own scores of a plain (r = 1) plan of the same step: every page list must equal
// the model's exactly (kept: S from the step that chose it; else the plain plan's fresh top-k),
// and the device counters the model's counts. The reuse check scores chunks with the decode
// score kernel's arithmetic, so the two agree bit for bit and no near-tie allowance is needed.
// A repeated selection (ReuseState::repeat, the re-plan of a first attend) must give the same
// lists and change nothing; a skipped position, a changed budget and a reset sequence must
// select afresh.
//
// The check `mass` runs in the same host model: u1 and u0 from the plain plan's scores in fp64
// as the CPU backend computes them (the device sums in another order, so the test asserts that
// its data leaves no decision within 1e-9 of the threshold).
//
// ModelDecodeWithReuse: a synthetic model on the CUDA backend decodes with r = 4: lists are
// kept (counters), graphs replay it with the same logits as eager launches, and r = 1 given
// explicitly is the default bit for bit; the checks new-chunks and mass are deterministic.
#include <gtest/gtest.h>

#ifdef CISA_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cisa/core/plan.h"
#include "cisa/cpu/selection.h"
#include "cuda/plan_impl.h"
#include "gpu/gpu_test_util.h"
#include "test_util.h"

#if defined(CISA_WITH_CUDA_MODEL)
#include "cisa/core/backend.h"
#include "cisa/cuda/model_backend.h"
#include "cisa/model/model.h"
#endif

namespace cisa::test {
namespace {

constexpr int kB = 16;

// The state and counters the device should hold, kept by the core's rule on the host.
struct HostReuse {
  struct State {
    std::vector<int32_t> chunks;
    int64_t selected_at = -1, last_used = -1;
    SelectionParams params;
    double u0 = 0;  // the check `mass`: the share outside S at a0 (0 under other checks)
  };
  std::map<std::tuple<int, int, int>, State> st;  // (seq slot, layer slot, kv)
  SelectionReuseStats stats;
  int64_t mass_kept = 0, mass_failed = 0;  // `mass` rows past new-chunks: kept, re-selected
};

// Device memory of a ReuseState with `seqs` sequence slots, `layers` layer slots.
struct DeviceReuse {
  DevVec<int32_t> chunks;
  DevVec<cuda::ReuseInfo> info;
  DevVec<int64_t> stats;
  cuda::ReuseState st;
  DeviceReuse(int64_t seqs, int layers, int hkv, int k_stride) {
    const auto slots = static_cast<size_t>(seqs * layers * hkv);
    chunks.resize(slots * static_cast<size_t>(k_stride));
    info.resize(slots);
    stats.resize(4);
    st = {.chunks = chunks.data(),
          .info = info.data(),
          .stats = stats.data(),
          .num_seq_slots = seqs,
          .num_layer_slots = layers,
          .k_stride = k_stride};
  }
  SelectionReuseStats counters() const {
    const auto n = stats.download();
    return {.selected = n[0], .reused = n[1], .checked = n[2], .reselected = n[3]};
  }
};

// run_select captured into a CUDA graph and launched once: the reuse decision's tickets
// (reuse.cuh) are left at zero by every launch, so a replayed step decides as an eager one.
void run_select_in_graph(const cuda::Plan& plan, const cuda::DeviceLayer& layer, const float* iq,
                         const cuda::ReuseState& rs) {
  cudaStream_t st = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  const Status ran = cuda::run_select(plan, layer, iq, st, &rs);
  cudaGraph_t g = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(st, &g);
  ASSERT_TRUE(ran.ok()) << ran.message();
  CUDA_OK(ended);
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  CUDA_OK(cudaGraphLaunch(exec, st));
  CUDA_OK(cudaStreamSynchronize(st));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(st);
}

// One decode step of the batch for one layer slot: the reuse plan's lists against the host
// model; updates the model unless `repeat`.
void check_step(const PagedKvCache& cache, DeviceMirror& m, const std::vector<BatchEntry>& batch,
                const std::vector<int32_t>& slots, const SelectionParams& p, int layer_slot,
                const std::vector<float>& iq_host, DeviceReuse& dr, HostReuse& host, bool repeat,
                int64_t* kept_lists, bool topk_staged = true, bool graph = false,
                int cluster_min = -1) {
  const int H = cache.num_kv_heads();
  DevVec<float> iq;
  iq.upload(iq_host);
  // The plain plan: fresh top-k of every list and the GPU's scores.
  SelectionParams plain_p = p;
  plain_p.reuse_steps = 1;
  cuda::Plan plain;
  ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), batch, H, plain_p, &plain).ok());
  ASSERT_TRUE(cuda::run_select(plain, m.layer, iq.data(), nullptr).ok());
  PageLists fresh;
  ASSERT_TRUE(cuda::download_page_lists(plain, &fresh).ok());
  std::vector<float> scores;
  std::vector<int64_t> off;
  ASSERT_TRUE(cuda::download_scores(plain, &scores, &off).ok());

  cuda::Plan plan;
  ASSERT_TRUE(cuda::plan_sparse(m.layer, m.block_tables(), batch, H, p, &plan,
                                {.topk_cluster_min_scores = cluster_min,
                                 .topk_staged = topk_staged,
                                 .reuse_slots = slots})
                  .ok());
  ASSERT_EQ(plan.impl()->topk_staged, topk_staged && cluster_min != 0);
  cuda::ReuseState rs = dr.st;
  rs.layer_slot = layer_slot;
  rs.repeat = repeat;
  auto* P = plan.impl();
  cudaMemset(P->d_pages.as<void>(), 0xff, P->d_pages.bytes());
  cudaMemset(P->d_chunks.as<void>(), 0xff, P->d_chunks.bytes());
  if (graph) {
    run_select_in_graph(plan, m.layer, iq.data(), rs);
    if (::testing::Test::HasFatalFailure()) return;
  } else {
    ASSERT_TRUE(cuda::run_select(plan, m.layer, iq.data(), nullptr, &rs).ok());
  }
  CUDA_OK(cudaDeviceSynchronize());
  PageLists got;
  ASSERT_TRUE(cuda::download_page_lists(plan, &got).ok());
  ASSERT_EQ(got.offsets, fresh.offsets);

  for (size_t qg = 0; qg < fresh.groups.size(); ++qg) {
    const QueryGroup& grp = fresh.groups[qg];
    const BatchEntry& e = batch[static_cast<size_t>(grp.entry)];
    auto table = *cache.block_table(e.seq);
    for (int g = 0; g < H; ++g) {
      const int64_t L = static_cast<int64_t>(qg) * H + g;
      auto want = fresh.list_chunks(static_cast<int64_t>(qg), g);
      std::vector<int32_t> expect(want.begin(), want.end());
      const int32_t slot = slots[static_cast<size_t>(grp.entry)];
      if (!grp.dense && e.count == 1 && slot >= 0 && p.budget > 0) {
        HostReuse::State& s = host.st[{slot, layer_slot, g}];
        const int64_t a = grp.first;
        bool keep = same_selection_sets(s.params, p);
        if (repeat)
          keep = keep && s.selected_at >= 0 && s.last_used == a;
        else
          keep = keep && reuse_allowed(a, s.selected_at, s.last_used, p);
        bool checked = false;
        const bool mass = p.reuse_check == ReuseCheck::kMass;
        // Scores of the plain plan: chunk j at j − sinks of the list's eligible range.
        const float* sc = scores.data() + off[static_cast<size_t>(L)];
        if (keep && !repeat && p.reuse_check != ReuseCheck::kNone) {
          const ChunkRange n = newly_eligible(s.selected_at, a, kB, p);
          if (n.end > n.begin || mass) {
            checked = true;
            std::vector<float> ks, ns, xs;
            for (int32_t c : s.chunks) ks.push_back(sc[c - p.sink_pages]);
            for (int64_t j = n.begin; j < n.end; ++j) ns.push_back(sc[j - p.sink_pages]);
            keep = !new_chunk_outranks(ks, ns);
            if (mass && keep) {  // u1 as the CPU backend computes it (selection.cpp)
              for (int64_t j = p.sink_pages; j < n.begin; ++j)
                if (in_reuse_mass_sample(j, a) &&
                    !std::binary_search(s.chunks.begin(), s.chunks.end(), static_cast<int32_t>(j)))
                  xs.push_back(sc[j - p.sink_pages]);
              std::vector<float> all = ks;
              all.insert(all.end(), ns.begin(), ns.end());
              all.insert(all.end(), xs.begin(), xs.end());
              const float shift = max_finite_score(all);
              const double in_s = exp_score_sum(ks, shift);
              const double out =
                  exp_score_sum(ns, shift) + double{kReuseMassStride} * exp_score_sum(xs, shift);
              const double u1 = in_s + out > 0 ? out / (in_s + out) : 0.0;
              // The device sums in another order: a margin this small would be a coin toss.
              ASSERT_GT(std::abs(u1 - (s.u0 + p.reuse_mass_slack)), 1e-9)
                  << "a near tie of the mass check in the test's data";
              keep = !(u1 > s.u0 + p.reuse_mass_slack);
              ++(keep ? host.mass_kept : host.mass_failed);
            }
          }
        }
        const size_t sel0 = static_cast<size_t>(p.sink_pages);
        if (keep) {
          std::copy(s.chunks.begin(), s.chunks.end(), expect.begin() + static_cast<long>(sel0));
          if (!repeat) s.last_used = a;
          ++*kept_lists;
        } else if (!repeat) {
          s.chunks.assign(expect.begin() + static_cast<long>(sel0),
                          expect.begin() + static_cast<long>(sel0 + p.budget));
          s.selected_at = s.last_used = a;
          s.params = p;
          s.u0 = 0;
          if (mass) {  // exact over E_a, from the plain plan's scores
            const std::span<const float> e(sc, static_cast<size_t>(eligible_count(a, kB, p)));
            const float shift = max_finite_score(e);
            const double all = exp_score_sum(e, shift);
            double in_s = 0;
            for (int32_t c : s.chunks)
              in_s += exp_score_sum(e.subspan(static_cast<size_t>(c - p.sink_pages), 1), shift);
            s.u0 = all > 0 ? 1.0 - in_s / all : 0.0;
          }
        }
        if (!repeat) {
          host.stats.selected += keep ? 0 : 1;
          host.stats.reused += keep ? 1 : 0;
          host.stats.checked += checked ? 1 : 0;
          host.stats.reselected += checked && !keep ? 1 : 0;
        }
      }
      auto gc = got.list_chunks(static_cast<int64_t>(qg), g);
      auto gp = got.list_pages(static_cast<int64_t>(qg), g);
      ASSERT_EQ(gc.size(), expect.size());
      for (size_t i = 0; i < expect.size(); ++i) {
        ASSERT_EQ(gc[i], expect[i]) << "position " << grp.first << " KV group " << g << " entry "
                                    << i << (repeat ? " (repeat)" : "");
        ASSERT_EQ(gp[i], table[static_cast<size_t>(expect[i])]);
      }
    }
  }
  const SelectionReuseStats c = dr.counters();
  EXPECT_EQ(c.selected, host.stats.selected);
  EXPECT_EQ(c.reused, host.stats.reused);
  EXPECT_EQ(c.checked, host.stats.checked);
  EXPECT_EQ(c.reselected, host.stats.reselected);
}

TEST(CudaSelectionReuse, DecodeListsFollowTheRule) {
  CISA_REQUIRE_GPU();
  struct Case {
    int hkv, d;
    RepKind rep;
    SelectionParams p;
    bool topk_staged = true;  // PlanOptions::topk_staged (v7; off: the one-block kernel), whose
                              // kept lists' blocks leave at once
    RepPrecision prec = RepPrecision::kNative;
    // Every step captured into a CUDA graph (run_select_in_graph), and every entry a reuse
    // candidate (steps where every list keeps, and steps where some select).
    bool graph = false;
    // PlanOptions::topk_cluster_min_scores: 0 takes the cluster top-k (keys in registers) at
    // these lengths, which commits the fresh selections as the other kernels do.
    int cluster_min = -1;
  };
  std::vector<Case> cases = {
      {2, 128, RepKind::kMean, {.budget = 24, .window = 4, .qshare = 1, .sink_pages = 1}},
      {1, 64, RepKind::kQuest, {.budget = 40, .window = 2, .qshare = 1}},
      {2, 256, RepKind::kMean, {.budget = 16, .window = 3, .qshare = 1}},
  };
  cases[0].p.reuse_steps = 8;
  cases[1].p.reuse_steps = 4;
  cases[2].p.reuse_steps = 6;
  cases[2].p.reuse_check = ReuseCheck::kNone;
  cases.push_back(cases[0]);
  cases.back().topk_staged = false;
  // The check `mass`: a slack that keeps some rows and re-selects others as the queries drift.
  for (const Case& m : {cases[0], cases[1]}) {
    cases.push_back(m);
    cases.back().p.reuse_check = ReuseCheck::kMass;
    cases.back().p.reuse_mass_slack = m.p.reuse_steps == 8 ? 0.02 : 0.0;
  }
  // int8 representatives: the check's scores (16 codes a lane) against the fresh selection's.
  for (const size_t i : {size_t{0}, cases.size() - 1}) {
    cases.push_back(cases[i]);
    cases.back().prec = RepPrecision::kInt8;
  }
  // Graphs: the check new-chunks and mass, the staged and the one-block top-k.
  for (const size_t i : {size_t{0}, size_t{3}, cases.size() - 1}) {
    cases.push_back(cases[i]);
    cases.back().graph = true;
  }
  // The cluster top-k: new-chunks (it commits), and mass (reuse_commit does).
  for (const size_t i : {size_t{0}, size_t{4}}) {
    cases.push_back(cases[i]);
    cases.back().cluster_min = 0;
  }
  std::mt19937 rng(77);
  for (const Case& c : cases) {
    SCOPED_TRACE("hkv=" + std::to_string(c.hkv) + " d=" + std::to_string(c.d) + " r=" +
                 std::to_string(c.p.reuse_steps) + " check " + reuse_check_name(c.p.reuse_check) +
                 (c.topk_staged ? " top-k staged" : " top-k one block") + " reps " +
                 rep_precision_name(c.prec) + (c.graph ? " graphs" : "") +
                 (c.cluster_min == 0 ? " cluster top-k" : ""));
    const std::vector<int64_t> len = {4000, 2600, 3300};
    int64_t pages = 0;
    for (auto n : len) pages += n / kB + 2;
    auto cache = *PagedKvCache::create({.num_layers = 1,
                                        .num_kv_heads = c.hkv,
                                        .head_dim = c.d,
                                        .page_size = kB,
                                        .num_pages = pages + 8,
                                        .dtype = KvDtype::kBF16,
                                        .rep = c.rep,
                                        .rep_precision = c.prec});
    for (size_t i = 0; i < len.size(); ++i) ASSERT_EQ(*cache->add_sequence(), SeqId(i));
    append_interleaved(*cache, {0, 1, 2}, len, 150, rng);
    DeviceMirror m;
    m.build(*cache, 0, static_cast<int>(len.size()));
    DeviceReuse dr(4, 2, c.hkv, static_cast<int>(c.p.budget) + 5);
    ASSERT_TRUE(cuda::reset_reuse_state(dr.st, c.hkv, -1, nullptr).ok());
    HostReuse host;
    // Entries 0 and 1 keep state (slots 2 and 0), entry 2 none (−1; in graphs, slot 1).
    const std::vector<int32_t> slots = {2, 0, c.graph ? 1 : -1};
    // Index queries drift slowly from a base per (layer, sequence), with an unrelated query now
    // and then, so the check both passes and fails.
    std::vector<std::vector<float>> base(2);
    for (auto& b : base) b = random_vec(rng, len.size() * static_cast<size_t>(c.hkv * c.d));
    int64_t kept = 0, all_kept = 0;  // lists kept; steps where every list kept
    std::vector<int64_t> pos = {1900, 1500, 2100};
    for (int step = 0; step < 72; ++step) {
      std::vector<BatchEntry> batch;
      for (size_t i = 0; i < pos.size(); ++i) batch.push_back({static_cast<SeqId>(i), pos[i], 1});
      for (int layer = 0; layer < 2; ++layer) {
        std::vector<float> iq = base[static_cast<size_t>(layer)];
        const bool jump = rng() % 11 == 0;
        for (auto& x : iq) x = jump ? random_vec(rng, 1)[0] : x + 0.15f * random_vec(rng, 1)[0];
        const int64_t kept_before = kept;
        check_step(*cache, m, batch, slots, c.p, layer, iq, dr, host, false, &kept, c.topk_staged,
                   c.graph, c.cluster_min);
        if (::testing::Test::HasFatalFailure()) return;
        all_kept += kept - kept_before == static_cast<int64_t>(len.size()) * c.hkv ? 1 : 0;
        if (step % 13 == 6) {  // the same row decided again (not a repeat): it selects afresh
          check_step(*cache, m, batch, slots, c.p, layer, iq, dr, host, false, &kept, c.topk_staged,
                     c.graph, c.cluster_min);
          if (::testing::Test::HasFatalFailure()) return;
        }
        if (step % 9 == 4) {  // the re-plan of a first attend: the same lists, nothing counted
          check_step(*cache, m, batch, slots, c.p, layer, iq, dr, host, true, &kept, c.topk_staged,
                     c.graph, c.cluster_min);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
      for (auto& a : pos) ++a;
      if (step == 30) pos[0] += 2;  // a gap: sequence 0 selects afresh
      if (step == 50) {             // sequence 1 released and its slot reused: no state left
        ASSERT_TRUE(cuda::reset_reuse_state(dr.st, c.hkv, 0, nullptr).ok());
        for (int l = 0; l < 2; ++l)
          for (int g = 0; g < c.hkv; ++g) host.st[{0, l, g}] = {};
      }
    }
    EXPECT_GT(kept, 0);
    EXPECT_GT(host.stats.selected, 0);
    if (c.graph) {
      EXPECT_GT(all_kept, 0);
    }
    if (c.p.reuse_check != ReuseCheck::kNone) {
      EXPECT_GT(host.stats.checked, 0);
    }
    if (c.p.reuse_check == ReuseCheck::kMass) {  // the mass test itself both kept and fired
      EXPECT_GT(host.mass_kept, 0);
      EXPECT_GT(host.mass_failed, 0);
    }
    // A different budget: nothing of the state is kept.
    SelectionParams p2 = c.p;
    p2.budget = c.p.budget - 3;
    std::vector<BatchEntry> batch;
    for (size_t i = 0; i < pos.size(); ++i) batch.push_back({static_cast<SeqId>(i), pos[i], 1});
    const int64_t kept_before = kept;
    check_step(*cache, m, batch, slots, p2, 0, base[0], dr, host, false, &kept);
    EXPECT_EQ(kept, kept_before);
  }
}

TEST(CudaSelectionReuse, PlanAndRunRefuseBadReuseInputs) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(5);
  auto cache = *PagedKvCache::create({.num_layers = 1,
                                      .num_kv_heads = 1,
                                      .head_dim = 128,
                                      .page_size = kB,
                                      .num_pages = 80,
                                      .dtype = KvDtype::kBF16});
  ASSERT_EQ(*cache->add_sequence(), 0);
  append_random(*cache, 0, 1000, rng);
  DeviceMirror m;
  m.build(*cache, 0, 1);
  SelectionParams p{.budget = 8, .window = 2};
  p.reuse_steps = 4;
  const std::vector<BatchEntry> batch = {{0, 999, 1}};
  cuda::Plan plan;
  // No slots.
  Status s = cuda::plan_sparse(m.layer, m.block_tables(), batch, 1, p, &plan);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  const std::vector<int32_t> bad = {-2};
  s = cuda::plan_sparse(m.layer, m.block_tables(), batch, 1, p, &plan, {.reuse_slots = bad});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  // Two decode rows on one state slot (they would race on it); distinct slots plan.
  const std::vector<BatchEntry> two = {{0, 998, 1}, {0, 999, 1}};
  const std::vector<int32_t> same = {3, 3}, distinct = {3, 4};
  s = cuda::plan_sparse(m.layer, m.block_tables(), two, 1, p, &plan, {.reuse_slots = same});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("reuse slot 3"), std::string::npos) << s.message();
  EXPECT_TRUE(
      cuda::plan_sparse(m.layer, m.block_tables(), two, 1, p, &plan, {.reuse_slots = distinct})
          .ok());
  const std::vector<int32_t> slot = {3};
  ASSERT_TRUE(
      cuda::plan_sparse(m.layer, m.block_tables(), batch, 1, p, &plan, {.reuse_slots = slot}).ok());
  EXPECT_EQ(plan.reuse_candidates(), 1);
  DevVec<float> iq;
  iq.upload(random_vec(rng, 128));
  // No state, too few sequence slots, too small a stride.
  s = cuda::run_select(plan, m.layer, iq.data(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  DeviceReuse small(2, 1, 1, 8);
  s = cuda::run_select(plan, m.layer, iq.data(), nullptr, &small.st);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
  DeviceReuse narrow(4, 1, 1, 4);
  s = cuda::run_select(plan, m.layer, iq.data(), nullptr, &narrow.st);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  DeviceReuse ok(4, 1, 1, 8);
  ASSERT_TRUE(cuda::reset_reuse_state(ok.st, 1, -1, nullptr).ok());
  EXPECT_TRUE(cuda::run_select(plan, m.layer, iq.data(), nullptr, &ok.st).ok());
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(ok.counters().selected, 1);
  // Fused selection cannot skip kept lists.
  s = cuda::plan_sparse(m.layer, m.block_tables(), batch, 1, p, &plan,
                        {.fused_select_cluster = 4, .reuse_slots = slot});
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
}

#if defined(CISA_WITH_CUDA_MODEL)
std::unique_ptr<Model> load_model() {
  ModelOptions o{.context = 1024, .max_sequences = 2, .kv_dtype = KvDtype::kBF16};
  o.attention.mode = AttentionMode::kCisa;
  o.attention.selection = {.budget = 4, .window = 2, .qshare = 4};
  o.backend = cuda::make_model_backend;
  // The CUDA backend needs head_dim 64, 128 or 256 (tiny-llama has 16).
  auto m = Model::load_synthetic("qwen2.5-7b", o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

// A 300-token prompt and 40 greedy decode steps; the logits of every step.
Status decode(Model& m, const StepAttention* att, std::vector<float>* all) {
  CISA_ASSIGN_OR_RETURN(SeqId s, m.add_sequence());
  std::vector<int32_t> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 200);
  std::vector<float> logits;
  std::vector<int32_t> ids;
  SequenceInput in{.seq = s, .tokens = prompt};
  CISA_RETURN_IF_ERROR(m.forward({&in, 1}, {.logits = &logits, .argmax = &ids}, {}, att));
  all->insert(all->end(), logits.begin(), logits.end());
  for (int step = 0; step < 40; ++step) {
    const int32_t next = ids[0];
    SequenceInput d{.seq = s, .tokens = {&next, 1}};
    CISA_RETURN_IF_ERROR(m.forward({&d, 1}, {.logits = &logits, .argmax = &ids}, {}, att));
    all->insert(all->end(), logits.begin(), logits.end());
  }
  return m.release_sequence(s);
}

TEST(CudaSelectionReuse, ModelDecodeWithReuse) {
  CISA_REQUIRE_GPU();
  std::unique_ptr<Model> m = load_model();
  ASSERT_TRUE(m);
  std::vector<float> warm, before, r1;
  ASSERT_TRUE(decode(*m, nullptr, &warm).ok());  // GEMM algorithm choices, graphs recorded
  ASSERT_TRUE(decode(*m, nullptr, &before).ok());
  StepAttention att{.mode = AttentionMode::kCisa, .selection = m->options().attention.selection};
  att.selection.reuse_steps = 1;
  ASSERT_TRUE(decode(*m, &att, &r1).ok());
  ASSERT_EQ(before.size(), r1.size());
  EXPECT_EQ(std::memcmp(before.data(), r1.data(), before.size() * sizeof(float)), 0);

  att.selection.reuse_steps = 4;
  att.selection.reuse_check = ReuseCheck::kNone;
  const SelectionReuseStats s0 = m->backend().selection_reuse_stats();
  const int64_t replayed0 = m->backend().step_graph_stats().replayed;
  std::vector<float> graphs, eager;
  ASSERT_TRUE(decode(*m, &att, &graphs).ok());
  const SelectionReuseStats s1 = m->backend().selection_reuse_stats();
  // 40 decode rows x 28 layers x 4 KV groups; without a check, 3 of every 4 keep S.
  const int64_t lists = 40 * 28 * 4;
  EXPECT_EQ(s1.selected - s0.selected + s1.reused - s0.reused, lists);
  EXPECT_EQ(s1.reused - s0.reused, lists / 4 * 3);
  EXPECT_GT(m->backend().step_graph_stats().replayed, replayed0);
  ASSERT_TRUE(cuda::set_step_graphs(m->backend(), false).ok());
  ASSERT_TRUE(decode(*m, &att, &eager).ok());
  ASSERT_TRUE(cuda::set_step_graphs(m->backend(), true).ok());
  ASSERT_EQ(graphs.size(), eager.size());
  EXPECT_EQ(std::memcmp(graphs.data(), eager.data(), graphs.size() * sizeof(float)), 0);
  // Reuse changes what decode reads: some logits differ from r = 1.
  ASSERT_EQ(graphs.size(), before.size());
  EXPECT_NE(std::memcmp(graphs.data(), before.data(), graphs.size() * sizeof(float)), 0);

  // With the check on: deterministic from one sequence to the next (each starts with no state).
  att.selection.reuse_check = ReuseCheck::kNewChunks;
  std::vector<float> a1, a2;
  ASSERT_TRUE(decode(*m, &att, &a1).ok());
  ASSERT_TRUE(decode(*m, &att, &a2).ok());
  ASSERT_EQ(a1.size(), a2.size());
  EXPECT_EQ(std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)), 0);

  // The check `mass`: deterministic as well, and it runs on every row that could keep S, so
  // each checked list either kept S or re-selected.
  att.selection.reuse_check = ReuseCheck::kMass;
  att.selection.reuse_mass_slack = 0.05;
  const SelectionReuseStats m0 = m->backend().selection_reuse_stats();
  std::vector<float> b1, b2;
  ASSERT_TRUE(decode(*m, &att, &b1).ok());
  ASSERT_TRUE(decode(*m, &att, &b2).ok());
  const SelectionReuseStats m1 = m->backend().selection_reuse_stats();
  ASSERT_EQ(b1.size(), b2.size());
  EXPECT_EQ(std::memcmp(b1.data(), b2.data(), b1.size() * sizeof(float)), 0);
  EXPECT_EQ(m1.selected - m0.selected + m1.reused - m0.reused, 2 * lists);
  EXPECT_GT(m1.checked - m0.checked, 0);
  EXPECT_EQ(m1.checked - m0.checked, m1.reused - m0.reused + m1.reselected - m0.reselected);
}
#endif

}  // namespace
}  // namespace cisa::test

#else
TEST(CudaSelectionReuse, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without CUDA)";
}
#endif
