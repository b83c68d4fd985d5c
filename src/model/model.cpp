// cisa::Model: loading, sequences, and the forward driver that cuts the inputs into steps of at
// most prefill_block rows, embeds them, runs the architecture's layers and writes the requested
// logits.
#include "cisa/model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <unordered_set>

#include "cisa/core/thread_pool.h"
#include "model_impl.h"
#include "model_ops.h"

namespace cisa {

Status validate_model_options(const ModelOptions& o) {
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
  if (o.attention.dense_last_layers < 0)
    return invalid_argument("dense_last_layers must be >= 0 (got " +
                            std::to_string(o.attention.dense_last_layers) + ")");
  if (o.attention.mode == AttentionMode::kCisa)
    CISA_RETURN_IF_ERROR(validate_selection_params(o.attention.selection));
  return Status::Ok();
}

Result<std::vector<int64_t>> split_layer_budgets(int64_t k, const std::vector<bool>& cisa,
                                                 std::span<const double> weights) {
  if (weights.size() != cisa.size())
    return invalid_argument("layer budget weights: " + std::to_string(weights.size()) +
                            " weights for a model of " + std::to_string(cisa.size()) + " layers");
  double sum = 0;
  int64_t n_cisa = 0;
  for (size_t l = 0; l < weights.size(); ++l) {
    if (!std::isfinite(weights[l]) || weights[l] < 0)
      return invalid_argument("layer budget weights: layer " + std::to_string(l) + " has weight " +
                              std::to_string(weights[l]) + " (must be finite and >= 0)");
    if (cisa[l]) sum += weights[l], ++n_cisa;
  }
  std::vector<int64_t> out(cisa.size(), 0);
  if (n_cisa == 0) return out;
  if (!(sum > 0))
    return invalid_argument("layer budget weights: the CISA layers' weights sum to 0");
  // Largest remainder: floors first, then +1 by descending remainder (ties to the lower layer).
  const int64_t total = k * n_cisa;
  int64_t given = 0;
  std::vector<std::pair<double, size_t>> rem;
  for (size_t l = 0; l < cisa.size(); ++l) {
    if (!cisa[l]) continue;
    const double share = static_cast<double>(total) * (weights[l] / sum);
    out[l] = std::min(total, static_cast<int64_t>(std::floor(share)));
    given += out[l];
    rem.push_back({share - static_cast<double>(out[l]), l});
  }
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < total; i = (i + 1) % rem.size()) ++out[rem[i].second], ++given;
  for (size_t i = rem.size(); given > total && i-- > 0;)  // rounding overshoot (never in practice)
    if (out[rem[i].second] > 0) --out[rem[i].second], --given;
  return out;
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const ModelHparams& Model::hparams() const {
  return impl_->hp;
}
const ModelOptions& Model::options() const {
  return impl_->opt;
}
bool Model::has_tokenizer() const {
  return impl_->tok.has_value();
}
const Tokenizer& Model::tokenizer() const {
  if (impl_->tok) return *impl_->tok;
  static const Tokenizer* const kNone = [] {
    Result<Tokenizer> t = Tokenizer::from_spec({.tokens = {"<unk>"}, .unk_id = 0});
    return t.ok() ? new Tokenizer(std::move(*t)) : nullptr;
  }();
  return *kNone;
}
bool Model::has_file() const {
  return impl_->file.has_value();
}
const GgufFile& Model::file() const {
  if (impl_->file) return *impl_->file;
  // A GGUF v3 header with no tensors and no metadata.
  static const uint8_t kEmpty[24] = {'G', 'G', 'U', 'F', 3};
  static const GgufFile* const kNone = [] {
    Result<GgufFile> f = GgufFile::parse(kEmpty);
    return f.ok() ? new GgufFile(std::move(*f)) : nullptr;
  }();
  return *kNone;
}
int64_t Model::context() const {
  return impl_->context;
}
int Model::num_threads() const {
  if (ThreadPool* p = impl_->be->cpu_pool()) return p->num_threads();
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return impl_->opt.threads > 0 ? impl_->opt.threads : std::max(1, hw);
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
const PagedKvCache* Model::cpu_cache() const {
  return impl_->be->cpu_cache();
}
Backend& Model::backend() {
  return *impl_->be;
}

Status ensure_buffer(Backend& be, BufferPtr& b, int64_t bytes, const char* what) {
  if (b && b->bytes() >= bytes) return Status::Ok();
  b.reset();
  CISA_ASSIGN_OR_RETURN(b, be.allocate(bytes, what));
  return Status::Ok();
}

Status Model::Impl::make_backend() {
  const BackendOptions bo{.threads = opt.threads,
                          .bf16_matmul = opt.bf16_matmul,
                          .batch_invariant = opt.batch_invariant,
                          .mixed_tiles = opt.mixed_tiles};
  CISA_ASSIGN_OR_RETURN(be, opt.backend ? opt.backend(bo) : make_cpu_backend(bo));
  if (!be) return invalid_argument("ModelOptions::backend returned no backend");
  if (be->kind() != BackendKind::kCpu) {
    const std::string on =
        std::string(" needs the CPU backend (this model runs on ") + be->description() + ")";
    if (opt.attention.selector) return invalid_argument("a page selector" + on);
    if (opt.attention_numerics == AttentionNumerics::kLlamaCpp)
      return invalid_argument("llama.cpp attention numerics" + on);
    if (opt.bf16_matmul)
      return invalid_argument(
          "ModelOptions::bf16_matmul (the CPU's copy of the CUDA backend's "
          "rounding)" +
          on);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& options) {
  CISA_RETURN_IF_ERROR(validate_model_options(options));
  CISA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path, {.load = options.weights_load}));
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, read_hparams(file));
  const int64_t context = options.context ? options.context : hp.n_ctx_train;
  if (context > hp.n_ctx_train)
    return invalid_argument("context " + std::to_string(context) +
                            " exceeds the model's training context " +
                            std::to_string(hp.n_ctx_train));
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  CISA_RETURN_IF_ERROR(impl->make_backend());
  CISA_RETURN_IF_ERROR(
      admit_model_memory(hp, options, context, *impl->be, /*weights_in_file=*/true));
  CISA_ASSIGN_OR_RETURN(impl->w, bind_weights(file, hp, options.weights_f32, *impl->be));
  CISA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(file));
  if (tok.vocab_size() != hp.n_vocab)
    return data_loss("tokenizer has " + std::to_string(tok.vocab_size()) +
                     " tokens but token_embd.weight has " + std::to_string(hp.n_vocab) + " rows");
  impl->hp = std::move(hp);
  impl->context = context;
  CISA_RETURN_IF_ERROR(impl->setup_attention_and_cache());
  impl->file.emplace(std::move(file));
  impl->tok.emplace(std::move(tok));
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

Status Model::Impl::setup_attention_and_cache() {
  const ModelHparams& h = hp;
  // Which layers run CISA, and the supplied index projections.
  const AttentionOptions& ao = opt.attention;
  layer_cisa.assign(static_cast<size_t>(h.n_layer), false);
  for (int l : ao.dense_layer_set)
    if (l < 0 || l >= h.n_layer)
      return invalid_argument("dense layer " + std::to_string(l) + " is outside the model's " +
                              std::to_string(h.n_layer) + " layers");
  for (int l = 0; l < h.n_layer; ++l)
    layer_cisa[static_cast<size_t>(l)] =
        ao.mode == AttentionMode::kCisa && h.is_global(l) && l >= ao.dense_layers &&
        l < h.n_layer - ao.dense_last_layers &&
        std::find(ao.dense_layer_set.begin(), ao.dense_layer_set.end(), l) ==
            ao.dense_layer_set.end();
  if (!ao.layer_budget_weights.empty() && ao.mode == AttentionMode::kCisa) {
    // Checks the weights against this model's CISA layers (the split itself is per step).
    CISA_RETURN_IF_ERROR(
        split_layer_budgets(ao.selection.budget, layer_cisa, ao.layer_budget_weights).status());
    if (be->kind() != BackendKind::kCpu)
      return unimplemented(
          "per-layer budgets (AttentionOptions::layer_budget_weights) run on the CPU backend "
          "only: each CISA layer is planned with its own budget, and the CUDA backend plans one "
          "CISA slot per step");
  }
  std::vector<std::vector<const IndexProjection*>> supplied(
      static_cast<size_t>(h.n_layer),
      std::vector<const IndexProjection*>(static_cast<size_t>(h.n_head_kv), nullptr));
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
    if (!layer_cisa[static_cast<size_t>(p.layer)]) {
      // An indexer covers every global layer; a global layer the options keep dense (dense_layers,
      // dense_last_layers, dense_layer_set) simply leaves its projection unused.
      if (ao.mode == AttentionMode::kCisa && h.is_global(p.layer)) continue;
      return invalid_argument("index projection given for layer " + std::to_string(p.layer) +
                              ", which does not run CISA (sliding-window, or dense mode)");
    }
    const IndexProjection*& slot =
        supplied[static_cast<size_t>(p.layer)][static_cast<size_t>(p.kv_group)];
    if (slot)
      return invalid_argument("two index projections for layer " + std::to_string(p.layer) +
                              ", KV group " + std::to_string(p.kv_group));
    slot = &p;
  }
  CISA_RETURN_IF_ERROR(bind_index_projections(supplied));

  KvCacheConfig kc;
  kc.num_layers = h.n_layer;
  kc.num_kv_heads = h.n_head_kv;
  kc.head_dim = h.head_dim;
  kc.page_size = 16;
  kc.num_pages = (context + kc.page_size - 1) / kc.page_size * opt.max_sequences;
  kc.dtype = opt.kv_dtype;
  kc.rep = opt.rep;
  kc.rep_precision = opt.rep_precision;
  kc.rep_layers = layer_cisa;
  return be->create_cache(kc);
}

Status Model::Impl::bind_index_projections(
    const std::vector<std::vector<const IndexProjection*>>& supplied) {
  const int d = hp.head_dim, hq = hp.n_head, hkv = hp.n_head_kv;
  const int64_t E = hp.n_embd;
  const int hg = hq / hkv;
  const float inv = 1.0f / static_cast<float>(hg);
  index_m.assign(static_cast<size_t>(hp.n_layer), BackendMatrix{});
  std::vector<float> wq;  // the layer's W_q as the backend multiplies by it, read on first need
  for (int l = 0; l < hp.n_layer; ++l) {
    if (!layer_cisa[static_cast<size_t>(l)]) continue;
    std::vector<float> m(static_cast<size_t>(int64_t{hkv} * d * E));
    wq.clear();
    for (int g = 0; g < hkv; ++g) {
      float* out = m.data() + int64_t{g} * d * E;
      if (const IndexProjection* p = supplied[static_cast<size_t>(l)][static_cast<size_t>(g)]) {
        std::copy(p->weight.begin(), p->weight.end(), out);
        continue;
      }
      // W̃_g = the mean of the group's query-head blocks of W_q, so that W̃_g x is the mean of
      // the group's projected query heads (summed in head order, then scaled, as mean_heads).
      if (wq.empty()) {
        const BackendMatrix& w_q = w.layers[static_cast<size_t>(l)].wq;
        wq.resize(static_cast<size_t>(w_q.n_rows * w_q.n_cols));
        CISA_RETURN_IF_ERROR(be->read_matrix_rows(w_q, 0, w_q.n_rows, wq.data()));
      }
      for (int64_t i = 0; i < int64_t{d} * E; ++i) {
        float sum = 0.0f;
        for (int h = 0; h < hg; ++h)
          sum += wq[static_cast<size_t>(int64_t{g * hg + h} * d * E + i)];
        out[i] = sum * inv;
      }
    }
    CISA_ASSIGN_OR_RETURN(index_m[static_cast<size_t>(l)],
                          be->bind_owned_matrix(std::move(m), int64_t{hkv} * d, E));
  }
  return Status::Ok();
}

Result<SeqId> Model::add_sequence() {
  CISA_ASSIGN_OR_RETURN(SeqId seq, impl_->be->add_sequence());
  impl_->seq_traffic[seq] = SequenceTraffic{};
  return seq;
}
Status Model::release_sequence(SeqId seq) {
  CISA_RETURN_IF_ERROR(impl_->be->release_sequence(seq));
  impl_->seq_traffic.erase(seq);
  return Status::Ok();
}
Result<SequenceTraffic> Model::sequence_traffic(SeqId seq) const {
  auto it = impl_->seq_traffic.find(seq);
  if (it == impl_->seq_traffic.end())
    return not_found("sequence " + std::to_string(seq) + " is not held");
  return it->second;
}
Result<int64_t> Model::sequence_length(SeqId seq) const {
  return impl_->be->pages().length(seq);
}

Status Model::Impl::run_layers() {
  st.xn_ready = false;
  for (int l = 0; l < hp.n_layer; ++l) {
    if (hp.arch == ModelArch::kGemma3) {
      CISA_RETURN_IF_ERROR(layer_gemma3(l));
    } else {
      CISA_RETURN_IF_ERROR(layer_llama(l));
    }
  }
  return Status::Ok();
}

Status Model::Impl::start_layer(int layer) {
  if (st.xn_ready) {
    st.xn_ready = false;
    return Status::Ok();
  }
  return be->rms_norm(st.x->f32(), w.layers[static_cast<size_t>(layer)].attn_norm, st.xn->f32(),
                      st.rows, hp.n_embd, hp.rms_eps);
}

Status Model::Impl::finish_layer(int layer) {
  float* const x = st.x->f32();
  const float* const o = st.o->f32();
  if (layer + 1 >= hp.n_layer) return be->add(x, o, st.rows * hp.n_embd);
  CISA_RETURN_IF_ERROR(be->add_rms_norm(x, o, w.layers[static_cast<size_t>(layer) + 1].attn_norm,
                                        st.xn->f32(), st.rows, hp.n_embd, hp.rms_eps));
  st.xn_ready = true;
  return Status::Ok();
}

bool Model::has_cisa_layers() const {
  const std::vector<bool>& c = impl_->layer_cisa;
  return std::find(c.begin(), c.end(), true) != c.end();
}

Status Model::forward(std::span<const SequenceInput> inputs, std::vector<float>* logits,
                      const ProgressFn& progress, const StepAttention* attention) {
  return forward(inputs, ForwardOutputs{.logits = logits}, progress, attention);
}

Status Model::forward(std::span<const SequenceInput> inputs, const ForwardOutputs& out,
                      const ProgressFn& progress, const StepAttention* attention) {
  Impl& m = *impl_;
  // A mapped GGUF truncated since the last step would end in SIGBUS at the next weight read.
  if (m.file) CISA_RETURN_IF_ERROR(m.file->check_file());
  std::vector<float>* const logits = out.logits;
  std::vector<int32_t>* const greedy = out.argmax;
  if (attention && attention->mode == AttentionMode::kCisa) {
    if (!has_cisa_layers())
      return failed_precondition(
          "forward: CISA attention asked for a call, but the model was loaded with dense "
          "attention (no CISA layers)");
    CISA_RETURN_IF_ERROR(validate_selection_params(attention->selection));
  }
  // The override holds for this call only, whichever way it returns.
  struct CallAttention {
    Impl& m;
    ~CallAttention() { m.call_attention = nullptr; }
  } call_scope{m};
  m.call_attention = attention;
  const bool call_dense = attention && attention->mode == AttentionMode::kDense;
  const SelectionParams& selection =
      attention && !call_dense ? attention->selection : m.opt.attention.selection;
  m.layer_budgets.clear();
  if (!m.opt.attention.layer_budget_weights.empty() && has_cisa_layers() && !call_dense) {
    CISA_ASSIGN_OR_RETURN(
        m.layer_budgets,
        split_layer_budgets(selection.budget, m.layer_cisa, m.opt.attention.layer_budget_weights));
  }
  const ModelHparams& hp = m.hp;
  Backend& be = *m.be;
  const PageTable& table = be.pages();
  const auto t_start = std::chrono::steady_clock::now();

  // ---- check everything before touching the cache ----
  if (m.tap && !be.cpu_cache())
    return failed_precondition(
        "forward: an attention tap needs the CPU backend (this model runs on " + be.description() +
        ")");
  int64_t total_rows = 0, n_out = 0, pages_needed = 0;
  std::unordered_set<SeqId> seen;
  std::vector<int64_t> start(inputs.size());
  const int B = table.page_size();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const SequenceInput& in = inputs[i];
    if (!table.has_sequence(in.seq))
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
    CISA_ASSIGN_OR_RETURN(int64_t len, table.length(in.seq));
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
  if (pages_needed > table.free_pages())
    return resource_exhausted("forward: needs " + std::to_string(pages_needed) + " KV pages but " +
                              std::to_string(table.free_pages()) + " are free");
  if (n_out > 0 && !logits && !greedy)
    return invalid_argument("forward: logits requested but no output vector given");
  // Every element is written below: no fill of what the vector already holds.
  if (logits) logits->resize(static_cast<size_t>(n_out) * static_cast<size_t>(hp.n_vocab));
  if (greedy) greedy->resize(static_cast<size_t>(n_out));

  // ---- steps ----
  const int64_t E = hp.n_embd, d = hp.head_dim, half = d / 2, V = hp.n_vocab;
  const int64_t Hq = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
  StepState& st = m.st;
  std::vector<int64_t> done(inputs.size(), 0);
  std::vector<int64_t> out_rows;  // step rows whose logits are wanted, in output order
  int64_t out_written = 0, rows_done = 0;
  size_t cur = 0;
  bool any_swa = false, any_dense_global = false, any_cisa = false;
  for (int l = 0; l < hp.n_layer; ++l) {
    any_swa = any_swa || !hp.is_global(l);
    const bool cisa_layer = m.layer_cisa[size_t(l)] && !call_dense;
    any_dense_global = any_dense_global || (hp.is_global(l) && !cisa_layer);
    any_cisa = any_cisa || cisa_layer;
  }
  ThreadPool* host_pool = be.cpu_pool();
  const int64_t group = any_cisa ? std::max<int64_t>(1, selection.qshare) : 1;
  while (cur < inputs.size()) {
    st.batch.clear();
    st.tokens.clear();
    out_rows.clear();
    int64_t budget = m.opt.prefill_block;
    while (cur < inputs.size() && budget > 0) {
      const SequenceInput& in = inputs[cur];
      const int64_t n = static_cast<int64_t>(in.tokens.size());
      int64_t c = std::min(budget, n - done[cur]);
      // A sequence cut before its end is cut at a multiple of the QShare G, so its groups (SPEC
      // §4: consecutive runs of G positions of a block) do not depend on the sequences batched
      // before it; the step ends early rather than cut a group.
      if (c < n - done[cur] && group > 1 && c >= group)
        c -= c % group;
      else if (c < n - done[cur] && group > 1 && !st.batch.empty())
        break;
      const int64_t row0 = static_cast<int64_t>(st.tokens.size());
      st.batch.push_back(
          {.seq = in.seq, .first = start[cur] + done[cur], .count = static_cast<int32_t>(c)});
      for (int64_t j = 0; j < c; ++j) {
        const int64_t idx = done[cur] + j;
        st.tokens.push_back(in.tokens[static_cast<size_t>(idx)]);
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
    const int64_t rows = static_cast<int64_t>(st.tokens.size());
    st.rows = rows;
    for (const BatchEntry& e : st.batch) CISA_RETURN_IF_ERROR(be.reserve(e.seq, e.count));

    const int64_t f4 = sizeof(float);
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.token_ids, rows * 4, "token ids"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.x, rows * E * f4, "residual stream"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.xn, rows * E * f4, "normed activations"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.o, rows * E * f4, "sub-block outputs"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.q, rows * Hq * d * f4, "queries"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.att, rows * Hq * d * f4, "attention outputs"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.k, rows * Hkv * d * f4, "keys"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.v, rows * Hkv * d * f4, "values"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.gate, rows * F * f4, "MLP gate"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.up, rows * F * f4, "MLP up"));
    CISA_RETURN_IF_ERROR(ensure_buffer(be, st.index_q, rows * Hkv * d * f4, "index queries"));
    st.pos.resize(static_cast<size_t>(rows));
    {
      size_t r = 0;
      for (const BatchEntry& e : st.batch)
        for (int32_t j = 0; j < e.count; ++j) st.pos[r++] = e.first + j;
    }
    CISA_RETURN_IF_ERROR(be.upload(st.token_ids->data(), st.tokens.data(), rows * 4));
    // RoPE angle tables for this step's positions, one per base in use, made on the host.
    st.host_cos.resize(static_cast<size_t>(rows * half));
    st.host_sin.resize(static_cast<size_t>(rows * half));
    for (int t = 0; t < 2; ++t) {
      if (t == 1 && !any_swa) continue;
      const double base = t == 0 ? hp.rope_base : hp.rope_base_swa;
      auto table_rows = [&](int64_t r, int) {
        ops::rope_table(&st.pos[static_cast<size_t>(r)], 1, static_cast<int>(d), base,
                        st.host_cos.data() + r * half, st.host_sin.data() + r * half);
      };
      if (host_pool && rows >= 8) {
        host_pool->parallel_for(rows, table_rows);
      } else {
        for (int64_t r = 0; r < rows; ++r) table_rows(r, 0);
      }
      CISA_RETURN_IF_ERROR(ensure_buffer(be, st.rope_cos[t], rows * half * f4, "RoPE cosines"));
      CISA_RETURN_IF_ERROR(ensure_buffer(be, st.rope_sin[t], rows * half * f4, "RoPE sines"));
      CISA_RETURN_IF_ERROR(be.upload(st.rope_cos[t]->data(), st.host_cos.data(), rows * half * f4));
      CISA_RETURN_IF_ERROR(be.upload(st.rope_sin[t]->data(), st.host_sin.data(), rows * half * f4));
    }
    // Page lists of the step, one plan per kind of layer (CISA layers select per layer).
    if (any_swa)
      CISA_RETURN_IF_ERROR(
          be.plan(PlanSlot::kSliding, st.batch,
                  {.kind = PlanKind::kDense, .sliding_window = hp.sliding_window}));
    if (any_dense_global)
      CISA_RETURN_IF_ERROR(be.plan(PlanSlot::kGlobal, st.batch, {.kind = PlanKind::kDense}));
    if (any_cisa)
      CISA_RETURN_IF_ERROR(
          be.plan(PlanSlot::kCisa, st.batch, {.kind = PlanKind::kCisa, .selection = selection}));
    // The output buffers first: nothing allocates inside the step's bracket.
    const int64_t no = static_cast<int64_t>(out_rows.size());
    float* const dst = logits && no > 0 ? logits->data() + out_written * V : nullptr;
    // Host memory is the CPU backend's memory: the product lands in `logits` directly.
    const bool direct = dst && be.kind() == BackendKind::kCpu;
    // Every row wanted in order (decode): the final norm reads the residual rows in place.
    bool all_rows = no == rows;
    for (int64_t i = 0; all_rows && i < no; ++i) all_rows = out_rows[static_cast<size_t>(i)] == i;
    if (no > 0) {
      if (!all_rows) CISA_RETURN_IF_ERROR(ensure_buffer(be, st.xo, no * E * f4, "output rows"));
      if (!direct) CISA_RETURN_IF_ERROR(ensure_buffer(be, st.logits, no * V * f4, "logits"));
      if (greedy) CISA_RETURN_IF_ERROR(ensure_buffer(be, st.argmax, no * 4, "greedy tokens"));
    }
    float* const xo = all_rows ? st.o->f32() : no > 0 ? st.xo->f32() : nullptr;
    float* const product = direct ? dst : no > 0 ? st.logits->f32() : nullptr;

    // The device work of the step, bracketed: a decode step (one row per sequence, all rows
    // wanted) passes a key that names everything its operations depend on besides the backend's
    // plans, so a backend may replay a recording of it (Backend::begin_step).
    uint64_t graph_key = 0;
    if (all_rows && no == static_cast<int64_t>(st.batch.size()) && !m.tap && !direct &&
        !m.opt.attention.selector && !m.opt.attention.page_list_observer) {
      graph_key = 0x9E3779B97F4A7C15ull;
      const auto mix = [&](uint64_t v) { graph_key = (graph_key ^ v) * 0x100000001b3ull; };
      mix(static_cast<uint64_t>(rows));
      mix(static_cast<uint64_t>(greedy != nullptr));
      mix(static_cast<uint64_t>(call_dense));
      for (const BufferPtr* b : {&st.token_ids, &st.x, &st.xn, &st.o, &st.q, &st.att, &st.k, &st.v,
                                 &st.gate, &st.up, &st.index_q, &st.rope_cos[0], &st.rope_sin[0],
                                 &st.rope_cos[1], &st.rope_sin[1], &st.logits, &st.argmax})
        mix(*b ? reinterpret_cast<uint64_t>((*b)->data()) : 0);
      graph_key |= 1;
    }
    // Selection reuse's counters, around the step (the CUDA backend downloads them, so only
    // when reuse is on).
    const bool count_reuse = any_cisa && selection.reuse_steps > 1 && !m.opt.attention.selector;
    const SelectionReuseStats reuse0 =
        count_reuse ? be.selection_reuse_stats() : SelectionReuseStats{};
    CISA_RETURN_IF_ERROR(be.begin_step(st.batch, graph_key));
    const Status step = [&]() -> Status {
      // Embeddings, scaled (Gemma multiplies by sqrt(n_embd)).
      CISA_RETURN_IF_ERROR(
          be.embed(m.w.tok_embd, st.token_ids->i32(), rows, hp.embed_scale, st.x->f32()));
      CISA_RETURN_IF_ERROR(m.run_layers());
      // Final norm and logits for the wanted rows only (the output matrix is the largest one).
      if (no == 0) return Status::Ok();
      if (!all_rows) CISA_RETURN_IF_ERROR(be.gather_rows(st.x->f32(), out_rows, E, xo));
      CISA_RETURN_IF_ERROR(
          be.rms_norm(all_rows ? st.x->f32() : xo, m.w.output_norm, xo, no, hp.n_embd, hp.rms_eps));
      CISA_RETURN_IF_ERROR(be.matmul(m.w.output, xo, product, no));
      // The greedy tokens, on the backend: only `no` ids move.
      if (greedy) CISA_RETURN_IF_ERROR(be.argmax_rows(product, no, V, st.argmax->i32()));
      return Status::Ok();
    }();
    CISA_RETURN_IF_ERROR(be.end_step(step.ok()));
    CISA_RETURN_IF_ERROR(step);
    if (count_reuse) {
      const SelectionReuseStats reuse1 = be.selection_reuse_stats();
      m.stats.reuse_lists_selected += reuse1.selected - reuse0.selected;
      m.stats.reuse_lists_kept += reuse1.reused - reuse0.reused;
    }
    if (no > 0) {
      if (greedy)
        CISA_RETURN_IF_ERROR(be.download(greedy->data() + out_written, st.argmax->data(), no * 4));
      if (dst && !direct) CISA_RETURN_IF_ERROR(be.download(dst, product, no * V * f4));
      out_written += no;
    }
    rows_done += rows;
    m.stats.tokens += rows;
    m.stats.steps += 1;
    if (progress) progress(rows_done, total_rows);
  }
  CISA_RETURN_IF_ERROR(be.synchronize());
  m.stats.seconds_total +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return Status::Ok();
}

}  // namespace cisa
