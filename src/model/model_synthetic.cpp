// Synthetic models: the exact shapes of public Llama-family models with random weights, for
// speed measurements of the runtime on shapes we have no file for (Model::load_synthetic).
//
// Weights come from the backend's random_matrix (roughly normal, standard deviation 0.02, a fixed
// seed per tensor) and every norm gain is 1. The outputs are meaningless; only the work is real:
// the same matrix shapes, head counts, RoPE tables, KV cache and attention as the real model.
// Differences from the real models are part of their names: Qwen 2.5's q/k/v biases are omitted.
#include <cmath>
#include <string>
#include <vector>

#include "model_impl.h"

namespace cisa {
namespace {

struct SyntheticShape {
  const char* name;
  const char* display;
  int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
  int64_t n_ctx_train;
  float rope_base, rms_eps;
  RopeStyle rope_style;
  bool tied_output;
};

constexpr SyntheticShape kShapes[] = {
    {"llama-3.1-8b", "synthetic llama-3.1-8b (random weights)", 32, 4096, 32, 8, 128, 14336, 128256,
     131072, 500000.0f, 1e-5f, RopeStyle::kNorm, false},
    {"qwen2.5-7b", "synthetic qwen2.5-7b (random weights, no q/k/v biases)", 28, 3584, 28, 4, 128,
     18944, 152064, 131072, 1000000.0f, 1e-6f, RopeStyle::kNeox, false},
    // Small enough for unit tests on any machine: 2 layers, 64 wide, 4 query heads in 2 KV groups.
    {"tiny-llama", "synthetic tiny-llama (random weights)", 2, 64, 4, 2, 16, 128, 256, 4096,
     10000.0f, 1e-5f, RopeStyle::kNorm, true},
};

constexpr float kWeightStd = 0.02f;

}  // namespace

std::vector<std::string> synthetic_model_names() {
  std::vector<std::string> v;
  for (const SyntheticShape& s : kShapes) v.emplace_back(s.name);
  return v;
}

Result<ModelHparams> synthetic_hparams(const std::string& name, int layers) {
  for (const SyntheticShape& s : kShapes) {
    if (name != s.name) continue;
    if (layers < 0 || layers > s.n_layer)
      return invalid_argument("synthetic " + name + " has " + std::to_string(s.n_layer) +
                              " layers: cannot keep " + std::to_string(layers) + " (give 1 to " +
                              std::to_string(s.n_layer) + ", or 0 for all)");
    ModelHparams hp;
    hp.arch = ModelArch::kLlama;
    hp.name = s.display;
    hp.n_layer = layers > 0 ? layers : s.n_layer;
    if (layers > 0 && layers < s.n_layer)  // "… (random weights; first 4 of 28 layers)"
      hp.name.insert(hp.name.size() - 1, "; first " + std::to_string(layers) + " of " +
                                             std::to_string(s.n_layer) + " layers");
    hp.n_embd = s.n_embd;
    hp.n_ff = s.n_ff;
    hp.n_head = s.n_head;
    hp.n_head_kv = s.n_head_kv;
    hp.head_dim = s.head_dim;
    hp.n_vocab = s.n_vocab;
    hp.n_ctx_train = s.n_ctx_train;
    hp.rms_eps = s.rms_eps;
    hp.rope_style = s.rope_style;
    hp.rope_base = hp.rope_base_swa = s.rope_base;
    hp.layer_swa.assign(static_cast<size_t>(hp.n_layer), false);
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    hp.activation = Activation::kSilu;
    hp.tied_output = s.tied_output;
    return hp;
  }
  std::string known;
  for (const SyntheticShape& s : kShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  return not_found("no synthetic model named '" + name + "' (known: " + known + ")");
}

Result<ModelWeights> random_weights(const ModelHparams& hp, Backend& be) {
  ModelWeights w;
  uint64_t seed = 1;  // one seed per tensor, in a fixed order: the same weights on every run
  auto matrix = [&](int64_t rows, int64_t cols) {
    return be.random_matrix(rows, cols, seed++, kWeightStd);
  };
  const std::vector<float> ones_e(static_cast<size_t>(hp.n_embd), 1.0f);
  const int64_t E = hp.n_embd, F = hp.n_ff, Dq = int64_t{hp.n_head} * hp.head_dim,
                Dkv = int64_t{hp.n_head_kv} * hp.head_dim;
  CISA_ASSIGN_OR_RETURN(w.tok_embd, matrix(hp.n_vocab, E));
  if (hp.tied_output) {
    w.output = w.tok_embd;
  } else {
    CISA_ASSIGN_OR_RETURN(w.output, matrix(hp.n_vocab, E));
  }
  CISA_ASSIGN_OR_RETURN(w.output_norm, be.bind_vector(ones_e));
  w.layers.resize(static_cast<size_t>(hp.n_layer));
  // q/k/v and gate/up bound together (Backend::random_matrices: the same seeds and values).
  auto matrices = [&](std::vector<int64_t> rows, int64_t cols) {
    const uint64_t first = seed;
    seed += rows.size();
    return be.random_matrices(rows, cols, first, kWeightStd);
  };
  for (LayerWeights& L : w.layers) {
    CISA_ASSIGN_OR_RETURN(std::vector<BackendMatrix> qkv, matrices({Dq, Dkv, Dkv}, E));
    L.wq = qkv[0];
    L.wk = qkv[1];
    L.wv = qkv[2];
    CISA_ASSIGN_OR_RETURN(L.wo, matrix(E, Dq));
    CISA_ASSIGN_OR_RETURN(std::vector<BackendMatrix> gu, matrices({F, F}, E));
    L.gate = gu[0];
    L.up = gu[1];
    CISA_ASSIGN_OR_RETURN(L.down, matrix(E, F));
    CISA_ASSIGN_OR_RETURN(L.attn_norm, be.bind_vector(ones_e));
    CISA_ASSIGN_OR_RETURN(L.ffn_norm, be.bind_vector(ones_e));
  }
  return w;
}

Result<std::unique_ptr<Model>> Model::load_synthetic(const std::string& name,
                                                     const ModelOptions& options, int layers) {
  CISA_RETURN_IF_ERROR(validate_model_options(options));
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, synthetic_hparams(name, layers));
  constexpr int64_t kMaxSyntheticContext = int64_t{1} << 21;  // 2M: 1M prompts plus their output
  const int64_t context = options.context ? options.context : hp.n_ctx_train;
  if (context > kMaxSyntheticContext)
    return invalid_argument("context " + std::to_string(context) +
                            " exceeds the synthetic models' limit of 2M (2097152) tokens");
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  CISA_RETURN_IF_ERROR(impl->make_backend());
  CISA_RETURN_IF_ERROR(
      admit_model_memory(hp, options, context, *impl->be, /*weights_in_file=*/false));
  CISA_ASSIGN_OR_RETURN(impl->w, random_weights(hp, *impl->be));
  impl->hp = std::move(hp);
  impl->context = context;
  CISA_RETURN_IF_ERROR(impl->setup_attention_and_cache());
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

}  // namespace cisa
