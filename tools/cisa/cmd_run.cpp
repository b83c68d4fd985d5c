// cisa run — generate text with a GGUF model (cisa::generate, generate.h): prompt prefill on the
// paged KV cache, then one token per step, streamed to stdout as it is produced; a summary (and
// with --json one JSON document).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cisa/core/json.h"
#include "cisa/model/generate.h"
#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "cisa/model/sampling.h"
#include "cisa/model/tokenizer.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"
#include "model_cli.h"

namespace cisa::cli {
namespace {

constexpr FailWith fail{"cisa run"};

}  // namespace

int cmd_run(int argc, char** argv) {
  ArgParser p("cisa run", "Generate text with a GGUF model (streamed to stdout).");
  std::string model_arg, prompt, prompt_file;
  int64_t n_predict = 64;
  bool greedy = false, json = false, ignore_eos = false;
  double temperature = 0.8, top_p = 0.95;
  int64_t top_k = 40, seed = 1234;
  p.add_string("--model", &model_arg, "model name (gemma3-270m, smollm2-135m) or GGUF path", true);
  p.alias("-m", "--model");
  p.add_string("--prompt", &prompt, "prompt text");
  p.alias("-p", "--prompt");
  p.add_string("--file", &prompt_file, "read the prompt from this file");
  p.alias("-f", "--file");
  p.add_int("--n-predict", &n_predict, "tokens to generate (default 64)");
  p.alias("-n", "--n-predict");
  p.add_flag("--greedy", &greedy, "always take the most likely token");
  p.add_double("--temperature", &temperature, "sampling temperature (default 0.8; 0 = greedy)");
  p.add_int("--top-k", &top_k, "keep the k most likely tokens (default 40; 0 = all)");
  p.add_double("--top-p", &top_p, "nucleus sampling mass (default 0.95)");
  p.add_int("--seed", &seed, "random seed (default 1234)");
  p.add_flag("--ignore-eos", &ignore_eos, "keep generating after an end-of-generation token");
  ModelCliOptions mo;
  add_model_options(p, &mo);
  p.add_flag("--json", &json, "print one JSON document (text and summary) instead of streaming");
  if (int rc = p.parse(argc, argv); rc >= 0) return rc;

  if (prompt_file.empty() == !p.given("--prompt"))
    return fail("give exactly one of -p TEXT or -f FILE");
  if (!prompt_file.empty()) {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) return fail("cannot read prompt file '" + prompt_file + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
  }
  if (prompt.empty()) return fail("the prompt is empty");
  if (n_predict < 1) return fail("-n must be >= 1 (got " + std::to_string(n_predict) + ")");
  SamplingParams sp{.greedy = greedy,
                    .temperature = static_cast<float>(temperature),
                    .top_k = static_cast<int32_t>(top_k),
                    .top_p = static_cast<float>(top_p),
                    .seed = static_cast<uint64_t>(seed)};
  if (top_k > INT32_MAX) return fail("--top-k is too large");
  if (Status v = validate_sampling_params(sp); !v.ok()) return fail(v.message());

  auto path = resolve_model(model_arg);
  if (!path.ok()) return fail(path.status().message());
  // Tokenize with a vocabulary-only look at the file first, so the KV cache is sized to the need.
  auto loaded = load_model_for(
      *path, mo, [&](const Tokenizer& tok) { return tok.encode(prompt, true, true); }, n_predict);
  if (!loaded.ok()) return fail(loaded.status().message());
  Model& model = *loaded->model;
  const std::vector<int32_t>& ids = loaded->prompt;

  const bool tty = isatty(STDERR_FILENO) && !mo.quiet;
  const int64_t n_prompt = static_cast<int64_t>(ids.size());
  GenerationRequest req{
      .prompt = ids, .max_tokens = n_predict, .sampling = sp, .ignore_eos = ignore_eos};
  ForwardStats prefill_stats;
  bool prefilled = false;
  const Stopwatch clock;
  auto end_prefill = [&] {
    if (prefilled) return;
    prefilled = true;
    prefill_stats = model.stats();
    if (tty) std::fputc('\n', stderr);
  };
  GenerationCallbacks cb;
  cb.on_prefill_progress = [&](int64_t done, int64_t total) {
    if (tty) print_progress("prefill", done, total, clock.seconds());
  };
  cb.on_token = [&](const GeneratedToken& t) {
    end_prefill();
    if (!json) {
      std::fwrite(t.text.data(), 1, t.text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  cb.on_finish = [&](size_t, const GenerationResult& r, std::string_view tail) {
    if (json || r.finish == FinishReason::kError) return;
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  };
  std::vector<GenerationResult> out;
  Status s = generate(model, {&req, 1}, &out, cb);
  end_prefill();
  if (!s.ok()) return fail(s.message());
  const GenerationResult& res = out[0];
  const std::string& text = res.text;
  const std::vector<int32_t>& out_ids = res.tokens;
  const std::string stop =
      res.finish == FinishReason::kEos ? "eog" : finish_reason_name(res.finish);
  const double t_prefill = res.timings.prefill_seconds;
  const double t_decode = res.timings.decode_seconds;
  const int64_t decode_steps = res.timings.decode_steps;

  const ForwardStats& st = model.stats();
  const double prefill_tps = t_prefill > 0 ? n_prompt / t_prefill : 0;
  const double decode_tps = t_decode > 0 ? decode_steps / t_decode : 0;
  Json j = Json::object();
  j["model"] = *path;
  j["architecture"] = model_arch_name(model.hparams().arch);
  j["threads"] = model.num_threads();
  j["prompt_tokens"] = n_prompt;
  j["generated_tokens"] = static_cast<int64_t>(out_ids.size());
  j["stop"] = stop;
  j["prefill_seconds"] = t_prefill;
  j["prefill_tokens_per_s"] = prefill_tps;
  j["decode_steps"] = decode_steps;
  j["decode_seconds"] = t_decode;
  j["decode_tokens_per_s"] = decode_tps;
  j["attention"] = attention_summary(model, prefill_stats, st);
  if (json) {
    j["text"] = text;
    print_json(j);
  } else if (!mo.quiet) {
    std::fprintf(stderr,
                 "\n%lld prompt tokens: prefill %.2f s (%.1f tok/s); %lld tokens generated, decode "
                 "%.1f tok/s (%s)\n",
                 static_cast<long long>(n_prompt), t_prefill, prefill_tps,
                 static_cast<long long>(out_ids.size()), decode_tps, stop.c_str());
    print_attention_line(model, st);
  }
  return 0;
}

}  // namespace cisa::cli
