// Model::load_synthetic: the public shapes it promises, the same weights on every load, a clear
// error for unknown names and oversized contexts, no tokenizer or file (and accessors that stay
// safe), and a tiny synthetic model's forward running dense and CISA: several sequences batched
// equal to separate runs, CISA with a budget covering the context equal to dense, and a small
// budget reading fewer pages; and the same model on a backend that is not the CPU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cisa/model/tokenizer.h"
#include "test_util.h"

namespace cisa {
namespace {

TEST(ModelSynthetic, ShapesOfThePublicModels) {
  const std::vector<std::string> names = synthetic_model_names();
  for (const char* n : {"llama-3.1-8b", "qwen2.5-7b", "tiny-llama"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;

  // The published shapes (the models' config.json), one row per synthetic model.
  struct Shape {
    const char* name;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    float rope_base;
    RopeStyle rope_style;
    const char* label_part;  // a phrase the name must carry
  };
  const Shape shapes[] = {
      {"llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0f, RopeStyle::kNorm,
       "random weights"},
      {"qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 1000000.0f, RopeStyle::kNeox,
       "no q/k/v biases"},
  };
  for (const Shape& e : shapes) {
    SCOPED_TRACE(e.name);
    auto h = synthetic_hparams(e.name);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->n_layer, e.n_layer);
    EXPECT_EQ(h->n_embd, e.n_embd);
    EXPECT_EQ(h->n_head, e.n_head);
    EXPECT_EQ(h->n_head_kv, e.n_head_kv);
    EXPECT_EQ(h->head_dim, e.head_dim);
    EXPECT_EQ(h->n_ff, e.n_ff);
    EXPECT_EQ(h->n_vocab, e.n_vocab);
    EXPECT_EQ(h->rope_base, e.rope_base);
    EXPECT_EQ(h->rope_style, e.rope_style);
    EXPECT_EQ(h->activation, Activation::kSilu);
    EXPECT_NE(h->name.find(e.label_part), std::string::npos);
    EXPECT_EQ(h->n_head * h->head_dim, h->n_embd);
    EXPECT_TRUE(std::none_of(h->layer_swa.begin(), h->layer_swa.end(), [](bool b) { return b; }));
    EXPECT_FLOAT_EQ(h->attn_scale, 1.0f / std::sqrt(128.0f));
  }
  EXPECT_EQ(synthetic_hparams("llama-3.1-8b")->n_ctx_train, 131072);

  EXPECT_EQ(synthetic_hparams("llama-9").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Model::load_synthetic("llama-9", {}).status().code(), StatusCode::kNotFound);
  // Up to 2M tokens of context (a 1M prompt and its output), not more; options are checked as
  // for load(); a model larger than the backend's free memory is refused before allocating.
  EXPECT_EQ(
      Model::load_synthetic("tiny-llama", {.context = (int64_t{1} << 21) + 1}).status().code(),
      StatusCode::kInvalidArgument);
  const auto big =
      Model::load_synthetic("qwen2.5-7b", {.context = int64_t{1} << 20, .max_sequences = 64});
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("KV cache"), std::string::npos) << big.status().message();
  EXPECT_FALSE(Model::load_synthetic("tiny-llama", {.threads = -2}).ok());

  // A cut to the first layers keeps every per-layer shape and says so in the name.
  const auto cut = synthetic_hparams("qwen2.5-7b", 4);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->n_layer, 4);
  EXPECT_EQ(cut->layer_swa.size(), 4u);
  EXPECT_EQ(cut->n_embd, 3584);
  EXPECT_NE(cut->name.find("first 4 of 28 layers"), std::string::npos) << cut->name;
  EXPECT_EQ(synthetic_hparams("qwen2.5-7b", 28)->name, synthetic_hparams("qwen2.5-7b")->name);
  EXPECT_EQ(synthetic_hparams("qwen2.5-7b", 29).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(synthetic_hparams("qwen2.5-7b", -1).status().code(), StatusCode::kInvalidArgument);
  auto one = Model::load_synthetic("tiny-llama", {.context = 256}, 1);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ((*one)->hparams().n_layer, 1);
}

using test::random_tokens;

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
  EXPECT_EQ(m.tokenizer().vocab_size(), 1);
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

// The CPU backend under another name: the model then takes the paths of a non-CPU backend
// (logits through a backend buffer and download, no host cache for taps and selectors).
class DisguisedBackend final : public Backend {
 public:
  explicit DisguisedBackend(std::unique_ptr<Backend> in) : in_(std::move(in)) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string description() const override { return "disguised cpu"; }
  Result<std::unique_ptr<BackendBuffer>> allocate(int64_t b, const char* w) override {
    return in_->allocate(b, w);
  }
  Status upload(void* d, const void* s, int64_t b) override { return in_->upload(d, s, b); }
  Status download(void* d, const void* s, int64_t b) override { return in_->download(d, s, b); }
  Status synchronize() override { return in_->synchronize(); }
  int64_t free_memory() const override { return in_->free_memory(); }
  Result<BackendMatrix> bind_matrix(const WeightView& w) override { return in_->bind_matrix(w); }
  Result<BackendMatrix> random_matrix(int64_t r, int64_t c, uint64_t seed, float sc) override {
    return in_->random_matrix(r, c, seed, sc);
  }
  Result<BackendMatrix> bind_owned_matrix(std::vector<float> v, int64_t r, int64_t c) override {
    return in_->bind_owned_matrix(std::move(v), r, c);
  }
  Status read_matrix_rows(const BackendMatrix& m, int64_t r0, int64_t rows, float* o) override {
    return in_->read_matrix_rows(m, r0, rows, o);
  }
  Result<const float*> bind_vector(std::span<const float> v) override {
    return in_->bind_vector(v);
  }
  int64_t weight_bytes() const override { return in_->weight_bytes(); }
  Status embed(const BackendMatrix& t, const int32_t* tok, int64_t rows, float sc,
               float* x) override {
    return in_->embed(t, tok, rows, sc, x);
  }
  Status matmul(const BackendMatrix& w, const float* x, float* y, int64_t rows,
                int64_t ldy) override {
    return in_->matmul(w, x, y, rows, ldy);
  }
  Status rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                  float eps) override {
    return in_->rms_norm(x, w, y, rows, n, eps);
  }
  Status rope(float* x, int64_t rows, int heads, int d, const float* c, const float* s,
              RopeStyle st) override {
    return in_->rope(x, rows, heads, d, c, s, st);
  }
  Status gated_activation(Activation a, const float* g, const float* u, float* o, int64_t rows,
                          int64_t n) override {
    return in_->gated_activation(a, g, u, o, rows, n);
  }
  Status add(float* y, const float* x, int64_t n) override { return in_->add(y, x, n); }
  Status round_f16(float* x, int64_t n) override { return in_->round_f16(x, n); }
  Status mean_heads(const float* q, int64_t rows, int hq, int hkv, int d, float* o) override {
    return in_->mean_heads(q, rows, hq, hkv, d, o);
  }
  Status fill_random(float* x, int64_t n, uint64_t seed, float sc) override {
    return in_->fill_random(x, n, seed, sc);
  }
  Status gather_rows(const float* x, std::span<const int64_t> r, int64_t w, float* o) override {
    return in_->gather_rows(x, r, w, o);
  }
  Status create_cache(const KvCacheConfig& c) override { return in_->create_cache(c); }
  const KvCacheConfig& cache_config() const override { return in_->cache_config(); }
  const PageTable& pages() const override { return in_->pages(); }
  Result<SeqId> add_sequence() override { return in_->add_sequence(); }
  Status release_sequence(SeqId s) override { return in_->release_sequence(s); }
  Status reserve(SeqId s, int64_t n) override { return in_->reserve(s, n); }
  Status append_kv(int l, std::span<const BatchEntry> b, const float* k, const float* v) override {
    return in_->append_kv(l, b, k, v);
  }
  Status plan(PlanSlot s, std::span<const BatchEntry> b, const PlanSpec& p) override {
    return in_->plan(s, b, p);
  }
  const std::vector<QueryGroup>& plan_groups(PlanSlot s) const override {
    return in_->plan_groups(s);
  }
  Status select(PlanSlot s, int l, const float* iq) override { return in_->select(s, l, iq); }
  Status page_lists(PlanSlot s, PageLists* l) override { return in_->page_lists(s, l); }
  Status set_page_lists(PlanSlot s, const PageLists& l) override {
    return in_->set_page_lists(s, l);
  }
  Status attend(PlanSlot s, int l, const float* q, int hq, const AttendParams& p,
                float* o) override {
    return in_->attend(s, l, q, hq, p, o);
  }

 private:
  std::unique_ptr<Backend> in_;
};

TEST(ModelSynthetic, AnotherBackendGivesTheSameLogitsAndRefusesCpuOnlyFeatures) {
  ModelOptions o{.threads = 2, .context = 512};
  o.attention.mode = AttentionMode::kCisa;
  o.attention.selection = {.budget = 4, .window = 2, .qshare = 4};
  auto cpu = Model::load_synthetic("tiny-llama", o);
  ModelOptions od = o;
  od.backend = [](const BackendOptions& bo) -> Result<std::unique_ptr<Backend>> {
    CISA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> in, make_cpu_backend(bo));
    return std::unique_ptr<Backend>(new DisguisedBackend(std::move(in)));
  };
  auto other = Model::load_synthetic("tiny-llama", od);
  ASSERT_TRUE(cpu.ok() && other.ok()) << other.status().message();
  EXPECT_EQ((*other)->backend().kind(), BackendKind::kCuda);
  EXPECT_EQ((*other)->cpu_cache(), nullptr);
  const std::vector<int32_t> toks = random_tokens(300, 256, 8);
  EXPECT_EQ(run(**cpu, toks), run(**other, toks));
  EXPECT_EQ((*cpu)->stats().global_pages_read, (*other)->stats().global_pages_read);

  // A tap needs the CPU cache: forward refuses before any work.
  (*other)->set_attention_tap([](const AttentionTapData&) { return Status::Ok(); });
  SeqId s = *(*other)->add_sequence();
  SequenceInput in{.seq = s, .tokens = toks};
  std::vector<float> logits;
  EXPECT_EQ((*other)->forward({&in, 1}, &logits).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*(*other)->sequence_length(s), 0);
  (*other)->set_attention_tap({});
  EXPECT_TRUE((*other)->forward({&in, 1}, &logits).ok());

  ModelOptions sel = od;
  sel.attention.selector = [](const PageSelectorInput&, PageLists*) { return Status::Ok(); };
  EXPECT_EQ(Model::load_synthetic("tiny-llama", sel).status().code(), StatusCode::kInvalidArgument);
  ModelOptions num = od;
  num.attention_numerics = AttentionNumerics::kLlamaCpp;
  EXPECT_EQ(Model::load_synthetic("tiny-llama", num).status().code(), StatusCode::kInvalidArgument);
}

// Batch invariance is a CUDA backend mode (BackendOptions::batch_invariant); the CPU backend
// refuses it with a reason rather than run without it.
TEST(ModelSynthetic, CpuBackendRefusesBatchInvariance) {
  auto m = Model::load_synthetic("tiny-llama", {.context = 256, .batch_invariant = true});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("CUDA backend"), std::string::npos) << m.status().message();
}

// Mixed tiles are a CUDA planner option (BackendOptions::mixed_tiles); the CPU backend refuses
// them with a reason rather than silently ignore them.
TEST(ModelSynthetic, CpuBackendRefusesMixedTiles) {
  auto m = Model::load_synthetic("tiny-llama", {.context = 256, .mixed_tiles = true});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("CUDA backend"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace cisa
