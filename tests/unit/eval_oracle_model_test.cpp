// The page-selector hook of the model runtime (AttentionOptions::selector) with the eval's oracle,
// on a tiny random llama model written by the test (tiny_llama_builder.h), so it runs without
// downloaded models:
//  - a selector that calls select_pages itself reproduces built-in CISA bit for bit, and it sees
//    the queries, scale and parameters the layer uses (the tap's queries);
//  - the oracle with a budget covering the context equals dense, logits bit for bit and greedy
//    tokens one for one;
//  - at a small budget, on every step and layer, the dense mass the oracle's pages capture
//    (fp64 brute force from the cache's keys) is at least CISA's, and more somewhere;
//  - selector errors and malformed lists stop forward() with a clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cisa/model/eval.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "tiny_model_runs.h"

namespace cisa::eval {
namespace {

using testing::cisa_options;
using testing::letters;
using testing::run;
using testing::RunResult;
using testing::tiny_model;

TEST(OracleInModel, PassThroughSelectorEqualsBuiltInCisa) {
  const std::string path = tiny_model("tiny_pass.gguf", 3);
  const auto prompt = letters(700, 11);
  const AttentionOptions builtin = cisa_options(4);
  AttentionOptions hooked = builtin;
  int calls = 0;
  // The tap runs just before selection on the same step and layer: keep its queries to compare.
  std::vector<float> tap_q;
  AttentionTap tap = [&](const AttentionTapData& t) {
    int64_t rows = 0;
    for (const BatchEntry& e : t.batch) rows += e.count;
    tap_q.assign(t.q, t.q + rows * 6 * 8);
    return Status::Ok();
  };
  hooked.selector = [&](const PageSelectorInput& in, PageLists* out) -> Status {
    ++calls;
    EXPECT_EQ(in.num_q_heads, 6);
    EXPECT_FLOAT_EQ(in.scale, 1.0f / std::sqrt(8.0f));
    EXPECT_EQ(in.selection->budget, 4);
    EXPECT_EQ(in.selection->window, 3);
    int64_t rows = 0;
    for (const BatchEntry& e : in.batch) rows += e.count;
    EXPECT_EQ(std::vector<float>(in.q, in.q + rows * 6 * 8), tap_q) << "layer " << in.layer;
    return select_pages(*in.cache, in.layer, in.batch, in.index_q, *in.selection, in.pool, out);
  };
  auto a = run(path, builtin, prompt, 12);
  auto b = run(path, hooked, prompt, 12, tap);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  // 2 layers × (6 prefill blocks of ≤ 128 rows + 12 decode steps).
  EXPECT_EQ(calls, 2 * (6 + 12));
  EXPECT_EQ(a->logits, b->logits);
  EXPECT_EQ(a->generated, b->generated);
  EXPECT_EQ(a->stats.global_pages_read, b->stats.global_pages_read);
}

TEST(OracleInModel, FullBudgetEqualsDense) {
  const std::string path = tiny_model("tiny_full.gguf", 5);
  const auto prompt = letters(600, 17);
  AttentionOptions oracle = cisa_options(4096);
  oracle.selector = oracle_page_selector();
  auto dense = run(path, AttentionOptions{}, prompt, 24);
  auto full = run(path, oracle, prompt, 24);
  ASSERT_TRUE(dense.ok()) << dense.status().to_string();
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  ASSERT_EQ(dense->logits.size(), full->logits.size());
  for (size_t i = 0; i < dense->logits.size(); ++i)
    ASSERT_EQ(dense->logits[i], full->logits[i]) << "logit " << i;
  EXPECT_EQ(dense->generated, full->generated);
  EXPECT_EQ(dense->stats.global_pages_read, full->stats.global_pages_read);
}

// Σ over the group's positions and the KV group's heads of the dense attention mass on the
// chunks of `chunks`, fp64 from the cache's keys.
double captured_mass(const PagedKvCache& cache, int layer, std::span<const int32_t> table,
                     const QueryGroup& grp, const float* q, int Hq, int g, int hg, float scale,
                     const std::set<int32_t>& chunks) {
  const int d = cache.head_dim(), B = cache.page_size();
  double total = 0;
  for (int64_t t = grp.first; t <= grp.last; ++t)
    for (int h = 0; h < hg; ++h) {
      const float* qv = q + ((grp.row + t - grp.first) * Hq + g * hg + h) * d;
      std::vector<double> e(static_cast<size_t>(t + 1));
      double mx = -INFINITY, z = 0, in = 0;
      for (int64_t s = 0; s <= t; ++s) {
        const auto* k =
            static_cast<const float*>(cache.k_page(layer, table[static_cast<size_t>(s / B)], g)) +
            (s % B) * d;
        double acc = 0;
        for (int i = 0; i < d; ++i) acc += static_cast<double>(qv[i]) * k[i];
        e[static_cast<size_t>(s)] = acc * scale;
        mx = std::max(mx, e[static_cast<size_t>(s)]);
      }
      for (double& x : e) z += (x = std::exp(x - mx));
      for (int64_t s = 0; s <= t; ++s)
        if (chunks.count(static_cast<int32_t>(s / B))) in += e[static_cast<size_t>(s)];
      total += in / z;
    }
  return total;
}

TEST(OracleInModel, OracleCapturesAtLeastCisasMass) {
  const std::string path = tiny_model("tiny_mass.gguf", 9);
  const auto prompt = letters(800, 23);
  AttentionOptions oracle = cisa_options(3);
  oracle.selector = oracle_page_selector();
  int compared = 0, better = 0;
  AttentionTap tap = [&](const AttentionTapData& t) -> Status {
    const PagedKvCache& cache = *t.cache;
    const SelectionParams p = oracle.selection;
    PageLists cl, ol;
    CISA_RETURN_IF_ERROR(select_pages(cache, t.layer, t.batch, t.index_q, p, nullptr, &cl));
    CISA_RETURN_IF_ERROR(select_pages_oracle(cache, t.layer, t.batch, t.q, 6,
                                             1.0f / std::sqrt(8.0f), p, nullptr, &ol));
    EXPECT_EQ(cl.groups.size(), ol.groups.size());
    for (size_t i = 0; i < ol.groups.size(); ++i) {
      if (ol.groups[i].dense) continue;
      auto table = *cache.block_table(t.batch[static_cast<size_t>(ol.groups[i].entry)].seq);
      for (int g = 0; g < 2; ++g) {
        auto cc = cl.list_chunks(static_cast<int64_t>(i), g);
        auto oc = ol.list_chunks(static_cast<int64_t>(i), g);
        EXPECT_EQ(cc.size(), oc.size());
        const std::set<int32_t> cs(cc.begin(), cc.end()), os(oc.begin(), oc.end());
        const double mc = captured_mass(cache, t.layer, table, ol.groups[i], t.q, 6, g, 3,
                                        1.0f / std::sqrt(8.0f), cs);
        const double mo = captured_mass(cache, t.layer, table, ol.groups[i], t.q, 6, g, 3,
                                        1.0f / std::sqrt(8.0f), os);
        EXPECT_GE(mo, mc - 1e-9) << "layer " << t.layer << " group " << i << " kv " << g;
        ++compared;
        better += mo > mc + 1e-9;
      }
    }
    return Status::Ok();
  };
  auto o = run(path, oracle, prompt, 8, tap);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_GT(compared, 100);
  EXPECT_GT(better, 0);  // the index queries are not the oracle: they miss somewhere

  // The oracle's lists have CISA's sizes (same pages read) but other pages (other logits).
  auto c = run(path, cisa_options(3), prompt, 8);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(o->stats.global_pages_read, c->stats.global_pages_read);
  EXPECT_LT(o->stats.global_pages_read, o->stats.global_pages_dense / 2);
  EXPECT_NE(o->logits, c->logits);
}

TEST(OracleInModel, SelectorErrorsStopForward) {
  const std::string path = tiny_model("tiny_err.gguf", 13);
  const auto prompt = letters(300, 29);
  AttentionOptions failing = cisa_options(2);
  failing.selector = [](const PageSelectorInput&, PageLists*) {
    return Status(StatusCode::kInternal, "selector exploded");
  };
  auto f = run(path, failing, prompt, 0);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("selector exploded"), std::string::npos);

  AttentionOptions malformed = cisa_options(2);
  malformed.selector = [](const PageSelectorInput& in, PageLists* out) -> Status {
    CISA_RETURN_IF_ERROR(
        select_pages(*in.cache, in.layer, in.batch, in.index_q, *in.selection, in.pool, out));
    out->offsets.back() += 5;  // claims pages the array does not hold
    return Status::Ok();
  };
  auto m = run(path, malformed, prompt, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("malformed"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace cisa::eval
