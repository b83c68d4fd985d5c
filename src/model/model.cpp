// cisa::Model: loading, sequences, and the forward driver that cuts the inputs into steps of at
// most prefill_block rows, embeds them, runs the architecture's layers and writes the requested
// logits.
#include "cisa/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <unordered_set>

#include "model_impl.h"
#include "model_ops.h"

namespace cisa {
namespace {

Status validate_options(const ModelOptions& o) {
  if (o.threads < 0)
    return invalid_argument("threads must be >= 0 (got " + std::to_string(o.threads) + ")");
  if (o.context < 0)
    return invalid_argument("context must be >= 0 (got " + std::to_string(o.context) + ")");
  if (o.max_sequences < 1 || o.max_sequences > 4096)
    return invalid_argument("max_sequences must be in [1, 4096] (got " +
                            std::to_string(o.max_sequences) + ")");
  if (o.prefill_block < 1 || o.prefill_block > 65536)
    return invalid_argument("prefill_block must be in [1, 65536] (got " +
                            std::to_string(o.prefill_block) + ")");
  if (o.attention.dense_layers < 0) return invalid_argument("dense_layers must be >= 0");
  if (o.attention.mode == AttentionMode::kCisa)
    CISA_RETURN_IF_ERROR(validate_selection_params(o.attention.selection));
  return Status::Ok();
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const ModelHparams& Model::hparams() const {
  return impl_->hp;
}
const ModelOptions& Model::options() const {
  return impl_->opt;
}
const Tokenizer& Model::tokenizer() const {
  return *impl_->tok;
}
const GgufFile& Model::file() const {
  return *impl_->file;
}
int64_t Model::context() const {
  return impl_->context;
}
int Model::num_threads() const {
  return impl_->pool.num_threads();
}
const ForwardStats& Model::stats() const {
  return impl_->stats;
}
void Model::reset_stats() {
  impl_->stats = ForwardStats{};
}
void Model::set_attention_tap(AttentionTap tap) {
  impl_->tap = std::move(tap);
}
const PagedKvCache& Model::cache() const {
  return *impl_->cache;
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& options) {
  CISA_RETURN_IF_ERROR(validate_options(options));
  CISA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, read_hparams(file));
  CISA_ASSIGN_OR_RETURN(ModelWeights weights, bind_weights(file, hp, options.weights_f32));
  CISA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(file));
  if (tok.vocab_size() != hp.n_vocab)
    return data_loss("tokenizer has " + std::to_string(tok.vocab_size()) +
                     " tokens but token_embd.weight has " + std::to_string(hp.n_vocab) + " rows");
  const int64_t context = options.context ? options.context : hp.n_ctx_train;
  if (context > hp.n_ctx_train)
    return invalid_argument("context " + std::to_string(context) +
                            " exceeds the model's training context " +
                            std::to_string(hp.n_ctx_train));

  auto impl = std::make_unique<Impl>(options.threads);
  impl->hp = std::move(hp);
  impl->opt = options;
  impl->w = std::move(weights);
  impl->context = context;
  const ModelHparams& h = impl->hp;

  // Which layers run CISA, and the supplied index projections.
  const AttentionOptions& ao = options.attention;
  impl->layer_cisa.assign(static_cast<size_t>(h.n_layer), false);
  for (int l = 0; l < h.n_layer; ++l)
    impl->layer_cisa[static_cast<size_t>(l)] =
        ao.mode == AttentionMode::kCisa && h.is_global(l) && l >= ao.dense_layers;
  impl->index_weights.assign(static_cast<size_t>(h.n_layer),
                             std::vector<const float*>(static_cast<size_t>(h.n_head_kv), nullptr));
  for (const IndexProjection& p : ao.index) {
    if (p.layer < 0 || p.layer >= h.n_layer || p.kv_group < 0 || p.kv_group >= h.n_head_kv)
      return invalid_argument("index projection for layer " + std::to_string(p.layer) +
                              ", KV group " + std::to_string(p.kv_group) + " is out of range (" +
                              std::to_string(h.n_layer) + " layers, " +
                              std::to_string(h.n_head_kv) + " KV groups)");
    if (p.weight.size() != static_cast<size_t>(h.head_dim) * static_cast<size_t>(h.n_embd))
      return invalid_argument("index projection for layer " + std::to_string(p.layer) + " has " +
                              std::to_string(p.weight.size()) +
                              " values, expected head_dim x n_embd = " +
                              std::to_string(int64_t{h.head_dim} * h.n_embd));
    if (!impl->layer_cisa[static_cast<size_t>(p.layer)])
      return invalid_argument(
          "index projection given for layer " + std::to_string(p.layer) +
          ", which does not run CISA (sliding-window, kept dense, or dense mode)");
    const float*& slot =
        impl->index_weights[static_cast<size_t>(p.layer)][static_cast<size_t>(p.kv_group)];
    if (slot)
      return invalid_argument("two index projections for layer " + std::to_string(p.layer) +
                              ", KV group " + std::to_string(p.kv_group));
    slot = p.weight.data();
  }
  // index_weights point into impl->opt's copy, not the caller's options.
  for (const IndexProjection& p : impl->opt.attention.index)
    impl->index_weights[static_cast<size_t>(p.layer)][static_cast<size_t>(p.kv_group)] =
        p.weight.data();

  KvCacheConfig kc;
  kc.num_layers = h.n_layer;
  kc.num_kv_heads = h.n_head_kv;
  kc.head_dim = h.head_dim;
  kc.page_size = 16;
  kc.num_pages = (context + kc.page_size - 1) / kc.page_size * options.max_sequences;
  kc.dtype = options.kv_dtype;
  kc.rep = options.rep;
  kc.rep_layers = impl->layer_cisa;
  CISA_ASSIGN_OR_RETURN(impl->cache, PagedKvCache::create(kc));
  impl->file.emplace(std::move(file));
  impl->tok.emplace(std::move(tok));
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

Result<SeqId> Model::add_sequence() {
  return impl_->cache->add_sequence();
}
Status Model::release_sequence(SeqId seq) {
  return impl_->cache->release_sequence(seq);
}
Result<int64_t> Model::sequence_length(SeqId seq) const {
  return impl_->cache->length(seq);
}

Status Model::Impl::run_layers() {
  for (int l = 0; l < hp.n_layer; ++l) {
    if (hp.arch == ModelArch::kGemma3) {
      CISA_RETURN_IF_ERROR(layer_gemma3(l));
    } else {
      CISA_RETURN_IF_ERROR(layer_llama(l));
    }
  }
  return Status::Ok();
}

Status Model::forward(std::span<const SequenceInput> inputs, std::vector<float>* logits,
                      const ProgressFn& progress) {
  Impl& m = *impl_;
  const ModelHparams& hp = m.hp;
  const auto t_start = std::chrono::steady_clock::now();

  // ---- check everything before touching the cache ----
  int64_t total_rows = 0, n_out = 0, pages_needed = 0;
  std::unordered_set<SeqId> seen;
  std::vector<int64_t> start(inputs.size());
  const int B = m.cache->page_size();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const SequenceInput& in = inputs[i];
    if (!m.cache->has_sequence(in.seq))
      return not_found("forward: sequence " + std::to_string(in.seq) + " does not exist");
    if (!seen.insert(in.seq).second)
      return invalid_argument("forward: sequence " + std::to_string(in.seq) +
                              " appears twice in one call");
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (n == 0) return invalid_argument("forward: input " + std::to_string(i) + " has no tokens");
    for (int32_t id : in.tokens)
      if (id < 0 || id >= hp.n_vocab)
        return out_of_range("forward: token id " + std::to_string(id) +
                            " is outside the vocabulary [0, " + std::to_string(hp.n_vocab) + ")");
    CISA_ASSIGN_OR_RETURN(int64_t len, m.cache->length(in.seq));
    if (len + n > m.context)
      return out_of_range("forward: sequence " + std::to_string(in.seq) + " would hold " +
                          std::to_string(len + n) + " tokens, more than the context of " +
                          std::to_string(m.context));
    start[i] = len;
    pages_needed += (len + n + B - 1) / B - (len + B - 1) / B;
    total_rows += n;
    switch (in.outputs) {
      case OutputMode::kNone:
        break;
      case OutputMode::kLast:
        n_out += 1;
        break;
      case OutputMode::kAll:
        n_out += n;
        break;
      case OutputMode::kPositions:
        for (size_t j = 0; j < in.positions.size(); ++j) {
          const int64_t p = in.positions[j];
          if (p < 0 || p >= n || (j > 0 && p <= in.positions[j - 1]))
            return invalid_argument(
                "forward: output positions must be strictly ascending indices into the input's " +
                std::to_string(n) + " tokens (bad value " + std::to_string(p) + ")");
        }
        n_out += static_cast<int64_t>(in.positions.size());
        break;
    }
  }
  if (pages_needed > m.cache->free_pages())
    return resource_exhausted("forward: needs " + std::to_string(pages_needed) + " KV pages but " +
                              std::to_string(m.cache->free_pages()) + " are free");
  if (n_out > 0 && !logits)
    return invalid_argument("forward: logits requested but no output vector given");
  if (logits) logits->assign(static_cast<size_t>(n_out) * static_cast<size_t>(hp.n_vocab), 0.0f);

  // ---- steps ----
  const int E = hp.n_embd, d = hp.head_dim;
  StepState& st = m.st;
  std::vector<int64_t> done(inputs.size(), 0);
  std::vector<int32_t> row_token;
  std::vector<int64_t> out_rows;  // step rows whose logits are wanted, in output order
  std::vector<float> xo;
  int64_t out_written = 0, rows_done = 0;
  size_t cur = 0;
  const bool any_swa =
      std::find(hp.layer_swa.begin(), hp.layer_swa.end(), true) != hp.layer_swa.end();
  while (cur < inputs.size()) {
    st.batch.clear();
    row_token.clear();
    out_rows.clear();
    int64_t budget = m.opt.prefill_block;
    while (cur < inputs.size() && budget > 0) {
      const SequenceInput& in = inputs[cur];
      const int64_t n = static_cast<int64_t>(in.tokens.size());
      const int64_t c = std::min(budget, n - done[cur]);
      const int64_t row0 = static_cast<int64_t>(row_token.size());
      st.batch.push_back(
          {.seq = in.seq, .first = start[cur] + done[cur], .count = static_cast<int32_t>(c)});
      for (int64_t j = 0; j < c; ++j) {
        const int64_t idx = done[cur] + j;
        row_token.push_back(in.tokens[static_cast<size_t>(idx)]);
        bool want =
            in.outputs == OutputMode::kAll || (in.outputs == OutputMode::kLast && idx == n - 1);
        if (in.outputs == OutputMode::kPositions)
          want = std::binary_search(in.positions.begin(), in.positions.end(), idx);
        if (want) out_rows.push_back(row0 + j);
      }
      done[cur] += c;
      budget -= c;
      if (done[cur] == n) ++cur;
    }
    const int64_t rows = static_cast<int64_t>(row_token.size());
    st.rows = rows;
    for (const BatchEntry& e : st.batch) CISA_RETURN_IF_ERROR(m.cache->reserve(e.seq, e.count));

    const size_t R = static_cast<size_t>(rows);
    st.pos.resize(R);
    st.x.resize(R * E);
    st.xn.resize(R * E);
    st.o.resize(R * E);
    st.q.resize(R * hp.n_head * d);
    st.att.resize(R * hp.n_head * d);
    st.k.resize(R * hp.n_head_kv * d);
    st.v.resize(R * hp.n_head_kv * d);
    st.gate.resize(R * hp.n_ff);
    st.up.resize(R * hp.n_ff);
    st.index_q.resize(R * hp.n_head_kv * d);
    st.proj.resize(R * d);
    {
      size_t r = 0;
      for (const BatchEntry& e : st.batch)
        for (int32_t j = 0; j < e.count; ++j) st.pos[r++] = e.first + j;
    }
    // Embeddings, scaled (Gemma multiplies by sqrt(n_embd)).
    const WeightView& emb = m.w.tok_embd;
    m.for_rows(rows, [&](int64_t r) {
      float* x = st.x.data() + r * E;
      (void)dequantize_row(emb.type, emb.row(row_token[static_cast<size_t>(r)]), x,
                           E);  // type checked at load
      if (hp.embed_scale != 1.0f)
        for (int i = 0; i < E; ++i) x[i] *= hp.embed_scale;
    });
    // RoPE angle tables for this step's positions, one per base in use.
    for (int t = 0; t < 2; ++t) {
      if (t == 1 && !any_swa) continue;
      const double base = t == 0 ? hp.rope_base : hp.rope_base_swa;
      st.rope_cos[t].resize(R * (d / 2));
      st.rope_sin[t].resize(R * (d / 2));
      m.for_rows(rows, [&](int64_t r) {
        ops::rope_table(&st.pos[static_cast<size_t>(r)], 1, d, base,
                        st.rope_cos[t].data() + r * (d / 2), st.rope_sin[t].data() + r * (d / 2));
      });
    }
    st.global_planned = st.swa_planned = false;
    CISA_RETURN_IF_ERROR(m.run_layers());

    // Final norm and logits for the wanted rows only (the output matrix is the largest one).
    if (!out_rows.empty()) {
      const int64_t no = static_cast<int64_t>(out_rows.size());
      xo.resize(static_cast<size_t>(no) * E);
      m.for_rows(no, [&](int64_t i) {
        ops::rms_norm(st.x.data() + out_rows[static_cast<size_t>(i)] * E, m.w.output_norm.data(),
                      xo.data() + i * E, E, hp.rms_eps);
      });
      CISA_RETURN_IF_ERROR(matmul(m.w.output, xo.data(), logits->data() + out_written * hp.n_vocab,
                                  no, m.pool, &m.mm));
      out_written += no;
    }
    rows_done += rows;
    m.stats.tokens += rows;
    m.stats.steps += 1;
    if (progress) progress(rows_done, total_rows);
  }
  m.stats.seconds_total +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return Status::Ok();
}

}  // namespace cisa
