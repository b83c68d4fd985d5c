// Per-layer attention options for models whose every layer is global (issue 14, item 3):
//  - split_layer_budgets against hand-computed splits and a brute-force property check (the sum
//    is the uniform total, every share within 1 of its exact proportion), and bad weights;
//  - per-layer budgets inside the model (tiny random llama, 4 layers): every CISA layer's
//    selection gets its own share, each sparse list holds exactly that many selected chunks, and
//    the built-in path reproduces a selector that calls select_pages with those budgets bit for
//    bit;
//  - dense last layers and an explicit dense layer set: the layers kept dense never select; all
//    layers kept dense equals dense logits bit for bit at a budget of one chunk; `e2` equals the
//    set {2, 3}; their index projections are left unused; bad values are refused at load;
//  - the eval tokens eN, dlLIST and lb, and the layer-budget sidecar reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cisa/model/eval.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "tiny_model_runs.h"

namespace cisa {
namespace {

TEST(SplitLayerBudgets, HandComputedSplits) {
  // total 3 × 10 = 30 over layers 1, 2, 3 with weights 1, 1, 2: 7.5, 7.5, 15 → the tie on the
  // remainder 0.5 goes to the lower layer.
  auto s = split_layer_budgets(10, {false, true, true, true}, std::vector<double>{5, 1, 1, 2});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(*s, (std::vector<int64_t>{0, 8, 7, 15}));
  // Equal weights: the uniform budget everywhere.
  s = split_layer_budgets(47, std::vector<bool>(30, true), std::vector<double>(30, 0.3));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, std::vector<int64_t>(30, 47));
  // A zero weight gives a layer no selected chunk; the others absorb its share.
  s = split_layer_budgets(4, {true, true, true}, std::vector<double>{0, 1, 1});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<int64_t>{0, 6, 6}));
  // No CISA layer: all zero, whatever the weights sum to.
  s = split_layer_budgets(4, {false, false}, std::vector<double>{0, 0});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<int64_t>{0, 0}));
}

TEST(SplitLayerBudgets, SumIsTheUniformTotalAndSharesWithinOne) {
  uint32_t r = 12345;
  auto next = [&] { return (r = r * 1664525u + 1013904223u) >> 8; };
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + static_cast<int>(next() % 40);
    const int64_t k = static_cast<int64_t>(next() % 300);
    std::vector<bool> cisa(static_cast<size_t>(n));
    std::vector<double> w(static_cast<size_t>(n));
    double sum = 0;
    int64_t n_cisa = 0;
    for (int l = 0; l < n; ++l) {
      cisa[static_cast<size_t>(l)] = next() % 4 != 0;
      w[static_cast<size_t>(l)] = (next() % 5 == 0) ? 0.0 : static_cast<double>(next() % 1000);
      if (cisa[static_cast<size_t>(l)]) sum += w[static_cast<size_t>(l)], ++n_cisa;
    }
    if (n_cisa > 0 && sum == 0) continue;  // refused (BadWeightsAreRefused)
    auto s = split_layer_budgets(k, cisa, w);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    int64_t total = 0;
    for (int l = 0; l < n; ++l) {
      const int64_t got = (*s)[static_cast<size_t>(l)];
      total += got;
      if (!cisa[static_cast<size_t>(l)]) {
        EXPECT_EQ(got, 0);
        continue;
      }
      const double exact = static_cast<double>(k * n_cisa) * w[static_cast<size_t>(l)] / sum;
      EXPECT_LT(std::fabs(static_cast<double>(got) - exact), 1.0) << "trial " << trial;
    }
    EXPECT_EQ(total, k * n_cisa) << "trial " << trial;
  }
}

TEST(SplitLayerBudgets, BadWeightsAreRefused) {
  auto msg = [](const Result<std::vector<int64_t>>& r) {
    return r.ok() ? std::string() : r.status().message();
  };
  auto a = split_layer_budgets(4, {true, true}, std::vector<double>{1});
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(msg(a).find("1 weights for a model of 2 layers"), std::string::npos) << msg(a);
  auto b = split_layer_budgets(4, {true, true}, std::vector<double>{1, -1});
  EXPECT_NE(msg(b).find("layer 1"), std::string::npos) << msg(b);
  auto c = split_layer_budgets(4, {true, true}, std::vector<double>{NAN, 1});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  auto d = split_layer_budgets(4, {true, false}, std::vector<double>{0, 3});
  EXPECT_NE(msg(d).find("sum to 0"), std::string::npos) << msg(d);
}

// ---- inside the model ---------------------------------------------------------------------

using testing::cisa_options;
using testing::letters;
using testing::run;
using testing::RunResult;
using testing::tiny_model;

TEST(LayerBudgetsInModel, EachLayerSelectsItsShare) {
  const std::string path = tiny_model("lb_share.gguf", 7, 4);
  const auto prompt = letters(700, 19);
  // k = 4 over 4 CISA layers: total 16, weights 1 : 3 : 0 : 4 → 2, 6, 0, 8.
  const std::vector<int64_t> want = {2, 6, 0, 8};
  AttentionOptions builtin = cisa_options(4);
  builtin.layer_budget_weights = {1, 3, 0, 4};
  // The independent reference: a selector calling select_pages with the expected budget.
  AttentionOptions hooked = cisa_options(4);
  std::map<int, int64_t> sparse_lists;  // per layer: sparse lists seen
  int calls = 0;
  hooked.selector = [&](const PageSelectorInput& in, PageLists* out) -> Status {
    ++calls;
    SelectionParams p = *in.selection;
    p.budget = want[static_cast<size_t>(in.layer)];
    CISA_RETURN_IF_ERROR(select_pages(*in.cache, in.layer, in.batch, in.index_q, p, in.pool, out));
    for (size_t g = 0; g < out->groups.size(); ++g) {
      if (out->groups[g].dense) continue;
      for (int kv = 0; kv < out->num_kv_heads; ++kv) {
        const size_t i = g * static_cast<size_t>(out->num_kv_heads) + static_cast<size_t>(kv);
        EXPECT_EQ(out->num_selected[i], want[static_cast<size_t>(in.layer)])
            << "layer " << in.layer;
        ++sparse_lists[in.layer];
      }
    }
    return Status::Ok();
  };
  // The hooked model's own selection.budget stays 4: its lists come from the selector alone.
  // Its traffic counters count budget 4, so only logits and tokens are compared.
  std::map<int, int64_t> seen_budget;
  AttentionOptions observed = builtin;
  observed.selector = [&](const PageSelectorInput& in, PageLists* out) -> Status {
    seen_budget[in.layer] = in.selection->budget;
    return select_pages(*in.cache, in.layer, in.batch, in.index_q, *in.selection, in.pool, out);
  };
  auto a = run(path, builtin, prompt, 10);
  auto b = run(path, hooked, prompt, 10);
  auto c = run(path, observed, prompt, 10);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(calls, 4 * (6 + 10));
  for (int l = 0; l < 4; ++l) {
    EXPECT_GT(sparse_lists[l], 0) << "layer " << l;
    EXPECT_EQ(seen_budget[l], want[static_cast<size_t>(l)]) << "layer " << l;
  }
  EXPECT_EQ(a->logits, b->logits);
  EXPECT_EQ(a->generated, b->generated);
  EXPECT_EQ(a->logits, c->logits);
  // Uniform k = 4 reads different pages per layer but differs in its logits.
  auto u = run(path, cisa_options(4), prompt, 0);
  ASSERT_TRUE(u.ok());
  EXPECT_NE(u->logits, a->logits);
}

TEST(LayerBudgetsInModel, BadWeightsStopTheLoad) {
  const std::string path = tiny_model("lb_bad.gguf", 8, 4);
  const auto prompt = letters(40, 3);
  AttentionOptions a = cisa_options(4);
  a.layer_budget_weights = {1, 1, 1};  // 3 weights, 4 layers
  auto r = run(path, a, prompt, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("3 weights for a model of 4 layers"), std::string::npos)
      << r.status().message();
  a.layer_budget_weights = {1, 1, -2, 1};
  EXPECT_EQ(run(path, a, prompt, 0).status().code(), StatusCode::kInvalidArgument);
  // Only the CISA layers' weights count: the two left CISA (e2) weigh 0.
  a.layer_budget_weights = {0, 0, 5, 5};
  a.dense_last_layers = 2;
  r = run(path, a, prompt, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sum to 0"), std::string::npos) << r.status().message();
}

TEST(DenseLayersInModel, LayersKeptDenseNeverSelect) {
  const std::string path = tiny_model("dense_last.gguf", 9, 4);
  const auto prompt = letters(650, 23);
  std::set<int> selecting;
  auto recording = [&](AttentionOptions a) {
    a.selector = [&](const PageSelectorInput& in, PageLists* out) -> Status {
      selecting.insert(in.layer);
      return select_pages(*in.cache, in.layer, in.batch, in.index_q, *in.selection, in.pool, out);
    };
    return a;
  };
  AttentionOptions last2 = cisa_options(1);
  last2.dense_last_layers = 2;
  auto e2 = run(path, recording(last2), prompt, 8);
  ASSERT_TRUE(e2.ok()) << e2.status().to_string();
  EXPECT_EQ(selecting, (std::set<int>{0, 1}));
  selecting.clear();
  AttentionOptions set = cisa_options(1);
  set.dense_layer_set = {3, 2};
  auto s23 = run(path, recording(set), prompt, 8);
  ASSERT_TRUE(s23.ok()) << s23.status().to_string();
  EXPECT_EQ(selecting, (std::set<int>{0, 1}));
  EXPECT_EQ(e2->logits, s23->logits);
  EXPECT_EQ(e2->generated, s23->generated);
  selecting.clear();
  set.dense_layer_set = {1};
  set.dense_last_layers = 1;
  auto mixed = run(path, recording(set), prompt, 0);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(selecting, (std::set<int>{0, 2}));

  // Every layer kept dense (first 1 + set {1, 2} + last 1) at a budget of one chunk: dense.
  AttentionOptions all = cisa_options(1);
  all.dense_layers = 1;
  all.dense_layer_set = {1, 2};
  all.dense_last_layers = 1;
  auto dense = run(path, AttentionOptions{}, prompt, 8);
  auto alld = run(path, all, prompt, 8);
  ASSERT_TRUE(dense.ok() && alld.ok());
  EXPECT_EQ(dense->logits, alld->logits);
  EXPECT_EQ(dense->generated, alld->generated);
  EXPECT_EQ(dense->stats.global_pages_read, alld->stats.global_pages_read);
  // The last layers alone dense still differ from dense (layers 0 and 1 select 1 chunk).
  EXPECT_NE(dense->logits, e2->logits);
  EXPECT_LT(e2->stats.global_pages_read, dense->stats.global_pages_read);
}

TEST(DenseLayersInModel, ProjectionsOfLayersKeptDenseAreUnused) {
  // An indexer covers every global layer (cisa eval passes all of them to every `cal` config);
  // the layers an option keeps dense leave theirs unused instead of refusing the load.
  const std::string path = tiny_model("dense_proj.gguf", 11, 4);
  const auto prompt = letters(500, 29);
  auto projections = [](std::initializer_list<int> layers) {
    std::vector<IndexProjection> out;
    for (int l : layers)
      for (int g = 0; g < 2; ++g) {
        IndexProjection p{.layer = l, .kv_group = g, .weight = std::vector<float>(8 * 16)};
        for (size_t i = 0; i < p.weight.size(); ++i)
          p.weight[i] = std::sin(static_cast<float>(i * 7 + l * 3 + g));
        out.push_back(std::move(p));
      }
    return out;
  };
  AttentionOptions all = cisa_options(2);
  all.dense_layer_set = {1};
  all.dense_last_layers = 1;
  all.index = projections({0, 1, 2, 3});
  AttentionOptions used = all;
  used.index = projections({0, 2});
  auto a = run(path, all, prompt, 4);
  auto b = run(path, used, prompt, 4);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->logits, b->logits);
  EXPECT_EQ(a->generated, b->generated);
  // In dense mode a projection is still an error.
  AttentionOptions dense;
  dense.index = projections({0});
  auto d = run(path, dense, prompt, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("does not run CISA"), std::string::npos);
}

TEST(DenseLayersInModel, BadValuesStopTheLoad) {
  const std::string path = tiny_model("dense_bad.gguf", 10, 4);
  const auto prompt = letters(40, 3);
  AttentionOptions a = cisa_options(2);
  a.dense_last_layers = -1;
  auto r = run(path, a, prompt, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dense_last_layers must be >= 0"), std::string::npos);
  a.dense_last_layers = 0;
  a.dense_layer_set = {4};
  r = run(path, a, prompt, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dense layer 4 is outside the model's 4 layers"),
            std::string::npos)
      << r.status().message();
  // More last layers than the model has: every layer dense, not an error.
  a.dense_layer_set.clear();
  a.dense_last_layers = 9;
  EXPECT_TRUE(run(path, a, prompt, 0).ok());
}

// ---- eval configuration tokens and the sidecar ------------------------------------------

TEST(EvalLayerTokens, ParseAndApply) {
  auto c = eval::parse_config("cisa:x8:g4:s1:e2:dl0-2+29+5:lb");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->dense_last_layers, 2);
  EXPECT_EQ(c->dense_layer_set, (std::vector<int>{0, 1, 2, 5, 29}));
  EXPECT_TRUE(c->layer_budgets);
  RepKind rep;
  // lb without weights (no --layer-budgets) is an error naming the flag.
  auto a = eval::config_attention(*c, 8064, 16, &rep);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--layer-budgets"), std::string::npos);
  c->layer_budget_weights = {1, 2};
  a = eval::config_attention(*c, 8064, 16, &rep);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dense_last_layers, 2);
  EXPECT_EQ(a->dense_layer_set, (std::vector<int>{0, 1, 2, 5, 29}));
  EXPECT_EQ(a->layer_budget_weights, (std::vector<double>{1, 2}));
  EXPECT_EQ(a->selection.budget, 47);  // E = 504 − 128 − 1 = 375, k = ⌈375 / 8⌉
  auto l = eval::parse_config("cisa:x8:lbf1");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(l->layer_budgets_label, "f1");
  a = eval::config_attention(*l, 8064, 16, &rep);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--layer-budgets f1=FILE"), std::string::npos)
      << a.status().message();
  for (const char* bad :
       {"cisa:x8:e-1", "cisa:x8:e", "cisa:x8:dl", "cisa:x8:dl3-1", "cisa:x8:dlx", "cisa:x8:dl1++2",
        "cisa:x8:dl-2", "recency:x8:lb", "cisa:x8:lb:lb", "cisa:x8:lbf/1", "cisa:x8:lb=x"}) {
    auto b = eval::parse_config(bad);
    EXPECT_FALSE(b.ok()) << bad;
    if (!b.ok()) {
      EXPECT_NE(b.status().message().find("bad option"), std::string::npos) << bad;
    }
  }
}

std::string write_file(const char* name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(EvalLayerTokens, SidecarReader) {
  auto w = eval::read_layer_budget_weights(
      write_file("lb_ok.txt", "# weights\n\n1 0.5   # layer one\n0 2\n2 0\n"));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(*w, (std::vector<double>{2, 0.5, 0}));
  const std::pair<const char*, const char*> bad[] = {
      {"0 1\n2 1\n", "layer 1 is missing"},   {"0 1\n0 2\n", "line 2: layer 0 given twice"},
      {"0 -1\n", "not a finite number"},      {"0 nan\n", "not a finite number"},
      {"0 1 2\n", "expected 'LAYER WEIGHT'"}, {"zero 1\n", "line 1: expected"},
      {"0\n", "expected 'LAYER WEIGHT'"},     {"# nothing\n", "no layers"},
  };
  int i = 0;
  for (const auto& [text, want] : bad) {
    auto r = eval::read_layer_budget_weights(
        write_file(("lb_bad" + std::to_string(i++) + ".txt").c_str(), text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(eval::read_layer_budget_weights("/nonexistent/lb.txt").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace cisa
