// CISA generation on the real models with calibrated-style index projections: with a budget that
// covers every eligible chunk, greedy generation equals dense generation token for token (SPEC §5:
// k ≥ every eligible count gives dense attention); with a small budget it reads fewer pages.
// Skipped when the model files are absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "cisa/model/tokenizer.h"

namespace cisa {
namespace {

struct Case {
  const char* name;
  const char* file;
};

std::string text_prompt() {
  // The public-domain opening of Pride and Prejudice, numbered and repeated to about 700 tokens
  // (44 pages: far more than the 4-page window).
  std::string s;
  for (int i = 0; i < 14; ++i)
    s += "It is a truth universally acknowledged, that a single man in possession of a good "
         "fortune, must be in "
         "want of a wife. However little known the feelings or views of such a man may be on his "
         "first entering a "
         "neighbourhood, this truth is so well fixed in the minds of the surrounding families. "
         "Chapter " +
         std::to_string(i + 1) + ". ";
  return s;
}

struct Generation {
  std::vector<int32_t> tokens;
  ForwardStats decode;  // counters of the decode steps only
};

Generation generate(const std::string& path, const ModelOptions& o,
                    const std::vector<int32_t>& prompt, int n) {
  Generation g;
  auto model = Model::load(path, o);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return g;
  auto seq = (*model)->add_sequence();
  EXPECT_TRUE(seq.ok());
  std::vector<float> logits;
  SequenceInput in{.seq = *seq, .tokens = prompt};
  EXPECT_TRUE((*model)->forward({&in, 1}, &logits).ok());
  (*model)->reset_stats();
  for (int i = 0; i < n; ++i) {
    g.tokens.push_back(argmax(logits));
    SequenceInput step{.seq = *seq, .tokens = {&g.tokens.back(), 1}};
    Status s = (*model)->forward({&step, 1}, &logits);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) break;
  }
  g.decode = (*model)->stats();
  return g;
}

class CisaGeneration : public ::testing::TestWithParam<Case> {};

TEST_P(CisaGeneration, FullBudgetEqualsDenseTokenForToken) {
  const std::string path = std::string(CISA_SOURCE_DIR) + "/models/" + GetParam().file;
  auto file = GgufFile::open(path);
  if (!file.ok()) GTEST_SKIP() << GetParam().name << " is absent";
  auto hp = read_model_hparams(*file);
  auto tok = Tokenizer::from_gguf(*file);
  auto id = model_identity(*file);
  ASSERT_TRUE(hp.ok() && tok.ok() && id.ok());
  const std::vector<int32_t> prompt = tok->encode(text_prompt(), true);
  ASSERT_GT(prompt.size(), 600u);

  // An indexer choosing a head candidate in every group (so the supplied-projection path runs)
  // except group 0 of the first global layer (the mean, the model's default).
  Indexer idx;
  idx.model = *id;
  idx.settings = {.budget = 4, .window = 4};
  const int hg = hp->heads_per_group();
  bool first = true;
  for (int l = 0; l < hp->n_layer; ++l) {
    if (!hp->is_global(l)) continue;
    for (int g = 0; g < hp->n_head_kv; ++g) {
      GroupCalibration gc{.layer = l, .kv_group = g};
      for (int c = 0; c < hg; ++c) gc.candidates.push_back({.head = g * hg + c});
      gc.candidates.push_back({.head = -1});
      gc.chosen = first ? hg : (l + g) % hg;
      first = false;
      idx.groups.push_back(gc);
    }
  }
  std::vector<bool> cisa_layers(static_cast<size_t>(hp->n_layer));
  for (int l = 0; l < hp->n_layer; ++l) cisa_layers[static_cast<size_t>(l)] = hp->is_global(l);
  auto proj = indexer_projections(idx, *file, *hp, cisa_layers);
  ASSERT_TRUE(proj.ok()) << proj.status().to_string();
  ASSERT_FALSE(proj->empty());

  ModelOptions dense{.threads = 2, .context = 1024, .prefill_block = 256};
  ModelOptions full = dense;
  full.attention.mode = AttentionMode::kCisa;
  full.attention.selection = {
      .budget = 64, .window = 4, .qshare = 16};  // 64 ≥ every eligible count
  full.attention.index = *proj;
  const int n = 12;
  const Generation a = generate(path, dense, prompt, n);
  const Generation b = generate(path, full, prompt, n);
  ASSERT_EQ(a.tokens.size(), static_cast<size_t>(n));
  EXPECT_EQ(a.tokens, b.tokens) << tok->decode(a.tokens) << " | " << tok->decode(b.tokens);
  EXPECT_EQ(b.decode.global_pages_read, b.decode.global_pages_dense);

  // A budget below the eligible count reads fewer pages per decode step: k + W + the current page
  // (prefill with G = 16 gives every group its own page list, so at 44 pages it reads more).
  ModelOptions sparse = full;
  sparse.attention.selection.budget = 4;
  const Generation c = generate(path, sparse, prompt, 4);
  EXPECT_EQ(c.tokens.size(), 4u);
  const int n_cisa = static_cast<int>(cisa_layers.size() -
                                      std::count(cisa_layers.begin(), cisa_layers.end(), false));
  // 4 decode steps × CISA layers × KV groups × (k + the W + 1 pages c(t) − W … c(t)).
  EXPECT_EQ(c.decode.global_pages_read, int64_t{4} * n_cisa * hp->n_head_kv * (4 + 4 + 1));
  EXPECT_GT(c.decode.global_pages_dense, 4 * c.decode.global_pages_read);
}

INSTANTIATE_TEST_SUITE_P(Models, CisaGeneration,
                         ::testing::Values(Case{"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
                                           Case{"gemma3", "gemma-3-270m-q4_k_m.gguf"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cisa
