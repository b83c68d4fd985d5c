// Shared option handling and reporting for the model subcommands (see model_cli.h).
#include "model_cli.h"

#include <algorithm>
#include <cstdio>

#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/tokenizer.h"
#ifdef CISA_WITH_CUDA_MODEL
#include "cisa/cuda/backend.h"
#include "cisa/cuda/model_backend.h"
#endif

namespace cisa::cli {

void add_model_options(ArgParser& p, ModelCliOptions* o, bool with_context) {
  p.add_int("--threads", &o->threads, "worker threads (default: one per hardware thread)");
  p.alias("-t", "--threads");
  if (with_context) {
    p.add_int("--context", &o->context,
              "KV cache tokens per sequence (default: what the run needs)");
    p.alias("-c", "--context");
  }
  p.add_int("--prefill-block", &o->prefill_block, "prompt tokens per forward step (default 512)");
  p.add_choice("--backend", &o->backend, {"cpu", "cuda"},
               "where the model runs: cpu (default) or cuda (an sm_90 GPU; builds with CUDA)");
  p.add_choice("--cuda-graphs", &o->cuda_graphs, {"on", "off"},
               "--backend cuda: replay decode steps from CUDA graphs (default on)");
  p.add_flag("--batch-invariant", &o->batch_invariant,
             "--backend cuda: every sequence gets the same bits alone or in any batch (one GEMM "
             "algorithm and attention split per sequence; slower)");
  p.add_flag("--mixed-tiles", &o->mixed_tiles,
             "--backend cuda: a step's prefill chunks and decode rows attend in two launches, each "
             "in the tile size its rows fit (default off: no gain measured in a served workload)");
  p.add_choice("--kv-dtype", &o->kv_dtype, {"auto", "f32", "bf16"},
               "KV cache element type (default: f32 on the CPU, bf16 on CUDA)");
  p.add_choice("--attention", &o->attention, {"dense", "cisa"},
               "attention on global layers (default dense)");
  p.add_int("--budget", &o->budget,
            "CISA: chunks chosen by top-k (default: model context / 256; 128 at 32K)");
  p.add_int("--window", &o->window,
            "CISA: recent pages always attended (default: model context / 1024; 32 at 32K)");
  p.add_int("--qshare", &o->qshare, "CISA: prefill positions sharing one selection (default 16)");
  p.add_choice("--qshare-query", &o->qshare_query, {"mean", "last"},
               "CISA: the group's index query");
  p.add_int("--sink-pages", &o->sink_pages, "CISA: first pages always attended (default 0)");
  p.add_int("--reuse-steps", &o->reuse_steps,
            "CISA: decode steps one selection serves, re-selecting early on the check (default 1: "
            "select every step)");
  p.add_choice("--reuse-check", &o->reuse_check, {"none", "new-chunks", "mass"},
               "CISA with --reuse-steps > 1: re-select early when a chunk leaving the window "
               "outranks a kept one (new-chunks, default), also when the index query's mass "
               "outside the kept chunks grew by more than --reuse-mass-slack (mass), or never "
               "(none)");
  p.add_double("--reuse-mass-slack", &o->reuse_mass_slack,
               "CISA with --reuse-check mass: growth of the mass outside the kept chunks that a "
               "kept selection tolerates (default 0.05)",
               {0.0, 1.0});
  p.add_choice("--rep", &o->rep, {"mean", "quest"}, "CISA: page representatives (default mean)");
  p.add_choice("--rep-precision", &o->rep_precision, {"native", "fp8", "int8"},
               "CISA: representatives rounded to 8 bits with a power-of-two scale each (CPU "
               "backend; a quality study, docs/design.md; default native: the KV dtype)");
  p.add_choice("--early-selection", &o->early_selection, {"on", "off"},
               "CISA: decode steps select pages before the layer's q/k/v products, from its "
               "input (default on; the same pages; CUDA overlaps top-k with those products)");
  p.add_int("--dense-layers", &o->dense_layers, "CISA: keep the first n layers dense (default 0)");
  p.add_string(
      "--indexer", &o->indexer,
      "CISA: indexer file from cisa calibrate (default: mean of each group's query heads)");
  p.add_flag("--no-mmap", &o->no_mmap,
             "read the model file into memory instead of mapping it (safe if the file changes)");
  p.add_flag("--llamacpp-numerics", &o->llamacpp_numerics,
             "attention with llama.cpp's CPU rounding (f16 K/V, its exp; conformance, slower)");
  p.add_flag("--quiet", &o->quiet, "no progress bar or summary on stderr");
}

void add_synthetic_option(ArgParser& p, ModelCliOptions* o, bool with_prompt_tokens) {
  std::string names;
  for (const std::string& n : synthetic_model_names()) names += (names.empty() ? "" : ", ") + n;
  p.add_string(
      "--synthetic", &o->synthetic,
      "a synthetic model instead of a file: random weights of a public shape, speed only (" +
          names + ")");
  p.add_int("--synthetic-layers", &o->synthetic_layers,
            "with --synthetic: keep only the first N layers of the shape (default 0: all; every "
            "layer is alike, so per-layer costs and CISA/dense ratios carry over; outputs say so)");
  if (with_prompt_tokens)
    p.add_int("--prompt-tokens", &o->synthetic_prompt_tokens,
              "with --synthetic: prompt length in tokens (random ids; there is no tokenizer)");
}

bool cuda_model_backend_built() {
#ifdef CISA_WITH_CUDA_MODEL
  return true;
#else
  return false;
#endif
}

Result<BackendFactory> backend_factory(const std::string& name, bool step_graphs) {
  if (name == "cpu") return BackendFactory{};
  if (name != "cuda") return invalid_argument("--backend must be cpu or cuda (got '" + name + "')");
#ifdef CISA_WITH_CUDA_MODEL
  std::string why;
  if (!cuda::device_available(&why))
    return unavailable("--backend cuda: no usable GPU (" + why + ")");
  return BackendFactory([step_graphs](const BackendOptions& options) {
    BackendOptions o = options;
    o.step_graphs = step_graphs;
    return cuda::make_model_backend(o);
  });
#else
  return unavailable(
      "--backend cuda: this cisa was built without the CUDA model backend (configure with the "
      "CUDA toolkit, e.g. cmake --preset cuda, on a machine with nvcc)");
#endif
}

std::vector<int32_t> random_tokens(int64_t n, int n_vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(std::max<int64_t>(0, n)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
  for (auto& x : t) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(std::max(1, n_vocab)));
  }
  return t;
}

void scale_cisa_defaults(ModelCliOptions* o, int64_t n_ctx_train) {
  if (o->budget == ModelCliOptions::kUnset) o->budget = std::max<int64_t>(16, n_ctx_train / 256);
  if (o->window == ModelCliOptions::kUnset) o->window = std::max<int64_t>(4, n_ctx_train / 1024);
}

Result<ModelOptions> to_model_options(const ModelCliOptions& o) {
  ModelOptions m;
  if (o.attention == "cisa" &&
      (o.budget == ModelCliOptions::kUnset || o.window == ModelCliOptions::kUnset))
    return invalid_argument("CISA budget and window are unset (scale_cisa_defaults not called)");
  if (o.threads < 0 || o.threads > 1024) return invalid_argument("--threads must be in [0, 1024]");
  m.threads = static_cast<int>(o.threads);
  m.context = o.context;
  if (o.prefill_block < 1 || o.prefill_block > 65536)
    return invalid_argument("--prefill-block must be in [1, 65536]");
  m.prefill_block = static_cast<int>(o.prefill_block);
  CISA_ASSIGN_OR_RETURN(m.backend, backend_factory(o.backend, o.cuda_graphs == "on"));
  const bool cuda = o.backend == "cuda";
  CISA_ASSIGN_OR_RETURN(
      m.kv_dtype, parse_kv_dtype(o.kv_dtype == "auto" ? (cuda ? "bf16" : "f32") : o.kv_dtype));
  if (cuda && m.kv_dtype != KvDtype::kBF16)
    return invalid_argument("--backend cuda keeps its KV cache in bf16: drop --kv-dtype " +
                            o.kv_dtype + " or use --kv-dtype bf16");
  if (!cuda && o.batch_invariant)
    return invalid_argument(
        "--batch-invariant is a --backend cuda mode (the CPU backend's results depend on the "
        "batch through its attention splits and 8-bit activations)");
  m.batch_invariant = o.batch_invariant;
  if (!cuda && o.mixed_tiles)
    return invalid_argument(
        "--mixed-tiles is a --backend cuda option (the CPU backend has no attention tiles)");
  m.mixed_tiles = o.mixed_tiles;
  if (cuda && o.llamacpp_numerics)
    return invalid_argument(
        "--llamacpp-numerics runs llama.cpp's CPU arithmetic: it needs --backend cpu");
  CISA_ASSIGN_OR_RETURN(m.rep, parse_rep_kind(o.rep));
  CISA_ASSIGN_OR_RETURN(m.rep_precision, parse_rep_precision(o.rep_precision));
  m.attention.mode = o.attention == "cisa" ? AttentionMode::kCisa : AttentionMode::kDense;
  m.attention.early_selection = o.early_selection == "on";
  if (o.budget != ModelCliOptions::kUnset) m.attention.selection.budget = o.budget;
  if (o.window != ModelCliOptions::kUnset) m.attention.selection.window = o.window;
  m.attention.selection.qshare = o.qshare;
  m.attention.selection.sink_pages = o.sink_pages;
  CISA_ASSIGN_OR_RETURN(m.attention.selection.qshare_query, parse_qshare_query(o.qshare_query));
  m.attention.selection.reuse_steps = o.reuse_steps;
  CISA_ASSIGN_OR_RETURN(m.attention.selection.reuse_check, parse_reuse_check(o.reuse_check));
  m.attention.selection.reuse_mass_slack = o.reuse_mass_slack;
  if (o.reuse_steps < 1 || o.reuse_steps > kMaxReuseSteps)
    return invalid_argument("--reuse-steps must be in [1, " + std::to_string(kMaxReuseSteps) +
                            "] (got " + std::to_string(o.reuse_steps) + ")");
  if (o.dense_layers < 0 || o.dense_layers > 100000)
    return invalid_argument("--dense-layers must be >= 0");
  m.attention.dense_layers = static_cast<int>(o.dense_layers);
  if (o.llamacpp_numerics) m.attention_numerics = AttentionNumerics::kLlamaCpp;
  if (o.no_mmap) m.weights_load = GgufLoad::kRead;
  if (m.attention.mode == AttentionMode::kCisa)
    CISA_RETURN_IF_ERROR(validate_selection_params(m.attention.selection));
  return m;
}

Result<std::vector<IndexProjection>> load_index_projections(const std::string& indexer_path,
                                                            const GgufFile& file,
                                                            const ModelHparams& hp,
                                                            int dense_layers) {
  CISA_ASSIGN_OR_RETURN(Indexer idx, load_indexer(indexer_path));
  CISA_ASSIGN_OR_RETURN(ModelIdentity id, model_identity(file));
  if (Status s = check_indexer_matches(idx, id); !s.ok())
    return Status(s.code(), indexer_path + ": " + s.message());
  std::vector<bool> cisa_layers(static_cast<size_t>(hp.n_layer));
  for (int l = 0; l < hp.n_layer; ++l)
    cisa_layers[static_cast<size_t>(l)] = hp.is_global(l) && l >= dense_layers;
  return indexer_projections(idx, file, hp, cisa_layers);
}

namespace {

// load_model_for's synthetic branch: no file, no tokenizer, no indexer (an indexer belongs to a
// model file); the prompt is --prompt-tokens random ids.
Result<LoadedModel> load_synthetic_for(ModelCliOptions o, int64_t n_generate) {
  if (!o.indexer.empty())
    return invalid_argument("--indexer: an indexer is calibrated for a model file; --synthetic " +
                            o.synthetic + " has none (drop --indexer)");
  if (o.synthetic_prompt_tokens < 1)
    return invalid_argument(
        "--synthetic has no tokenizer: give the prompt length with --prompt-tokens N");
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, synthetic_hparams(o.synthetic, synthetic_layers(o)));
  scale_cisa_defaults(&o, hp.n_ctx_train);
  CISA_ASSIGN_OR_RETURN(ModelOptions mopt, to_model_options(o));
  const int64_t need = o.synthetic_prompt_tokens + n_generate;
  if (o.context && need > o.context)
    return out_of_range("--prompt-tokens " + std::to_string(o.synthetic_prompt_tokens) + " plus " +
                        std::to_string(n_generate) + " generated tokens exceeds --context " +
                        std::to_string(o.context));
  if (!o.context) mopt.context = (need + 255) / 256 * 256;
  LoadedModel out;
  CISA_ASSIGN_OR_RETURN(out.model, Model::load_synthetic(o.synthetic, mopt, synthetic_layers(o)));
  out.prompt = random_tokens(o.synthetic_prompt_tokens, hp.n_vocab, o.synthetic_seed);
  return out;
}

}  // namespace

Result<LoadedModel> load_model_for(
    const std::string& path, const ModelCliOptions& given,
    const std::function<std::vector<int32_t>(const Tokenizer&)>& encode, int64_t n_generate) {
  ModelCliOptions o = given;
  ModelOptions mopt;
  LoadedModel out;
  int64_t n_ctx_train = 0;
  if (!o.synthetic.empty()) return load_synthetic_for(o, n_generate);
  {
    CISA_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path));
    CISA_ASSIGN_OR_RETURN(ModelHparams hp, read_model_hparams(f));
    scale_cisa_defaults(&o, hp.n_ctx_train);
    CISA_ASSIGN_OR_RETURN(mopt, to_model_options(o));
    CISA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(f));
    out.prompt = encode(tok);
    n_ctx_train = hp.n_ctx_train;
    if (!o.indexer.empty()) {
      // The calibrated index projections of the layers that run CISA (SPEC §2, §6).
      if (mopt.attention.mode != AttentionMode::kCisa)
        return invalid_argument("--indexer needs --attention cisa");
      CISA_ASSIGN_OR_RETURN(mopt.attention.index,
                            load_index_projections(o.indexer, f, hp, mopt.attention.dense_layers));
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(out.prompt.size());
  if (n_prompt == 0) return invalid_argument("the prompt encodes to no tokens");
  const int64_t limit = o.context ? o.context : n_ctx_train;
  if (o.context > n_ctx_train)
    return invalid_argument("--context " + std::to_string(o.context) +
                            " exceeds the model's context of " + std::to_string(n_ctx_train) +
                            " tokens");
  if (n_prompt > limit)
    return out_of_range("the prompt has " + std::to_string(n_prompt) +
                        " tokens, longer than the context of " + std::to_string(limit) + " tokens");
  if (n_prompt + n_generate > limit)
    return out_of_range("the prompt (" + std::to_string(n_prompt) + " tokens) plus " +
                        std::to_string(n_generate) + " generated tokens exceeds the context of " +
                        std::to_string(limit) + " tokens");
  if (!o.context)
    mopt.context = std::min<int64_t>(n_ctx_train, (n_prompt + n_generate + 255) / 256 * 256);
  CISA_ASSIGN_OR_RETURN(out.model, Model::load(path, mopt));
  return out;
}

void print_progress(const char* label, int64_t done, int64_t total, double seconds) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = '\0';
  std::fprintf(stderr, "\r%s [%s] %lld/%lld tokens  %.1f tok/s", label, bar,
               static_cast<long long>(done), static_cast<long long>(total),
               seconds > 0 ? done / seconds : 0.0);
  std::fflush(stderr);
}

Json attention_summary(const Model& m, const ForwardStats& prefill, const ForwardStats& total) {
  Json j = Json::object();
  j["mode"] = attention_mode_name(m.options().attention.mode);
  if (m.options().attention.mode == AttentionMode::kCisa) {
    const auto& s = m.options().attention.selection;
    j["budget"] = s.budget;
    j["window"] = s.window;
    j["qshare"] = s.qshare;
    j["qshare_query"] = qshare_query_name(s.qshare_query);
    j["sink_pages"] = s.sink_pages;
    j["reuse_steps"] = s.reuse_steps;
    j["reuse_check"] = reuse_check_name(s.reuse_check);
    if (s.reuse_check == ReuseCheck::kMass) j["reuse_mass_slack"] = s.reuse_mass_slack;
    j["rep"] = rep_kind_name(m.options().rep);
    j["rep_precision"] = rep_precision_name(m.options().rep_precision);
    j["dense_layers"] = m.options().attention.dense_layers;
    j["index_projection"] =
        m.options().attention.index.empty() ? "mean of the group's query heads" : "supplied";
  }
  auto part = [](const ForwardStats& s) {
    Json p = Json::object();
    p["global_pages_read"] = s.global_pages_read;
    p["global_pages_dense"] = s.global_pages_dense;
    p["read_fraction"] = s.global_pages_dense
                             ? static_cast<double>(s.global_pages_read) / s.global_pages_dense
                             : 1.0;
    p["seconds_attention"] = s.seconds_attention;
    p["seconds_global_attention"] = s.seconds_global_attention;
    if (s.reuse_lists_selected + s.reuse_lists_kept > 0) {
      p["reuse_lists_selected"] = s.reuse_lists_selected;
      p["reuse_lists_kept"] = s.reuse_lists_kept;
    }
    return p;
  };
  ForwardStats decode = total;
  decode.global_pages_read -= prefill.global_pages_read;
  decode.global_pages_dense -= prefill.global_pages_dense;
  decode.seconds_attention -= prefill.seconds_attention;
  decode.seconds_global_attention -= prefill.seconds_global_attention;
  decode.reuse_lists_selected -= prefill.reuse_lists_selected;
  decode.reuse_lists_kept -= prefill.reuse_lists_kept;
  j["prefill"] = part(prefill);
  j["decode"] = part(decode);
  return j;
}

void print_attention_line(const Model& m, const ForwardStats& s) {
  const double frac =
      s.global_pages_dense ? static_cast<double>(s.global_pages_read) / s.global_pages_dense : 1.0;
  std::fprintf(
      stderr, "attention %s: global layers read %lld K/V pages, dense would read %lld (%.1f%%)\n",
      attention_mode_name(m.options().attention.mode), static_cast<long long>(s.global_pages_read),
      static_cast<long long>(s.global_pages_dense), 100.0 * frac);
  if (s.reuse_lists_selected + s.reuse_lists_kept > 0)
    std::fprintf(
        stderr, "selection reuse: %lld decode lists kept an earlier selection, %lld selected\n",
        static_cast<long long>(s.reuse_lists_kept), static_cast<long long>(s.reuse_lists_selected));
}

}  // namespace cisa::cli
