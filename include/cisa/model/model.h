// cisa/model/model.h — pretrained GGUF language models (Gemma 3, Llama family) on the paged KV
// cache.
//
// Model::load maps a GGUF file, reads the architecture's hyper-parameters from its metadata,
// checks every tensor's shape and type, and builds a tokenizer and a paged KV cache. forward()
// runs any number of sequences, each with a run of new tokens, through the network in blocks of
// at most `prefill_block` rows (the rows of all sequences together): a 2,000-token prompt and
// three one-token decode steps can share one call. On the CPU backend weights stay quantised
// (quant.h); attention runs on the core's page lists (plan.h), dense or CISA per layer.
//
//   CISA_ASSIGN_OR_RETURN(std::string path, cisa::resolve_model("gemma3-270m"));
//   CISA_ASSIGN_OR_RETURN(auto model, cisa::Model::load(path, {.threads = 2, .context = 8192}));
//   std::vector<int32_t> ids = model->tokenizer().encode("The capital of France is", true);
//   CISA_ASSIGN_OR_RETURN(cisa::SeqId s, model->add_sequence());
//   cisa::SequenceInput in{.seq = s, .tokens = ids};            // logits of the last row only
//   std::vector<float> logits;                                   // [outputs][n_vocab]
//   CISA_RETURN_IF_ERROR(model->forward({&in, 1}, &logits));
//   int32_t next = cisa::argmax(logits);                          // sampling.h
//
// The model runs on a Backend (backend.h): ModelOptions::backend makes it (the CPU reference
// backend when empty); weights, activations and the KV cache live in its memory, and every layer
// is written once as calls on it. Model::load_synthetic builds a public model's shape with random
// weights (no file, no tokenizer), for speed measurements only.
//
// Architectures (docs/models-runtime.md lists what was checked against what):
//  - gemma3: sliding-window layers (RoPE base 10,000) and global layers (RoPE base from the
//    metadata) in the pattern of five local to one global, q/k RMSNorm, post-attention and
//    post-feed-forward RMSNorm, GELU(tanh) gated MLP, embeddings scaled by sqrt(n_embd), output
//    tied to the embeddings, attention scale 1/sqrt(key_length).
//  - llama: RMSNorm, RoPE on adjacent pairs, SiLU gated MLP, output tied when no output.weight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/core/plan.h"
#include "cisa/core/status.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/gguf.h"

namespace cisa {

class GgufFile;
class ThreadPool;
class Tokenizer;

enum class ModelArch { kGemma3, kLlama };
const char* model_arch_name(ModelArch arch);  // "gemma3", "llama"

struct ModelHparams {
  ModelArch arch = ModelArch::kLlama;
  std::string name;  // general.name
  int n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_vocab = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-6f;
  RopeStyle rope_style = RopeStyle::kNorm;
  float rope_base = 10000.0f;      // global (full-context) layers
  float rope_base_swa = 10000.0f;  // sliding-window layers
  int64_t sliding_window = 0;      // tokens; 0 when no layer slides
  std::vector<bool> layer_swa;     // per layer: true for a sliding-window layer
  float attn_scale = 0.0f;         // multiplies q·k
  float embed_scale = 1.0f;        // token embeddings are multiplied by this
  bool qk_norm = false;            // RMSNorm of each query and key head before RoPE
  bool post_norms = false;         // RMSNorm of the attention and MLP outputs before the residual
  Activation activation = Activation::kSilu;
  bool tied_output = true;  // logits use token_embd.weight

  bool is_global(int layer) const { return !layer_swa[static_cast<size_t>(layer)]; }
  int heads_per_group() const { return n_head / n_head_kv; }
};

// The hyper-parameters Model::load would use, from a file's metadata alone (no weights bound).
Result<ModelHparams> read_model_hparams(const GgufFile& file);

enum class AttentionMode { kDense, kCisa };
const char* attention_mode_name(AttentionMode m);  // "dense", "cisa"

// The index projection W̃ of one (layer, KV group) (SPEC §2): [head_dim][n_embd] f32, row-major.
// Its output goes through the model's own query post-processing (q-norm, RoPE).
struct IndexProjection {
  int layer = 0;
  int kv_group = 0;
  std::vector<float> weight;
};

// What a page selector sees of one CISA layer in one forward step: the step's rows, the queries
// attention will use, the index queries, and the cache after this step's K/V and full pages'
// representatives were written.
struct PageSelectorInput {
  int layer = 0;
  std::span<const BatchEntry> batch;  // the step's rows: sequences in order
  const float* q = nullptr;           // [rows][num_q_heads][head_dim] after q-norm and RoPE
  int num_q_heads = 0;
  float scale = 0;                             // attention multiplies q·k by this
  const float* index_q = nullptr;              // [rows][n_head_kv][head_dim] the CISA index queries
  const SelectionParams* selection = nullptr;  // AttentionOptions::selection
  const PagedKvCache* cache = nullptr;
  ThreadPool* pool = nullptr;  // the model's workers (may be used with parallel_for)
};
// The planning half of a CISA layer's attention: writes the page list of every query group, laid
// out as select_pages lays it out (the same groups, sinks, window and tail); attention then reads
// exactly those pages. A selector holds whatever state it needs itself (nothing global); an error
// stops forward() with that error.
using PageSelector = std::function<Status(const PageSelectorInput&, PageLists* out)>;
// Sees the page lists a CISA layer's attention reads, after its selection (Backend::page_lists:
// physical pages of the model's own cache and their logical chunks), in every forward step.
// Tests and diagnostics: on a GPU backend each call waits for the device and downloads the lists.
using PageListObserver = std::function<Status(int layer, const PageLists& lists)>;

// Per-layer attention choice. CISA applies to global layers only (SPEC §7); sliding-window
// layers, the first `dense_layers` layers, the last `dense_last_layers` layers and the layers of
// `dense_layer_set` stay dense.
struct AttentionOptions {
  AttentionMode mode = AttentionMode::kDense;
  // budget k, window W, sinks, and the prefill QShare group G (decode rows are groups of one).
  SelectionParams selection;
  int dense_layers = 0;
  int dense_last_layers = 0;         // layers n_layer − N … n_layer − 1 stay dense
  std::vector<int> dense_layer_set;  // these layers (each in [0, n_layer)) stay dense
  // Adaptive budgets: empty, every CISA layer selects `selection.budget` chunks; else one weight
  // per layer (n_layer values, finite, >= 0, some CISA layer's > 0), and the CISA layers share
  // the same total, budget × (CISA layers), in proportion to their weights
  // (split_layer_budgets). CPU backend only (a CUDA model refuses it at load).
  std::vector<double> layer_budget_weights;
  // Supplied index projections (an indexer file, issue 4). A (layer, KV group) without one uses
  // the element-wise mean of the group's query-head projections (a SPEC §6 candidate): the mean
  // of the group's W_q head blocks, built at load.
  std::vector<IndexProjection> index;
  // Decode steps (one query row per sequence) select a CISA layer's pages before its q/k/v
  // products and cache append, from the layer's input (docs/models-runtime.md "Early
  // selection"): the same pages, and the CUDA backend overlaps the selection's top-k with that
  // work. false: after the append, as prefill does (A/B runs; `--early-selection off`).
  bool early_selection = true;
  // Replaces select_pages (top-k of the index scores) on CISA layers, e.g. with the oracle top-k by
  // true dense mass (eval.h, oracle_page_selector) for the upper bound of an evaluation. Empty:
  // select_pages. Only consulted in AttentionMode::kCisa.
  PageSelector selector;
  // Called with each CISA layer's page lists once they are chosen (by top-k or the selector), on
  // any backend. Empty: none.
  PageListObserver page_list_observer;
};

// The per-layer budgets of AttentionOptions::layer_budget_weights: the CISA layers (`cisa[l]`)
// share total = k × (number of CISA layers) chunks, layer l getting floor(total · w_l / Σ w) plus
// one for the layers with the largest remainders (ties to the lower layer) until the sum is total;
// other layers get 0. kInvalidArgument for a weight count other than cisa.size(), a negative or
// non-finite weight, or CISA weights summing to 0 while there are CISA layers.
Result<std::vector<int64_t>> split_layer_budgets(int64_t k, const std::vector<bool>& cisa,
                                                 std::span<const double> weights);

struct ModelOptions {
  int threads = 0;          // 0: one per hardware thread
  int64_t context = 0;      // tokens per sequence; 0: the model's training context
  int max_sequences = 1;    // sequences the KV cache holds at full context
  int prefill_block = 512;  // rows per forward step
  KvDtype kv_dtype = KvDtype::kF32;
  // Round K, V and the queries to IEEE half precision before attention, reproducing the numerics of
  // llama.cpp's default f16 KV cache (used by the conformance tests; storage stays kv_dtype).
  bool round_kv_f16 = false;
  // Widen every quantised matrix to f32 at load and multiply in f32 (no 8-bit activations): the
  // exact function of the stored weights, for reference checks; ~4x the memory, much slower.
  bool weights_f32 = false;
  // Multiply as the CUDA backend does (BackendOptions::bf16_matmul): weights and embeddings
  // rounded to bf16 at load, every matrix product's input rounded to bf16, f32 accumulation. The
  // CPU reference for the GPU tests (tests/gpu/cuda_model_golden_test.cpp); CPU backend only.
  bool bf16_matmul = false;
  // The backend's batch-invariant mode (BackendOptions::batch_invariant): a sequence's logits do
  // not depend on the other sequences of its steps. CUDA backend only; slower.
  bool batch_invariant = false;
  // BackendOptions::mixed_tiles (CUDA backend only): prefill chunks and decode rows of one step
  // attend in the tile sizes their rows fit.
  bool mixed_tiles = false;
  // How the GGUF comes into memory (gguf.h): kMap (the default) maps it; kRead reads it whole, like
  // llama.cpp's --no-mmap, so that a file truncated or rewritten while the model runs cannot crash
  // it (costs the file's size in memory). With kMap, forward() re-checks the file's size first
  // (GgufFile::check_file) and fails with kDataLoss instead of touching a truncated mapping.
  GgufLoad weights_load = GgufLoad::kMap;
  // kLlamaCpp (backend.h) runs every layer (dense and CISA alike, on the same page lists) through
  // attend_llamacpp: llama.cpp's CPU rounding order with an f16 KV cache, for conformance checks
  // against its logits. ~2x slower than kDefault (Gemma 3). CPU backend only.
  AttentionNumerics attention_numerics = AttentionNumerics::kDefault;
  RepKind rep = RepKind::kMean;
  RepPrecision rep_precision = RepPrecision::kNative;  // KvCacheConfig::rep_precision
  AttentionOptions attention;
  // Makes the backend the model runs on, called once by load with {.threads = threads}. Empty:
  // make_cpu_backend. Page selectors, attention taps and kLlamaCpp numerics need the CPU backend.
  BackendFactory backend;
};

// Attention for one Model::forward call, overriding the model's own for that call (a server's
// per-request settings). The CISA layers are those the model was loaded with (AttentionMode::kCisa
// at load keeps their page representatives): kDense runs them dense for this call, kCisa runs them
// with `selection`. A model loaded dense has no CISA layers and refuses kCisa here.
struct StepAttention {
  AttentionMode mode = AttentionMode::kCisa;
  SelectionParams selection;  // kCisa only; checked with validate_selection_params
  bool operator==(const StepAttention& o) const {
    const SelectionParams &a = selection, &b = o.selection;
    return mode == o.mode &&
           (mode == AttentionMode::kDense ||
            (a.budget == b.budget && a.window == b.window && a.qshare == b.qshare &&
             a.qshare_query == b.qshare_query && a.sink_pages == b.sink_pages &&
             a.reuse_steps == b.reuse_steps && a.reuse_check == b.reuse_check &&
             a.reuse_mass_slack == b.reuse_mass_slack));
  }
};

// Which rows of an input produce logits.
enum class OutputMode { kNone, kLast, kAll, kPositions };

struct SequenceInput {
  SeqId seq = 0;
  std::span<const int32_t> tokens;  // appended after the sequence's current tokens
  OutputMode outputs = OutputMode::kLast;
  std::span<const int64_t> positions;  // kPositions: indices into `tokens`, strictly ascending
};

// What a forward() call returns for its output rows (inputs in order, rows ascending within an
// input; OutputMode picks the rows). Either or both may be given.
struct ForwardOutputs {
  std::vector<float>* logits = nullptr;  // resized to [outputs][n_vocab]
  // Resized to [outputs]: the greedy next token of every output row, argmax of its logits (ties to
  // the smaller id, NaN never wins: cisa::argmax, sampling.h), computed by the backend, so the
  // logits never leave its memory unless `logits` asks for them too.
  std::vector<int32_t>* argmax = nullptr;
};

// Counters over every forward() since load or reset_stats().
struct ForwardStats {
  int64_t tokens = 0;  // rows processed
  int64_t steps = 0;   // forward steps (blocks)
  // K/V pages read by global-layer attention under SPEC §8's per-position traffic model: for every
  // query position and KV group, the pages of its list (CISA) or pages 0 … c(t) (dense), summed
  // over positions, KV groups and global layers; and the dense count for the same rows.
  int64_t global_pages_read = 0;
  int64_t global_pages_dense = 0;
  double seconds_attention = 0;  // inside planning, selection and attend()
  double seconds_global_attention = 0;
  double seconds_total = 0;
  // Selection reuse (SelectionParams::reuse_steps > 1): decode lists (row × KV group × CISA
  // layer) whose chunks a fresh top-k chose, and those that kept an earlier step's
  // (Backend::selection_reuse_stats over these steps). Both 0 without reuse.
  int64_t reuse_lists_selected = 0;
  int64_t reuse_lists_kept = 0;
};

// Global-layer K/V pages of one sequence since it was added: ForwardStats' two counters, counted
// for that sequence's rows alone (so requests batched in one step each get their own).
struct SequenceTraffic {
  int64_t global_pages_read = 0;
  int64_t global_pages_dense = 0;
};

// Called after each forward step with the rows done so far and the total of the call.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// What an attention tap sees of one global layer in one forward step (calibration and
// diagnostics, issue 4): the queries attention uses, the index queries, and the cache after this
// step's K/V (and full pages' representatives) were written, before attention runs.
struct AttentionTapData {
  int layer = 0;
  std::span<const BatchEntry> batch;   // the step's rows: sequences in order
  std::span<const int64_t> positions;  // [rows] absolute positions
  const float* q = nullptr;            // [rows][n_head][head_dim] after q-norm and RoPE
  // [rows][n_head_kv][head_dim] after the model's query post-processing: a CISA layer's index
  // projection (the supplied one, else the mean of the group's W_q head blocks), else the mean of
  // the group's query heads before post-processing.
  const float* index_q = nullptr;
  const PagedKvCache* cache = nullptr;
};
using AttentionTap = std::function<Status(const AttentionTapData&)>;

class Model {
 public:
  // Errors: the file's own errors (gguf.h); kUnimplemented for an architecture other than gemma3
  // and llama, a tensor type matmul cannot multiply, or RoPE scaling; kDataLoss / kInvalidArgument
  // for missing tensors, shapes that disagree with the metadata, or bad options;
  // kResourceExhausted when the KV cache cannot be allocated.
  static Result<std::unique_ptr<Model>> load(const std::string& path,
                                             const ModelOptions& options = {});
  // A model of the exact shape of a public one (synthetic_model_names()) with random weights
  // (roughly normal, standard deviation 0.02, the same for a given name on every run; norm gains
  // 1): for speed measurements only, its outputs mean nothing. No file and no tokenizer.
  // options.context may go up to 2M tokens (0: the model's training context). layers: as
  // synthetic_hparams says (0: all of the shape's layers).
  static Result<std::unique_ptr<Model>> load_synthetic(const std::string& name,
                                                       const ModelOptions& options = {},
                                                       int layers = 0);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelHparams& hparams() const;
  const ModelOptions& options() const;
  // A model from load_synthetic has neither: has_tokenizer() and has_file() are false, and
  // tokenizer() is then a one-token placeholder and file() an empty GGUF file.
  bool has_tokenizer() const;
  const Tokenizer& tokenizer() const;
  bool has_file() const;
  const GgufFile& file() const;
  int64_t context() const;  // tokens one sequence may hold
  int num_threads() const;

  Result<SeqId> add_sequence();
  Status release_sequence(SeqId seq);
  Result<int64_t> sequence_length(SeqId seq) const;
  // The sequence's pages read since add_sequence (kNotFound once released).
  Result<SequenceTraffic> sequence_traffic(SeqId seq) const;

  // Appends every input's tokens to its sequence and writes the requested logits to `logits`,
  // resized to [outputs][n_vocab]: inputs in order, rows ascending within an input. Everything is
  // checked before any work (token ids, context, free pages, positions); an error leaves every
  // sequence as it was. `attention`, when given, applies to this call only (StepAttention).
  Status forward(std::span<const SequenceInput> inputs, std::vector<float>* logits,
                 const ProgressFn& progress = {}, const StepAttention* attention = nullptr);
  // The same step, returning what `out` asks for: logits and/or the greedy tokens
  // (ForwardOutputs). forward(inputs, &logits) is forward(inputs, {.logits = &logits}).
  Status forward(std::span<const SequenceInput> inputs, const ForwardOutputs& out,
                 const ProgressFn& progress = {}, const StepAttention* attention = nullptr);
  // True when some layer runs CISA (loaded with AttentionMode::kCisa): forward() then accepts a
  // StepAttention of either mode.
  bool has_cisa_layers() const;

  const ForwardStats& stats() const;
  void reset_stats();
  // Calls `tap` for every global layer of every later forward step (an empty function removes
  // it). An error from the tap stops forward() with that error, the cache holding part of the step.
  // Taps read the CPU cache: on another backend forward() refuses to run while a tap is set.
  void set_attention_tap(AttentionTap tap);
  // The CPU backend's KV cache; nullptr on any other backend.
  const PagedKvCache* cpu_cache() const;
  Backend& backend();

  struct Impl;

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The names load_synthetic accepts: "llama-3.1-8b", "qwen2.5-7b" (its q/k/v biases omitted),
// "tiny-llama" (2 layers, 64 wide, for tests).
std::vector<std::string> synthetic_model_names();
// The hyper-parameters load_synthetic(name, options, layers) uses, without building anything:
// kNotFound for an unknown name; kInvalidArgument for layers < 0 or more than the shape has.
// layers > 0 keeps only the first `layers` layers of the shape (every layer of these shapes is
// alike, so per-layer costs and CISA / dense ratios carry over; the name then says "first N of M
// layers"); 0 keeps them all.
Result<ModelHparams> synthetic_hparams(const std::string& name, int layers = 0);

}  // namespace cisa
