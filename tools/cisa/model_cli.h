// model_cli.h — what `cisa run`, `cisa bench model` and `cisa eval` share: the model, backend and
// attention options, loading a model (a GGUF file or a synthetic shape) with a KV cache sized to
// the work, the prefill progress bar, and the attention-traffic summary.
//
//   ModelCliOptions mo;
//   add_model_options(p, &mo);                      // --backend cpu|cuda, --attention, ...
//   add_synthetic_option(p, &mo);                   // --synthetic NAME (bench model, run)
//   if (int rc = p.parse(argc, argv); rc >= 0) return rc;
//   auto loaded = load_model_for(path, mo, encode, n_generate);   // honours --synthetic
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cisa/core/json.h"
#include "cisa/core/status.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cli_args.h"

namespace cisa::cli {

struct ModelCliOptions {
  int64_t threads = 0;
  int64_t context = 0;  // 0: prompt + generated tokens (rounded up to 256), at most the model's
  int64_t prefill_block = 512;
  // "cpu" or "cuda" (the CUDA model backend, cuda/model_backend.h; needs a build with it and an
  // sm_90 GPU).
  std::string backend = "cpu";
  // "on": the CUDA backend records decode steps in CUDA graphs and replays them
  // (BackendOptions::step_graphs); "off": every kernel launched one by one.
  std::string cuda_graphs = "on";
  // "on": decode steps select CISA pages before the layer's q/k/v (AttentionOptions::
  // early_selection); "off": after the cache append (A/B runs).
  std::string early_selection = "on";
  // --batch-invariant: ModelOptions::batch_invariant (CUDA: a sequence's tokens do not depend on
  // the rest of its batch; slower).
  bool batch_invariant = false;
  // --mixed-tiles: ModelOptions::mixed_tiles (CUDA: prefill chunks and decode rows of one step
  // attend in the tile sizes their rows fit).
  bool mixed_tiles = false;
  // "auto": f32 on the CPU backend, bf16 on CUDA (the only type its kernels take).
  std::string kv_dtype = "auto";
  // A synthetic model (Model::load_synthetic, synthetic_model_names()) instead of a GGUF file:
  // random weights of a public model's shape, speed only. Empty: a file.
  std::string synthetic;
  // --synthetic-layers: keep only the first N layers of the shape (0: all); outputs name the cut.
  int64_t synthetic_layers = 0;
  int64_t synthetic_prompt_tokens = 0;  // --prompt-tokens: the prompt of a synthetic model
  uint64_t synthetic_seed = 1;
  std::string attention = "dense";
  // budget and window: kUnset until scale_cisa_defaults() sets them from the model's context.
  static constexpr int64_t kUnset = INT64_MIN;
  int64_t budget = kUnset, window = kUnset, qshare = 16, sink_pages = 0, dense_layers = 0;
  std::string qshare_query = "mean", rep = "mean", rep_precision = "native";
  int64_t reuse_steps = 1;                 // CISA: decode steps one selection serves
  std::string reuse_check = "new-chunks";  // CISA: early re-selection under reuse
  double reuse_mass_slack = 0.05;          // CISA: --reuse-mass-slack (reuse check "mass")
  std::string
      indexer;  // CISA: indexer file from `cisa calibrate` (empty: mean of each group's heads)
  bool llamacpp_numerics = false;  // attention rounded exactly as llama.cpp's CPU code (slower)
  bool no_mmap = false;            // read the GGUF into memory (ModelOptions::weights_load = kRead)
  bool quiet = false;
};

// with_context: also offer --context (the KV cache size); `cisa bench model` uses that name itself.
void add_model_options(ArgParser& p, ModelCliOptions* o, bool with_context = true);
// --synthetic NAME, for the subcommands that can run a model without a file, and with
// with_prompt_tokens --prompt-tokens N (its prompt length; bench model has --context for that).
void add_synthetic_option(ArgParser& p, ModelCliOptions* o, bool with_prompt_tokens = true);

// What --backend NAME makes: an empty factory for "cpu" (Model's default, the CPU backend),
// cisa::cuda::make_model_backend for "cuda". Errors, each saying what to do: an unknown name; a
// cisa built without the CUDA model backend; no usable GPU (cuda::device_available's reason).
// step_graphs: BackendOptions::step_graphs of the CUDA backend (--cuda-graphs).
Result<BackendFactory> backend_factory(const std::string& name, bool step_graphs = true);
// True when this binary was built with the CUDA model backend (CISA_WITH_CUDA_MODEL).
bool cuda_model_backend_built();
// --synthetic-layers as load_synthetic's layer count (values past int come back as -1, which
// synthetic_hparams refuses with a clear message).
inline int synthetic_layers(const ModelCliOptions& o) {
  return o.synthetic_layers >= 0 && o.synthetic_layers <= 1 << 20
             ? static_cast<int>(o.synthetic_layers)
             : -1;
}
// "synthetic weights, speed only": what every output of a synthetic run says.
inline constexpr const char* kSyntheticNote = "synthetic weights, speed only";
// CISA's defaults scale with the model's training context n (docs/design.md): k = n / 256 chunks
// (at least 16) and W = n / 1024 pages (at least 4), i.e. k = 128, W = 32 at 32K (Gemma 3) and
// k = 32, W = 8 at 8K (SmolLM2): the settings the committed indexers were calibrated with.
// Leaves options the user gave alone.
void scale_cisa_defaults(ModelCliOptions* o, int64_t n_ctx_train);
// The index projections an indexer file (cisa calibrate) gives the global layers from
// `dense_layers` on, after checking that the file was made for this model; errors name the file.
Result<std::vector<IndexProjection>> load_index_projections(const std::string& indexer_path,
                                                            const GgufFile& file,
                                                            const ModelHparams& hp,
                                                            int dense_layers);
// Needs scale_cisa_defaults() first when --attention cisa. Sets ModelOptions::backend from
// --backend (backend_factory) and refuses what that backend cannot do (llama.cpp numerics on CUDA).
Result<ModelOptions> to_model_options(const ModelCliOptions& o);
// `n` pseudo-random token ids below n_vocab, the same for the same seed.
std::vector<int32_t> random_tokens(int64_t n, int n_vocab, uint64_t seed);

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::vector<int32_t> prompt;
};
// Reads the file's tokenizer and hyper-parameters, tokenizes the prompt with `encode`, checks
// prompt + n_generate against the model's context (clear errors for each case), and loads the
// model with a KV cache of that size. With o.synthetic set, `path` and `encode` are not used (a
// synthetic model has no tokenizer): the prompt is o.synthetic_prompt_tokens pseudo-random ids.
Result<LoadedModel> load_model_for(
    const std::string& path, const ModelCliOptions& o,
    const std::function<std::vector<int32_t>(const Tokenizer&)>& encode, int64_t n_generate);

// "\rprefill [#####.....] 1024/2048 tokens  512.3 tok/s" on stderr.
void print_progress(const char* label, int64_t done, int64_t total, double seconds);

// {mode, global_pages_read, global_pages_dense, read_fraction, ...} for the run so far.
Json attention_summary(const Model& m, const ForwardStats& prefill, const ForwardStats& total);
void print_attention_line(const Model& m, const ForwardStats& total);

}  // namespace cisa::cli
