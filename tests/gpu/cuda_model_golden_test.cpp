// The whole model on the GPU against the CPU engine, on the real models and the golden prompts
// (tests/golden/fixtures: about 100, 2,000 and 8,000 tokens of Jane Austen, up to 256 scored
// positions each). Both engines run the same token IDs; at every scored position we compare the
// full next-token distributions: top-1 agreement and mean KL(CPU ‖ GPU) over the whole vocabulary.
// Bars (the model-runtime issue's): dense top-1 >= 99% and mean KL < 0.01; CISA with the same k,
// W, G and indexer top-1 >= 98% and KL < 0.02; where the two references below agree with each
// other less than that, the GPU is held to their agreement instead (AgreesWithTheCpuEngine) and
// to the bars on the GPU's own selection (CisaOnTheGpusPagesAgreesWithTheCpuEngine). Two CPU
// references, both with K/V in bf16 as on the GPU:
//  - the bars hold against the CPU engine multiplying as the GPU does (ModelOptions::bf16_matmul:
//    weights, embeddings and every product's input rounded to bf16, f32 sums), so what they
//    measure is the GPU implementation (its kernels, accumulation orders and attention);
//  - the CPU engine multiplying the stored weights exactly in f32 (ModelOptions::weights_f32) is
//    printed beside it: that difference adds the GPU's choice of bf16 products
//    (docs/cuda-model.md).
// Neither uses the CPU's default 8-bit activations. Also: a batch of sequences of different
// lengths decodes the same greedy tokens as each sequence alone. Skips without a GPU, without the
// CUDA model backend, or without the models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cisa/cpu/kv_cache.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "cisa/model/sampling.h"
#include "golden/logits_compare.h"
#include "golden/logits_fixture.h"

#if defined(CISA_WITH_CUDA_MODEL)
#include "cisa/cuda/backend.h"
#include "cisa/cuda/model_backend.h"
#endif

namespace cisa {
namespace {

#if defined(CISA_WITH_CUDA_MODEL)

struct Case {
  const char* model;
  bool cisa;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << (c.cisa ? "/cisa" : "/dense");
}

class CudaModelGolden : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why))
      GTEST_SKIP() << "no CUDA device: GPU tests skipped (" << why << ")";
    auto path = resolve_model(GetParam().model);
    if (!path.ok())
      GTEST_SKIP() << "model " << GetParam().model << " is absent: " << path.status().message();
    path_ = *path;
    std::string err;
    const std::string fx =
        std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures/logits_" + GetParam().model + ".bin";
    if (!read_fixture(fx, &fixture_, &err))
      GTEST_SKIP() << "no logits fixture " << fx << ": " << err;
  }

  enum class Engine { kGpu, kCpuBf16Products, kCpuExactF32 };
  std::unique_ptr<Model> load(Engine e, int64_t context, bool batch_invariant = false,
                              const std::function<void(ModelOptions*)>& tweak = nullptr) {
    ModelOptions o;
    o.context = (context + 255) / 256 * 256;
    o.max_sequences = 3;
    o.threads = 0;
    // The GPU stores K/V in bf16; so do the references, so that all select from the same rounding
    // of the keys (a near-tie between two pages' scores can otherwise flip a selection).
    o.kv_dtype = KvDtype::kBF16;
    if (e == Engine::kGpu) o.backend = cuda::make_model_backend;
    o.batch_invariant = batch_invariant;
    if (e == Engine::kCpuBf16Products) o.bf16_matmul = true;
    if (e == Engine::kCpuExactF32) o.weights_f32 = true;
    if (GetParam().cisa) {
      auto probe = Model::load(path_, {.context = 256});
      EXPECT_TRUE(probe.ok());
      const int64_t n = probe.ok() ? (*probe)->hparams().n_ctx_train : 8192;
      o.attention.mode = AttentionMode::kCisa;
      o.attention.selection = golden_cisa_selection(n);
    }
    if (tweak) tweak(&o);
    auto m = Model::load(path_, o);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // Greedy decoding on the GPU of the batch test's prompts `which`, all in one batch: prefill,
  // then kSteps steps of one forward call holding a row of every sequence.
  static constexpr int kSteps = 12;
  struct Run {
    std::vector<std::vector<int32_t>> tokens;             // [sequence][step]
    std::vector<std::vector<std::vector<float>>> logits;  // [sequence][step][V]
  };
  std::vector<std::vector<int32_t>> batch_prompts() const {
    const FixturePrompt& a = fixture_.prompts[0];
    const FixturePrompt& b = fixture_.prompts[1];
    return {a.ids,
            {b.ids.begin(), b.ids.begin() + std::min<size_t>(b.ids.size(), 700)},
            {a.ids.begin(), a.ids.begin() + 9}};
  }
  static Run greedy(Model& gpu, const std::vector<std::vector<int32_t>>& prompts,
                    const std::vector<size_t>& which) {
    const int V = gpu.hparams().n_vocab;
    Run run;
    run.tokens.resize(which.size());
    run.logits.resize(which.size());
    std::vector<SeqId> seqs;
    std::vector<std::vector<int32_t>> next(which.size());
    for (size_t i = 0; i < which.size(); ++i) {
      seqs.push_back(*gpu.add_sequence());
      next[i] = prompts[which[i]];
    }
    for (int step = 0; step <= kSteps; ++step) {
      std::vector<SequenceInput> in;
      for (size_t i = 0; i < which.size(); ++i) in.push_back({.seq = seqs[i], .tokens = next[i]});
      std::vector<float> logits;
      const Status s = gpu.forward(in, &logits);
      EXPECT_TRUE(s.ok()) << s.to_string();
      if (!s.ok()) break;
      for (size_t i = 0; i < which.size(); ++i) {
        std::vector<float> row(logits.begin() + i * V, logits.begin() + (i + 1) * V);
        const int32_t t = argmax(row);
        run.tokens[i].push_back(t);
        run.logits[i].push_back(std::move(row));
        next[i] = {t};
      }
    }
    for (SeqId s : seqs) EXPECT_TRUE(gpu.release_sequence(s).ok());
    return run;
  }

  int64_t longest_prompt() const {
    int64_t longest = 0;
    for (const auto& p : fixture_.prompts)
      longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
    return longest;
  }

  std::string path_;
  Fixture fixture_;
};

TEST_P(CudaModelGolden, AgreesWithTheCpuEngine) {
  const int64_t longest = longest_prompt();
  auto gpu = load(Engine::kGpu, longest), rounded = load(Engine::kCpuBf16Products, longest),
       exact = load(Engine::kCpuExactF32, longest);
  ASSERT_TRUE(gpu && rounded && exact);
  const int V = gpu->hparams().n_vocab;
  LogitsCompare all, all_exact, spread;
  for (const FixturePrompt& p : fixture_.prompts) {
    const size_t positions = p.positions.size();
    std::vector<float> logits[3];
    Model* models[3] = {gpu.get(), rounded.get(), exact.get()};
    for (int i = 0; i < 3; ++i) {
      const Status s = fixture_logits(*models[i], p, &logits[i]);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    const std::vector<float>& got = logits[0];
    ASSERT_EQ(logits[1].size(), got.size());
    ASSERT_EQ(logits[2].size(), got.size());
    for (float x : got) ASSERT_TRUE(std::isfinite(x)) << "non-finite GPU logit";
    LogitsCompare c, ce, cs;
    for (size_t j = 0; j < positions; ++j) {
      compare_rows(logits[1].data() + j * V, got.data() + j * V, V, &c);
      compare_rows(logits[2].data() + j * V, got.data() + j * V, V, &ce);
      compare_rows(logits[1].data() + j * V, logits[2].data() + j * V, V, &cs);
    }
    spread.add(cs);
    std::printf(
        "[ gpu-cpu  ] %s %s %s: %zu tokens, %lld positions: top-1 %.2f%%, mean KL %.2e, max KL "
        "%.2e (against exact f32 products: top-1 %.2f%%, mean KL %.2e, max KL %.2e)\n",
        GetParam().model, GetParam().cisa ? "cisa" : "dense", p.name.c_str(), p.ids.size(),
        static_cast<long long>(c.n), 100 * c.top1(), c.kl_mean(), c.kl_max, 100 * ce.top1(),
        ce.kl_mean(), ce.kl_max);
    all.add(c);
    all_exact.add(ce);
  }
  const double top1 = all.top1(), kl = all.kl_mean();
  const double issue_top1 = GetParam().cisa ? 0.98 : 0.99, issue_kl = GetParam().cisa ? 0.02 : 0.01;
  // Where the two CPU references (bf16 against exact f32 products, both correct) agree with each
  // other less than the issue's bars, no engine can be held to those bars end to end: with CISA in
  // every layer of SmolLM2 at this budget a bf16-level difference upstream swaps near-tied pages
  // and the predictions part (docs/cuda-model.md). The GPU is then held to the references' own
  // agreement (top-1 at most one point below theirs, KL no larger than theirs), and
  // CisaOnTheGpusPagesAgreesWithTheCpuEngine holds it to the issue's bars on a shared selection.
  const bool spread_wider = spread.top1() < issue_top1 || spread.kl_mean() >= issue_kl;
  const double top1_bar = spread_wider ? std::min(issue_top1, spread.top1() - 0.01) : issue_top1;
  const double kl_bar = spread_wider ? std::max(issue_kl, spread.kl_mean()) : issue_kl;
  std::printf(
      "[ gpu-cpu  ] %s %s, all prompts: top-1 %.2f%% (bar %.2f%%), mean KL %.2e (bar %.2g); "
      "against exact f32 products: top-1 %.2f%%, mean KL %.2e; the two CPU references: top-1 "
      "%.2f%%, mean KL %.2e (%s)\n",
      GetParam().model, GetParam().cisa ? "cisa" : "dense", 100 * top1, 100 * top1_bar, kl, kl_bar,
      100 * all_exact.top1(), all_exact.kl_mean(), 100 * spread.top1(), spread.kl_mean(),
      spread_wider ? "below the issue's bars: the GPU is held to their agreement"
                   : "within the issue's bars: the GPU is held to them");
  EXPECT_GE(top1, top1_bar);
  EXPECT_LT(kl, kl_bar);
}

// For the chunks of a GPU list `gc` that the CPU's own list `oc` lacks (group `grp`, KV group
// `kv`): how far the CPU scores them below its k-th selected score, in standard deviations of the
// group's eligible scores, appended to `gaps`. The CPU's index query of the group as
// select_pages forms it (the mean, or the last, of the group's rows).
void near_tie_gaps(const PageSelectorInput& in, const QueryGroup& grp, int kv,
                   std::span<const int32_t> table, std::span<const int32_t> gc,
                   std::span<const int32_t> oc, std::vector<double>* gaps) {
  const SelectionParams& p = *in.selection;
  const ListLayout lay = list_layout(grp, in.cache->page_size(), p);
  const int64_t n = lay.eligible_end - lay.eligible_begin;
  if (lay.selected <= 0 || n <= lay.selected) return;
  const int d = in.cache->head_dim(), H = in.cache->num_kv_heads();
  std::vector<float> qbar(static_cast<size_t>(d), 0.0f);
  const int64_t first = p.qshare_query == QShareQuery::kLast ? grp.last : grp.first;
  const int64_t rows = grp.last - first + 1;
  for (int64_t t = 0; t < rows; ++t)
    for (int i = 0; i < d; ++i)
      qbar[static_cast<size_t>(i)] +=
          in.index_q[((grp.row + (first - grp.first) + t) * H + kv) * d + i] /
          static_cast<float>(rows);
  std::vector<float> sc(static_cast<size_t>(n));
  score_chunks(*in.cache, in.layer, table, kv, qbar.data(), lay.eligible_begin, n, sc.data());
  std::vector<float> sorted = sc;
  std::nth_element(sorted.begin(), sorted.begin() + (lay.selected - 1), sorted.end(),
                   std::greater<float>());
  const double kth = sorted[static_cast<size_t>(lay.selected - 1)];
  double mean = 0, var = 0;
  for (float x : sc) mean += x;
  mean /= static_cast<double>(n);
  for (float x : sc) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / static_cast<double>(n));
  if (!(sd > 0)) return;
  for (const int32_t c : gc)
    if (c >= lay.eligible_begin && c < lay.eligible_end &&
        !std::binary_search(oc.begin(), oc.end(), c))
      gaps->push_back((kth - sc[static_cast<size_t>(c - lay.eligible_begin)]) / sd);
}

// CISA's two halves apart. The GPU's forward against the CPU engine (bf16 products) attending
// exactly the pages the GPU selected: AttentionOptions::page_list_observer records the GPU's
// lists of every step and CISA layer, and a PageSelector replays them on the CPU, each chunk
// mapped to the CPU cache's page. Left is the GPU's arithmetic around and over the selected
// pages, held to the issue's CISA bars (top-1 >= 98%, mean KL < 0.02); the selection itself is
// checked apart: the replayed lists have the layout of the CPU's own (same groups and list sizes),
// and the share of lists whose chunks equal the CPU's own top-k on its own index queries is
// printed, with how near a tie each chunk the two choose differently is under the CPU's scores
// (a bf16-level difference upstream can swap near-tied pages: AgreesWithTheCpuEngine above,
// docs/cuda-model.md).
TEST_P(CudaModelGolden, CisaOnTheGpusPagesAgreesWithTheCpuEngine) {
  if (!GetParam().cisa) GTEST_SKIP() << "CISA only";
  const int64_t longest = longest_prompt();
  std::vector<std::pair<int, PageLists>> recorded;  // (layer, lists) of one prompt, in order
  size_t next = 0;
  int64_t lists = 0, lists_same = 0;
  // For every chunk the GPU selected and the CPU did not: how far its CPU score falls below the
  // CPU's k-th score, in standard deviations of the list's eligible scores (how near a tie it is).
  std::vector<double> gaps;
  auto gpu = load(Engine::kGpu, longest, false, [&](ModelOptions* o) {
    o->attention.page_list_observer = [&](int layer, const PageLists& l) -> Status {
      recorded.emplace_back(layer, l);
      return Status::Ok();
    };
  });
  auto cpu = load(Engine::kCpuBf16Products, longest, false, [&](ModelOptions* o) {
    o->attention.selector = [&](const PageSelectorInput& in, PageLists* out) -> Status {
      if (next >= recorded.size())
        return internal_error("the CPU ran more CISA layers than the GPU recorded");
      const auto& [layer, g] = recorded[next++];
      if (layer != in.layer)
        return internal_error("GPU layer " + std::to_string(layer) + " replayed at CPU layer " +
                              std::to_string(in.layer));
      PageLists own;
      CISA_RETURN_IF_ERROR(
          select_pages(*in.cache, in.layer, in.batch, in.index_q, *in.selection, in.pool, &own));
      if (own.groups.size() != g.groups.size() || own.offsets != g.offsets ||
          own.num_selected != g.num_selected || own.num_kv_heads != g.num_kv_heads)
        return internal_error("layer " + std::to_string(layer) +
                              ": the GPU's lists are not laid out as the CPU's");
      *out = g;
      for (size_t gi = 0; gi < g.groups.size(); ++gi) {
        const SeqId seq = in.batch[static_cast<size_t>(g.groups[gi].entry)].seq;
        CISA_ASSIGN_OR_RETURN(std::span<const int32_t> table, in.cache->block_table(seq));
        for (int kv = 0; kv < g.num_kv_heads; ++kv) {
          const auto gc = g.list_chunks(static_cast<int64_t>(gi), kv);
          const auto oc = own.list_chunks(static_cast<int64_t>(gi), kv);
          ++lists;
          const bool same = std::equal(gc.begin(), gc.end(), oc.begin(), oc.end());
          lists_same += same;
          if (!same) near_tie_gaps(in, g.groups[gi], kv, table, gc, oc, &gaps);
          const int64_t at = g.offsets[gi * static_cast<size_t>(g.num_kv_heads) + kv];
          for (size_t j = 0; j < gc.size(); ++j) {
            if (gc[j] < 0 || static_cast<size_t>(gc[j]) >= table.size())
              return internal_error("a GPU chunk outside the CPU's block table");
            out->pages[static_cast<size_t>(at) + j] = table[static_cast<size_t>(gc[j])];
          }
        }
      }
      return Status::Ok();
    };
  });
  ASSERT_TRUE(gpu && cpu);
  const int V = gpu->hparams().n_vocab;
  LogitsCompare all;
  for (const FixturePrompt& p : fixture_.prompts) {
    std::vector<float> logits[2];
    recorded.clear();
    next = 0;
    Model* models[2] = {gpu.get(), cpu.get()};
    for (int i = 0; i < 2; ++i) {
      const Status s = fixture_logits(*models[i], p, &logits[i]);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    EXPECT_EQ(next, recorded.size()) << "the CPU replayed fewer CISA layers than the GPU ran";
    ASSERT_EQ(logits[1].size(), logits[0].size());
    LogitsCompare c;
    for (size_t j = 0; j < p.positions.size(); ++j)
      compare_rows(logits[1].data() + j * V, logits[0].data() + j * V, V, &c);
    std::printf(
        "[ gpu-pages] %s %s: %zu tokens, %zu CISA layer steps: top-1 %.2f%%, mean KL %.2e, max KL "
        "%.2e\n",
        GetParam().model, p.name.c_str(), p.ids.size(), recorded.size(), 100 * c.top1(),
        c.kl_mean(), c.kl_max);
    all.add(c);
  }
  std::printf(
      "[ gpu-pages] %s, all prompts, the CPU on the GPU's pages: top-1 %.2f%% (bar 98%%), mean KL "
      "%.2e (bar 0.02); %lld of %lld lists (%.2f%%) equal the CPU's own top-k\n",
      GetParam().model, 100 * all.top1(), all.kl_mean(), static_cast<long long>(lists_same),
      static_cast<long long>(lists), lists ? 100.0 * lists_same / lists : 0.0);
  if (!gaps.empty()) {
    std::sort(gaps.begin(), gaps.end());
    const auto at = [&](double q) { return gaps[static_cast<size_t>(q * (gaps.size() - 1))]; };
    std::printf(
        "[ gpu-pages] %s: %zu chunks selected by the GPU and not by the CPU; their CPU score below "
        "the CPU's k-th, in standard deviations of the list's scores: median %.3f, 90%% %.3f, "
        "99%% %.3f, max %.3f\n",
        GetParam().model, gaps.size(), at(0.5), at(0.9), at(0.99), gaps.back());
    // (SmolLM2, 2026-12-04: median 0.005, max 0.083 standard deviations: near ties only. Not
    // asserted until Gemma's distribution is measured too; the selection's own correctness is
    // asserted by cuda_backend_kv_test and cuda_select_test against select_pages.)
  }
  EXPECT_GT(lists, 0);
  EXPECT_GE(all.top1(), 0.98);
  EXPECT_LT(all.kl_mean(), 0.02);
}

// Greedy decoding of three sequences of different prompt lengths in one batch (each decode step
// one forward call holding a row of every sequence) against each sequence alone. The GEMMs choose
// their algorithm per row count (gemm.h), so a batch sums in another order than a sequence alone
// and the runs are not bit-identical: with the same tokens so far, their logits must agree to
// bf16 precision (max |difference| within 2^-7 of the logits' range, the relative step of a bf16
// value) at every step up to the first where the greedy tokens part, which can then only be a
// near-tie (the step, both tokens, the margin and the difference are printed); after it the
// continuations may part.
TEST_P(CudaModelGolden, BatchedGreedyEqualsSeparateRuns) {
  if (GetParam().cisa) GTEST_SKIP() << "run once per model (dense)";
  ASSERT_GE(fixture_.prompts.size(), 2u);
  const auto prompts = batch_prompts();
  auto gpu = load(Engine::kGpu, 1024);
  ASSERT_TRUE(gpu);
  const int V = gpu->hparams().n_vocab;
  const Run together = greedy(*gpu, prompts, {0, 1, 2});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Run alone = greedy(*gpu, prompts, {i});
    ASSERT_EQ(together.tokens[i].size(), alone.tokens[0].size());
    for (size_t step = 0; step < alone.tokens[0].size(); ++step) {
      const std::vector<float>& x = together.logits[i][step];
      const std::vector<float>& y = alone.logits[0][step];
      double diff = 0, lo = INFINITY, hi = -INFINITY;
      for (int v = 0; v < V; ++v) {
        diff = std::max(diff, std::abs(double(x[size_t(v)]) - y[size_t(v)]));
        lo = std::min(lo, double(y[size_t(v)]));
        hi = std::max(hi, double(y[size_t(v)]));
      }
      std::vector<float> sorted = y;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const double margin = double(sorted[0]) - sorted[1];
      EXPECT_LE(diff, (hi - lo) * 0x1p-7)
          << "sequence " << i << " step " << step << ": batched and alone logits differ by " << diff
          << " with the same tokens so far (range " << hi - lo << ")";
      if (together.tokens[i][step] != alone.tokens[0][step]) {
        std::printf(
            "[ batched  ] sequence %zu parts at step %zu: %d batched, %d alone; alone's top-1 "
            "margin %.4f, max logit difference %.4f\n",
            i, step, together.tokens[i][step], alone.tokens[0][step], margin, diff);
        // (With the same tokens so far, a part needs margin <= 2 x diff: a near-tie by the check
        // above.)
        break;  // the continuations may part after a near-tie
      }
    }
  }
}

// The same with ModelOptions::batch_invariant, dense and CISA: every sequence's logits in the
// batch are the same bits as alone at every step, so its greedy tokens are the same.
TEST_P(CudaModelGolden, BatchInvariantGreedyIsBitIdentical) {
  ASSERT_GE(fixture_.prompts.size(), 2u);
  const auto prompts = batch_prompts();
  auto gpu = load(Engine::kGpu, 1024, /*batch_invariant=*/true);
  ASSERT_TRUE(gpu);
  const Run together = greedy(*gpu, prompts, {0, 1, 2});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Run alone = greedy(*gpu, prompts, {i});
    ASSERT_EQ(together.tokens[i].size(), alone.tokens[0].size());
    EXPECT_EQ(together.tokens[i], alone.tokens[0]) << "sequence " << i << ": greedy tokens";
    for (size_t step = 0; step < alone.tokens[0].size(); ++step) {
      const std::vector<float>& x = together.logits[i][step];
      const std::vector<float>& y = alone.logits[0][step];
      ASSERT_EQ(x.size(), y.size());
      size_t differ = 0;
      for (size_t v = 0; v < x.size(); ++v) differ += std::memcmp(&x[v], &y[v], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << "sequence " << i << " step " << step << ": " << differ
                            << " logits are other bits in the batch than alone";
      if (together.tokens[i][step] != alone.tokens[0][step]) break;
    }
  }
}

const Case kCases[] = {
    {"gemma3-270m", false}, {"gemma3-270m", true}, {"smollm2-135m", false}, {"smollm2-135m", true}};
INSTANTIATE_TEST_SUITE_P(Models, CudaModelGolden, ::testing::ValuesIn(kCases));

#else
TEST(CudaModelGolden, Skipped) {
  GTEST_SKIP() << "built without the CUDA model backend";
}
#endif

}  // namespace
}  // namespace cisa
