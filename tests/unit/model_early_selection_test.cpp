// A CISA layer's index queries and early selection (model_attention.cpp):
//  - the index projection built for a layer without calibration is the mean of each KV group's
//    W_q head blocks, so the index query a tap sees equals the mean of the group's (rotated)
//    query heads, computed here from the q the tap sees;
//  - in a decode step the model selects before the step's K/V are appended; the pages equal the
//    ones cisa::select_pages picks after the append (a PageSelector calling it forces that
//    order), so every logit of a prefill plus decode run is the same bit for bit;
//  - validate_selection_batch (plan.h) lets exactly the last query position of an entry be
//    unwritten;
//  - AttentionOptions::page_list_observer sees the lists attention reads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cisa/core/plan.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/model.h"
#include "test_util.h"

namespace cisa {
namespace {

using test::random_tokens;

ModelOptions cisa_options() {
  ModelOptions o{.threads = 2, .context = 1024, .max_sequences = 1, .prefill_block = 128};
  o.attention.mode = AttentionMode::kCisa;
  o.attention.selection = {.budget = 3, .window = 2, .qshare = 8};
  return o;
}

// Prefill of `prompt`, then `steps` decode steps of the given tokens; every row's logits.
std::vector<float> prefill_and_decode(Model& m, const std::vector<int32_t>& prompt,
                                      const std::vector<int32_t>& decode) {
  const SeqId s = *m.add_sequence();
  std::vector<float> all, logits;
  SequenceInput in{.seq = s, .tokens = prompt, .outputs = OutputMode::kAll};
  EXPECT_TRUE(m.forward({&in, 1}, &all).ok());
  for (const int32_t t : decode) {
    const std::vector<int32_t> one{t};
    SequenceInput step{.seq = s, .tokens = one, .outputs = OutputMode::kAll};
    const Status st = m.forward({&step, 1}, &logits);
    EXPECT_TRUE(st.ok()) << st.message();
    all.insert(all.end(), logits.begin(), logits.end());
  }
  EXPECT_TRUE(m.release_sequence(s).ok());
  return all;
}

TEST(ModelEarlySelection, IndexQueryIsTheMeanOfTheGroupsQueryHeads) {
  auto m = Model::load_synthetic("tiny-llama", cisa_options());
  ASSERT_TRUE(m.ok()) << m.status().message();
  const ModelHparams& h = (*m)->hparams();
  const int hq = h.n_head, hkv = h.n_head_kv, d = h.head_dim, hg = hq / hkv;
  ASSERT_GT(hg, 1);  // a real mean
  int checked = 0;
  double worst = 0;
  (*m)->set_attention_tap([&](const AttentionTapData& t) {
    // RoPE is linear and the same at every head of a row: the mean of the rotated heads is the
    // rotated mean (up to f32 rounding).
    for (size_t r = 0; r < t.positions.size(); ++r)
      for (int g = 0; g < hkv; ++g)
        for (int i = 0; i < d; ++i) {
          double want = 0;
          for (int j = 0; j < hg; ++j) want += t.q[(r * hq + g * hg + j) * d + i];
          want /= hg;
          const double got = t.index_q[(r * hkv + g) * d + i];
          worst = std::max(worst, std::abs(got - want) / (std::abs(want) + 1e-3));
          ++checked;
        }
    return Status::Ok();
  });
  const std::vector<int32_t> toks = random_tokens(100, h.n_vocab, 5);
  SequenceInput in{.seq = *(*m)->add_sequence(), .tokens = toks};
  std::vector<float> logits;
  ASSERT_TRUE((*m)->forward({&in, 1}, &logits).ok());
  EXPECT_EQ(checked, 100 * hkv * d * h.n_layer);
  EXPECT_LT(worst, 1e-4);
}

TEST(ModelEarlySelection, DecodeSelectsBeforeTheAppendTheSamePagesAsAfter) {
  const std::vector<int32_t> prompt = random_tokens(300, 256, 7),
                             decode = random_tokens(40, 256, 8);
  auto early = Model::load_synthetic("tiny-llama", cisa_options());
  ASSERT_TRUE(early.ok());
  const std::vector<float> a = prefill_and_decode(**early, prompt, decode);

  // The same selection, made by select_pages after each step's K/V are appended (a selector
  // always runs after the append).
  ModelOptions late_opt = cisa_options();
  int decode_calls = 0;
  late_opt.attention.selector = [&](const PageSelectorInput& in, PageLists* out) {
    if (in.batch.size() == 1 && in.batch[0].count == 1) ++decode_calls;
    return select_pages(*in.cache, in.layer, in.batch, in.index_q, *in.selection, in.pool, out);
  };
  auto late = Model::load_synthetic("tiny-llama", late_opt);
  ASSERT_TRUE(late.ok());
  const std::vector<float> b = prefill_and_decode(**late, prompt, decode);
  EXPECT_EQ(decode_calls, 40 * 2);  // both layers of every decode step
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a, b);
  // And the selection is sparse there: fewer pages read than dense.
  EXPECT_LT((*early)->stats().global_pages_read, (*early)->stats().global_pages_dense / 2);
}

// AttentionOptions::page_list_observer sees, for every CISA layer of every step, the lists
// attention reads: the same as select_pages chooses (here recorded from a selector calling it in
// a second model), chunks and pages alike, and watching changes no logit.
TEST(ModelEarlySelection, PageListObserverSeesTheListsAttentionReads) {
  const std::vector<int32_t> prompt = random_tokens(300, 256, 9),
                             decode = random_tokens(12, 256, 10);
  std::vector<std::pair<int, PageLists>> seen, chosen;
  ModelOptions watched = cisa_options();
  watched.attention.page_list_observer = [&](int layer, const PageLists& l) {
    seen.emplace_back(layer, l);
    return Status::Ok();
  };
  auto a = Model::load_synthetic("tiny-llama", watched);
  ASSERT_TRUE(a.ok()) << a.status().message();
  const std::vector<float> la = prefill_and_decode(**a, prompt, decode);

  ModelOptions selected = cisa_options();
  selected.attention.selector = [&](const PageSelectorInput& in, PageLists* out) {
    const Status st =
        select_pages(*in.cache, in.layer, in.batch, in.index_q, *in.selection, in.pool, out);
    chosen.emplace_back(in.layer, *out);
    return st;
  };
  auto b = Model::load_synthetic("tiny-llama", selected);
  ASSERT_TRUE(b.ok());
  const std::vector<float> lb = prefill_and_decode(**b, prompt, decode);
  EXPECT_EQ(la, lb);
  // 300 prompt tokens in blocks of 128 (3 steps) and 12 decode steps, 2 CISA layers each.
  ASSERT_EQ(seen.size(), size_t{(3 + 12) * 2});
  ASSERT_EQ(seen.size(), chosen.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, chosen[i].first) << i;
    EXPECT_EQ(seen[i].second.offsets, chosen[i].second.offsets) << i;
    EXPECT_EQ(seen[i].second.pages, chosen[i].second.pages) << i;
    EXPECT_EQ(seen[i].second.chunks, chosen[i].second.chunks) << i;
    EXPECT_EQ(seen[i].second.num_selected, chosen[i].second.num_selected) << i;
  }
}

TEST(ModelEarlySelection, SelectionNeedsTheKvBeforeEachEntrysLastQuery) {
  PageTable t(/*num_layers=*/1, /*page_size=*/16, /*num_pages=*/8);
  const SeqId s = *t.add_sequence();
  ASSERT_TRUE(t.reserve(s, 40).ok());
  ASSERT_TRUE(t.mark_written(0, s, 20).ok());  // 20 tokens written
  const BatchEntry decode{.seq = s, .first = 20, .count = 1};
  EXPECT_EQ(validate_batch(t, 0, {&decode, 1}).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(validate_selection_batch(t, 0, {&decode, 1}).ok());
  const BatchEntry block{.seq = s, .first = 18, .count = 3};  // 18, 19 written, 20 not
  EXPECT_TRUE(validate_selection_batch(t, 0, {&block, 1}).ok());
  const BatchEntry ahead{.seq = s, .first = 20, .count = 2};  // 20 and 21 unwritten
  EXPECT_EQ(validate_selection_batch(t, 0, {&ahead, 1}).code(), StatusCode::kOutOfRange);
  const BatchEntry gap{.seq = s, .first = 21, .count = 1};
  EXPECT_EQ(validate_selection_batch(t, 0, {&gap, 1}).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace cisa
