// Model::load_synthetic: the public shapes it promises, the same weights on every load, a clear
// error for unknown names and oversized contexts, no tokenizer or file (and accessors that stay
// safe), and a tiny synthetic model's forward running dense and CISA: several sequences batched
// equal to separate runs, CISA with a budget covering the context equal to dense, and a small
// budget reading fewer pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cisa/gguf.h"
#include "cisa/model.h"
#include "cisa/tokenizer.h"

namespace cisa {
namespace {

TEST(ModelSynthetic, ShapesOfThePublicModels) {
  const std::vector<std::string> names = synthetic_model_names();
  for (const char* n : {"llama-3.1-8b", "qwen2.5-7b", "tiny-llama"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;

  auto l = synthetic_hparams("llama-3.1-8b");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->n_layer, 32);
  EXPECT_EQ(l->n_embd, 4096);
  EXPECT_EQ(l->n_head, 32);
  EXPECT_EQ(l->n_head_kv, 8);
  EXPECT_EQ(l->head_dim, 128);
  EXPECT_EQ(l->n_ff, 14336);
  EXPECT_EQ(l->n_vocab, 128256);
  EXPECT_EQ(l->n_ctx_train, 131072);
  EXPECT_EQ(l->rope_base, 500000.0f);
  EXPECT_EQ(l->rope_style, RopeStyle::kNorm);
  EXPECT_EQ(l->activation, Activation::kSilu);
  EXPECT_NE(l->name.find("random weights"), std::string::npos);

  auto q = synthetic_hparams("qwen2.5-7b");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->n_layer, 28);
  EXPECT_EQ(q->n_embd, 3584);
  EXPECT_EQ(q->n_head, 28);
  EXPECT_EQ(q->n_head_kv, 4);
  EXPECT_EQ(q->head_dim, 128);
  EXPECT_EQ(q->n_ff, 18944);
  EXPECT_EQ(q->n_vocab, 152064);
  EXPECT_EQ(q->rope_base, 1000000.0f);
  EXPECT_EQ(q->rope_style, RopeStyle::kNeox);
  EXPECT_NE(q->name.find("no q/k/v biases"), std::string::npos);
  for (const auto* h : {&*l, &*q}) {
    EXPECT_EQ(h->n_head * h->head_dim, h->n_embd);
    EXPECT_TRUE(std::none_of(h->layer_swa.begin(), h->layer_swa.end(), [](bool b) { return b; }));
    EXPECT_FLOAT_EQ(h->attn_scale, 1.0f / std::sqrt(128.0f));
  }

  EXPECT_EQ(synthetic_hparams("llama-9").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Model::load_synthetic("llama-9", {}).status().code(), StatusCode::kNotFound);
  // Up to 1M tokens of context, not more; options are checked as for load().
  EXPECT_EQ(Model::load_synthetic("tiny-llama", {.context = (int64_t{1} << 20) + 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(Model::load_synthetic("tiny-llama", {.threads = -2}).ok());
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

// Logits of every row of `tokens` in a fresh sequence.
std::vector<float> run(Model& m, const std::vector<int32_t>& tokens) {
  auto s = m.add_sequence();
  EXPECT_TRUE(s.ok());
  SequenceInput in{.seq = *s, .tokens = tokens, .outputs = OutputMode::kAll};
  std::vector<float> logits;
  const Status st = m.forward({&in, 1}, &logits);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(m.release_sequence(*s).ok());
  return logits;
}

TEST(ModelSynthetic, TinyModelIsDeterministicAndHasNoTokenizer) {
  auto a = Model::load_synthetic("tiny-llama", {.threads = 2, .context = 1024});
  auto b = Model::load_synthetic("tiny-llama", {.threads = 1, .context = 1024});
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok());
  Model& m = **a;
  EXPECT_EQ(m.hparams().n_layer, 2);
  EXPECT_EQ(m.hparams().n_embd, 64);
  EXPECT_EQ(m.context(), 1024);
  EXPECT_NE(m.hparams().name.find("synthetic"), std::string::npos);
  EXPECT_FALSE(m.has_tokenizer());
  EXPECT_FALSE(m.has_file());
  EXPECT_EQ(m.file().tensors().size(), 0u);  // safe placeholders
  EXPECT_LE(m.tokenizer().vocab_size(), 1);
  EXPECT_EQ(m.backend().kind(), BackendKind::kCpu);
  ASSERT_NE(m.cpu_cache(), nullptr);
  EXPECT_EQ(m.cpu_cache()->num_layers(), 2);

  const std::vector<int32_t> toks = random_tokens(70, m.hparams().n_vocab, 1);
  const std::vector<float> la = run(m, toks), lb = run(**b, toks);
  ASSERT_EQ(la.size(), toks.size() * static_cast<size_t>(m.hparams().n_vocab));
  EXPECT_EQ(la, lb);  // same weights whatever the thread count
  EXPECT_TRUE(std::all_of(la.begin(), la.end(), [](float x) { return std::isfinite(x); }));
  // The logits depend on the input (random weights still mix the tokens).
  const std::vector<float> lc = run(m, random_tokens(70, m.hparams().n_vocab, 2));
  EXPECT_NE(la, lc);
  // Out-of-vocabulary tokens are refused before any work.
  std::vector<int32_t> bad = toks;
  bad[5] = m.hparams().n_vocab;
  auto s = *m.add_sequence();
  SequenceInput in{.seq = s, .tokens = bad};
  std::vector<float> logits;
  EXPECT_EQ(m.forward({&in, 1}, &logits).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*m.sequence_length(s), 0);
}

TEST(ModelSynthetic, TinyModelRunsDenseAndCisa) {
  const int n = 600;  // 38 pages
  ModelOptions dense_opt{.threads = 2, .context = 1024, .max_sequences = 2, .prefill_block = 128};
  auto dense = Model::load_synthetic("tiny-llama", dense_opt);
  ASSERT_TRUE(dense.ok());
  const std::vector<int32_t> t1 = random_tokens(n, 256, 3), t2 = random_tokens(200, 256, 4);
  const std::vector<float> d1 = run(**dense, t1), d2 = run(**dense, t2);

  // Two sequences in one call equal separate runs.
  {
    Model& m = **dense;
    SeqId s1 = *m.add_sequence(), s2 = *m.add_sequence();
    SequenceInput in[2] = {{.seq = s1, .tokens = t1, .outputs = OutputMode::kAll},
                           {.seq = s2, .tokens = t2, .outputs = OutputMode::kAll}};
    std::vector<float> both;
    ASSERT_TRUE(m.forward(in, &both).ok());
    std::vector<float> want = d1;
    want.insert(want.end(), d2.begin(), d2.end());
    EXPECT_EQ(both, want);
  }

  ModelOptions cisa_opt = dense_opt;
  cisa_opt.attention.mode = AttentionMode::kCisa;
  cisa_opt.attention.selection = {.budget = 64, .window = 4, .qshare = 8};  // covers the context
  auto full = Model::load_synthetic("tiny-llama", cisa_opt);
  ASSERT_TRUE(full.ok());
  const std::vector<float> f1 = run(**full, t1);
  ASSERT_EQ(f1.size(), d1.size());
  for (size_t i = 0; i < f1.size(); ++i) ASSERT_NEAR(f1[i], d1[i], 1e-5) << i;
  EXPECT_EQ((*full)->stats().global_pages_read, (*full)->stats().global_pages_dense);

  cisa_opt.attention.selection = {.budget = 4, .window = 4, .qshare = 8};
  auto sparse = Model::load_synthetic("tiny-llama", cisa_opt);
  ASSERT_TRUE(sparse.ok());
  const std::vector<float> s1 = run(**sparse, t1);
  EXPECT_TRUE(std::all_of(s1.begin(), s1.end(), [](float x) { return std::isfinite(x); }));
  const ForwardStats& st = (*sparse)->stats();
  EXPECT_EQ(st.tokens, n);
  // SPEC §8's dense count: every position t reads pages 0 … t/16, per KV group and global layer.
  int64_t want_dense = 0;
  for (int64_t t = 0; t < n; ++t) want_dense += t / 16 + 1;
  EXPECT_EQ(st.global_pages_dense, want_dense * 2 * 2);
  EXPECT_LT(st.global_pages_read, st.global_pages_dense / 2);
  // The early rows see fewer pages than the budget and stay exact; later ones differ.
  const size_t V = 256;
  for (size_t i = 0; i < 64 * V; ++i) ASSERT_NEAR(s1[i], d1[i], 1e-5);
  double diff = 0;
  for (size_t i = 0; i < s1.size(); ++i) diff = std::max(diff, double(std::abs(s1[i] - d1[i])));
  EXPECT_GT(diff, 0.0);
}

}  // namespace
}  // namespace cisa
