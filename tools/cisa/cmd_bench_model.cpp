// cisa bench model — prefill and decode tokens/s of a GGUF model at a given context, measured the
// way llama-bench does (bench/python/llamacpp_bench.py), and llama.cpp's numbers for the same file
// and settings from that script, run in the same invocation, beside ours with the ratio.
//
//   prefill  N pseudo-random tokens in forward steps of --batch rows (logits for each step's
//            last row only); tokens/s = N / wall time.
//   decode   with those N tokens cached, --decode more tokens one at a time (one row of logits
//            each); tokens/s = count / wall time.
//
// With --attention cisa the same work also runs with dense attention first, in the same
// invocation, and the speedups are set against the Amdahl ceiling 1 / (1 − s), where s is the
// share of dense time spent in global-layer attention (the only part CISA changes).
//
// With --batch, --tokens, --fill, --synthetic or --backend cuda it runs the fixed-output protocol
// instead (bench_model_protocol.h, docs/bench-model.md): B requests of L-token prompts generate T
// tokens each, dense against CISA, with the decode roofline from the bandwidth measured in the run.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "bench_model_protocol.h"
#include "cisa/core/json.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "cisa/model/quant.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"
#include "model_cli.h"

namespace cisa::cli {
namespace {

constexpr FailWith fail{"cisa bench model"};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Measurement {
  std::vector<double> prefill_tok_s, decode_tok_s;  // one per timed run
  ForwardStats prefill, total;                      // counters of the last timed run
  Json attention;                                   // attention_summary of the last run
  int threads = 0, batch = 0;
  ModelArch arch{};
  KvDtype kv_dtype{};
};

// Loads the model with `mo` and times `repeat` runs of a `context`-token prefill followed by
// `n_decode` one-token steps over a fixed pseudo-random token sequence (speed does not depend on
// content), after a short warm-up on a sequence that is then dropped.
Status measure(const std::string& path, const ModelCliOptions& mo,
               const std::vector<IndexProjection>& index, int64_t context, int64_t n_decode,
               int64_t repeat, Measurement* out) {
  CISA_ASSIGN_OR_RETURN(ModelOptions mopt, to_model_options(mo));
  if (mopt.attention.mode == AttentionMode::kCisa) mopt.attention.index = index;
  mopt.context = context + n_decode;
  CISA_ASSIGN_OR_RETURN(std::unique_ptr<Model> loaded, Model::load(path, mopt));
  Model& model = *loaded;
  const int V = model.hparams().n_vocab;
  const int batch = mopt.prefill_block;
  std::vector<int32_t> tokens(static_cast<size_t>(context + n_decode));
  uint64_t s = 0x2545F4914F6CDD1DULL;
  for (auto& t : tokens) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    t = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(V));
  }
  std::vector<float> logits;
  auto run = [&](SeqId seq, int64_t first, int64_t n) -> Status {
    SequenceInput in{.seq = seq, .tokens = {tokens.data() + first, static_cast<size_t>(n)}};
    return model.forward({&in, 1}, &logits);
  };
  {
    CISA_ASSIGN_OR_RETURN(SeqId seq, model.add_sequence());
    const int64_t w = std::min<int64_t>(32, context);
    CISA_RETURN_IF_ERROR(run(seq, 0, w));
    for (int i = 0; i < 4 && w + i + 1 <= context + n_decode; ++i)
      CISA_RETURN_IF_ERROR(run(seq, w + i, 1));
    CISA_RETURN_IF_ERROR(model.release_sequence(seq));
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  const char* mode = attention_mode_name(mopt.attention.mode);
  for (int64_t r = 0; r < repeat; ++r) {
    CISA_ASSIGN_OR_RETURN(SeqId seq, model.add_sequence());
    model.reset_stats();
    Stopwatch clock;
    for (int64_t b0 = 0; b0 < context; b0 += batch) {
      CISA_RETURN_IF_ERROR(run(seq, b0, std::min<int64_t>(batch, context - b0)));
      if (tty)
        print_progress(mode, std::min<int64_t>(b0 + batch, context), context, clock.seconds());
    }
    const double prefill_s = clock.seconds();
    out->prefill = model.stats();
    clock.restart();
    for (int64_t i = 0; i < n_decode; ++i) CISA_RETURN_IF_ERROR(run(seq, context + i, 1));
    const double decode_s = clock.seconds();
    out->total = model.stats();
    out->prefill_tok_s.push_back(context / prefill_s);
    out->decode_tok_s.push_back(n_decode / decode_s);
    if (tty) std::fputc('\n', stderr);
    std::fprintf(stderr,
                 "cisa %s run %lld/%lld: prefill %.1f tok/s (%.2f s), decode %.2f tok/s (%.2f s)\n",
                 mode, static_cast<long long>(r + 1), static_cast<long long>(repeat),
                 out->prefill_tok_s.back(), prefill_s, out->decode_tok_s.back(), decode_s);
    CISA_RETURN_IF_ERROR(model.release_sequence(seq));
  }
  out->attention = attention_summary(model, out->prefill, out->total);
  out->threads = model.num_threads();
  out->batch = batch;
  out->arch = model.hparams().arch;
  out->kv_dtype = mopt.kv_dtype;
  return Status();
}

// Share of forward time spent in global-layer attention, prefill and decode parts of a run.
double share_prefill(const Measurement& m) {
  return m.prefill.seconds_total > 0 ? m.prefill.seconds_global_attention / m.prefill.seconds_total
                                     : 0.0;
}
double share_decode(const Measurement& m) {
  const double t = m.total.seconds_total - m.prefill.seconds_total;
  return t > 0 ? (m.total.seconds_global_attention - m.prefill.seconds_global_attention) / t : 0.0;
}

// llama.cpp's numbers for the same file and settings, through bench/python/llamacpp_bench.py, run
// after ours (never concurrently). `note` says why there are none.
struct Anchor {
  Json doc = Json::object();
  double prefill_tok_s = NAN, decode_tok_s = NAN;
  std::string note;
};

Anchor run_llamacpp_anchor(const std::string& path, int64_t context, int64_t n_decode, int threads,
                           int batch, int64_t repeat, const std::string& flash_attn) {
  Anchor a;
  auto src = find_source_dir();
  const std::string script = src.ok() ? *src + "/bench/python/llamacpp_bench.py" : "";
  if (script.empty() || std::system(("test -f '" + script + "'").c_str()) != 0) {
    a.note = "bench/python/llamacpp_bench.py not found";
    return a;
  }
  if (std::system("python3 -c 'import llama_cpp' >/dev/null 2>&1") != 0) {
    a.note =
        "llama_cpp is not importable (pip install llama-cpp-python; see "
        "bench/python/llamacpp_bench.py)";
    return a;
  }
  const std::string cmd = "python3 '" + script + "' -m '" + path + "' --context " +
                          std::to_string(context) + " --decode " + std::to_string(n_decode) +
                          " --threads " + std::to_string(threads) + " --batch " +
                          std::to_string(batch) + " --repeat " + std::to_string(repeat) +
                          " --flash-attn " + flash_attn + " --json";
  std::fprintf(stderr, "running llama.cpp: %s\n", cmd.c_str());
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    const int rc = pclose(f);
    if (rc != 0) a.note = "llamacpp_bench.py failed (exit " + std::to_string(rc) + ")";
  } else {
    a.note = "could not start python3";
  }
  // One document: {"llama_cpp_python": ..., "results": [{"prefill_tok_s": ...}, ...]}.
  const auto doc = json_parse(out);
  const Json none;
  const Json& ll = doc.ok() ? *doc : none;
  const Json* results = json_member(ll, "results");
  const Json& first = results && results->is_array() && !results->empty() ? (*results)[0] : none;
  a.prefill_tok_s = json_number(first, "prefill_tok_s", NAN);
  a.decode_tok_s = json_number(first, "decode_tok_s", NAN);
  if (a.note.empty() && (std::isnan(a.prefill_tok_s) || std::isnan(a.decode_tok_s)))
    a.note = "could not read its JSON";
  if (a.note.empty()) {
    a.doc["llama_cpp_python"] = json_string(ll, "llama_cpp_python");
    a.doc["kv_type"] = json_string(ll, "kv_type");
    a.doc["flash_attn"] = json_string(ll, "flash_attn");
    a.doc["command"] = cmd;
    a.doc["system_info"] = json_string(ll, "system_info");
    a.doc["prefill_tok_s"] = a.prefill_tok_s;
    a.doc["decode_tok_s"] = a.decode_tok_s;
  }
  return a;
}

// The llama.cpp-anchored benchmark's measurements, for its JSON document and its table.
struct LlamaStyleRun {
  const std::string& model_arg;
  const std::string& path;
  int64_t context, n_decode, repeat;
  bool cisa;  // --attention cisa: m is CISA's, dense_m dense's (same invocation)
  const Measurement& m;
  const Measurement& dense_m;
  const Anchor& anchor;
  double our_pre() const { return median(m.prefill_tok_s); }
  double our_dec() const { return median(m.decode_tok_s); }
  double dense_pre() const { return cisa ? median(dense_m.prefill_tok_s) : NAN; }
  double dense_dec() const { return cisa ? median(dense_m.decode_tok_s) : NAN; }
  // Amdahl ceilings 1 / (1 − s) from dense's share s of time in global attention (what the
  // speedup would be if that attention cost nothing).
  double ceil_pre() const { return 1.0 / (1.0 - share_prefill(dense_m)); }
  double ceil_dec() const { return 1.0 / (1.0 - share_decode(dense_m)); }
};

Json measurement_json(const Measurement& x) {
  Json o = Json::object();
  o["prefill_tok_s"] = median(x.prefill_tok_s);
  o["decode_tok_s"] = median(x.decode_tok_s);
  o["prefill_tok_s_runs"] = Json::array();
  o["decode_tok_s_runs"] = Json::array();
  for (double v : x.prefill_tok_s) o["prefill_tok_s_runs"].push_back(v);
  for (double v : x.decode_tok_s) o["decode_tok_s_runs"].push_back(v);
  o["attention"] = x.attention;
  o["global_attention_share_prefill"] = share_prefill(x);
  o["global_attention_share_decode"] = share_decode(x);
  return o;
}

Json llama_style_json(const LlamaStyleRun& r) {
  const Measurement& m = r.m;
  Json j = Json::object();
  j["benchmark"] = "model";
  j["model"] = r.path;
  j["architecture"] = model_arch_name(m.arch);
  j["context"] = r.context;
  j["decode_tokens"] = r.n_decode;
  j["repeat"] = r.repeat;
  j["threads"] = m.threads;
  j["batch"] = m.batch;
  j["kv_dtype"] = kv_dtype_name(m.kv_dtype);
  j["matmul_isa"] = matmul_isa();
  j["cpu"] = cpu_model_name();
  if (utsname u{}; uname(&u) == 0)
    j["host"] = std::string(u.nodename) + " " + u.sysname + " " + u.release;
  j["date"] = utc_now();
  j["cisa"] = measurement_json(m);
  // CISA against dense: measured speedups and the Amdahl ceilings.
  if (r.cisa) {
    j["dense"] = measurement_json(r.dense_m);
    const double sp_pre = r.our_pre() / r.dense_pre(), sp_dec = r.our_dec() / r.dense_dec();
    Json v = Json::object();
    v["prefill_speedup"] = sp_pre;
    v["decode_speedup"] = sp_dec;
    v["amdahl_ceiling_prefill"] = r.ceil_pre();
    v["amdahl_ceiling_decode"] = r.ceil_dec();
    v["fraction_of_ceiling_prefill"] = (sp_pre - 1) / (r.ceil_pre() - 1);
    v["fraction_of_ceiling_decode"] = (sp_dec - 1) / (r.ceil_dec() - 1);
    v["speedup_over_ceiling_prefill"] = sp_pre / r.ceil_pre();
    v["speedup_over_ceiling_decode"] = sp_dec / r.ceil_dec();
    j["cisa_vs_dense"] = v;
  }
  Json anchor = r.anchor.doc;
  if (!r.anchor.note.empty()) anchor["note"] = r.anchor.note;
  j["llama_cpp"] = anchor;
  if (r.anchor.note.empty()) {  // the requested attention (CISA with --attention cisa) vs llama.cpp
    j["prefill_ratio"] = r.our_pre() / r.anchor.prefill_tok_s;
    j["decode_ratio"] = r.our_dec() / r.anchor.decode_tok_s;
    if (r.cisa) {
      j["dense_prefill_ratio"] = r.dense_pre() / r.anchor.prefill_tok_s;
      j["dense_decode_ratio"] = r.dense_dec() / r.anchor.decode_tok_s;
    }
  }
  return j;
}

void print_llama_style_table(const LlamaStyleRun& r) {
  const Measurement& m = r.m;
  const double our_pre = r.our_pre(), our_dec = r.our_dec();
  std::printf("%s, context %lld, %d threads, batch %d, KV %s\n", r.model_arg.c_str(),
              static_cast<long long>(r.context), m.threads, m.batch, kv_dtype_name(m.kv_dtype));
  std::printf("%-16s %14s %14s\n", "", "prefill tok/s", "decode tok/s");
  if (r.cisa) std::printf("%-16s %14.1f %14.2f\n", "cisa dense", r.dense_pre(), r.dense_dec());
  std::printf("%-16s %14.1f %14.2f\n", r.cisa ? "cisa cisa" : "cisa", our_pre, our_dec);
  if (r.cisa) {
    const double sp_pre = our_pre / r.dense_pre(), sp_dec = our_dec / r.dense_dec();
    std::printf("%-16s %13.2fx %13.2fx\n", "cisa / dense", sp_pre, sp_dec);
    std::printf(
        "%-16s %13.2fx %13.2fx   (1 / (1 - s), s = dense share in global attention: "
        "%.1f%% prefill, %.1f%% decode)\n",
        "Amdahl ceiling", r.ceil_pre(), r.ceil_dec(), 100 * share_prefill(r.dense_m),
        100 * share_decode(r.dense_m));
    std::printf("%-16s %13.2f  %13.2f    (speedup / ceiling)\n", "of ceiling",
                sp_pre / r.ceil_pre(), sp_dec / r.ceil_dec());
  }
  if (r.anchor.note.empty()) {
    std::printf("%-16s %14.1f %14.2f\n", "llama.cpp", r.anchor.prefill_tok_s,
                r.anchor.decode_tok_s);
    std::printf("%-16s %13.2fx %13.2fx\n", "cisa / llama.cpp", our_pre / r.anchor.prefill_tok_s,
                our_dec / r.anchor.decode_tok_s);
  } else {
    std::printf("llama.cpp: %s\n", r.anchor.note.c_str());
  }
}

}  // namespace

int bench_model(int argc, char** argv) {
  ArgParser p("cisa bench model",
              "Prefill and decode tokens/s at a given context, beside llama.cpp's.");
  std::string model_arg;
  int64_t context = 0, n_decode = 64, repeat = 1;
  bool json = false, no_anchor = false;
  p.add_string("--model", &model_arg, "model name or GGUF path (or --synthetic NAME)");
  p.alias("-m", "--model");
  p.add_int("--context", &context, "prompt tokens prefilled before decoding (N)", true);
  p.alias("-c", "--context");
  p.add_int("--decode", &n_decode, "tokens decoded after the prompt (default 64)");
  p.add_int("--repeat", &repeat, "timed runs; the median is reported (default 1)");
  p.add_flag("--no-anchor", &no_anchor, "do not run llama.cpp");
  std::string anchor_fa = "auto";
  p.add_choice("--anchor-flash-attn", &anchor_fa, {"auto", "on", "off"},
               "llama.cpp's flash attention (default auto, llama.cpp's own default)");
  ModelCliOptions mo;
  mo.quiet = true;
  add_model_options(p, &mo, /*with_context=*/false);
  add_synthetic_option(p, &mo, /*with_prompt_tokens=*/false);
  ProtocolArgs proto;
  p.add_int("--batch", &proto.batch,
            "fixed-output protocol: B requests decoded together (default 1)");
  p.add_int("--tokens", &proto.tokens,
            "fixed-output protocol: T tokens each request generates (default 32)");
  p.add_choice("--fill", &proto.fill, {"prompt", "random"},
               "fixed-output protocol: prefill the prompts (default) or fill each cache with L "
               "tokens of random K/V (no TTFT)");
  p.add_int("--seed", &proto.seed,
            "fixed-output protocol: seed of the random prompts and K/V (default 1)");
  p.add_string(
      "--text", &proto.text_path,
      "fixed-output protocol, GGUF models: prompt text file (default: the repository's docs)");
  p.add_int("--bandwidth-mib", &proto.bandwidth_mib,
            "fixed-output protocol: copy-bandwidth buffer size in MiB (default 2048)");
  p.add_int("--profile-step", &proto.profile_step,
            "fixed-output protocol, --backend cuda: profile only decode step N (0-based) of each "
            "run, for `ncu --profile-from-start off` (docs/bench-model.md)");
  p.add_flag("--json", &json, "print one JSON document");
  if (int rc = p.parse(argc, argv); rc >= 0) return rc;
  if (context < 1) return fail("--context must be >= 1");
  const bool protocol = !mo.synthetic.empty() || mo.backend == "cuda" || p.given("--batch") ||
                        p.given("--tokens") || p.given("--fill");
  if (!mo.synthetic.empty() && !model_arg.empty())
    return fail("give either --model or --synthetic, not both");
  if (mo.synthetic.empty() && model_arg.empty())
    return fail("give --model NAME|PATH or --synthetic NAME");
  if (protocol) {
    for (const char* o : {"--decode", "--repeat", "--no-anchor", "--anchor-flash-attn"})
      if (p.given(o))
        return fail(std::string(o) +
                    " belongs to the llama.cpp-anchored benchmark; the "
                    "fixed-output protocol (--batch/--tokens/--fill/--synthetic/--backend cuda) "
                    "uses --tokens and has no llama.cpp anchor");
    if (proto.bandwidth_mib < 64 || proto.bandwidth_mib > (int64_t{64} << 10))
      return fail("--bandwidth-mib must be in [64, 65536]");
    if (mo.synthetic.empty()) {
      auto path = resolve_model(model_arg);
      if (!path.ok()) return fail(path.status().message());
      proto.model_path = *path;
    }
    proto.mo = mo;
    proto.context = context;
    proto.json = json;
    proto.command = "cisa bench";
    for (int i = 0; i < argc; ++i) proto.command += std::string(" ") + argv[i];
    return bench_model_protocol(proto);
  }
  for (const char* o : {"--seed", "--text", "--bandwidth-mib", "--profile-step"})
    if (p.given(o))
      return fail(std::string(o) + " belongs to the fixed-output protocol (give --batch/--tokens)");
  if (n_decode < 1) return fail("--decode must be >= 1");
  if (repeat < 1 || repeat > 100) return fail("--repeat must be in [1, 100]");

  auto path = resolve_model(model_arg);
  if (!path.ok()) return fail(path.status().message());
  std::vector<IndexProjection> index;
  {
    auto f = GgufFile::open(*path);
    if (!f.ok()) return fail(f.status().message());
    auto hp = read_model_hparams(*f);
    if (!hp.ok()) return fail(hp.status().message());
    // llamacpp_bench.py sizes llama.cpp's context to N + decode + 1; check that before an hour of
    // prefill rather than after.
    if (!no_anchor && context + n_decode + 1 > hp->n_ctx_train)
      return fail(
          "--context " + std::to_string(context) + " + --decode " + std::to_string(n_decode) +
          " leaves no token of the model's " + std::to_string(hp->n_ctx_train) +
          "-token context for the llama.cpp anchor, which needs N + decode + 1: use --context " +
          std::to_string(hp->n_ctx_train - n_decode - 1) + " or --no-anchor");
    scale_cisa_defaults(&mo, hp->n_ctx_train);
    // --indexer is used by the CISA run (checked now, before the dense run, not after it).
    if (!mo.indexer.empty()) {
      if (mo.attention != "cisa") return fail("--indexer needs --attention cisa");
      auto proj = load_index_projections(mo.indexer, *f, *hp, static_cast<int>(mo.dense_layers));
      if (!proj.ok()) return fail(proj.status().message());
      index = std::move(*proj);
    }
  }
  const bool cisa = mo.attention == "cisa";
  // With --attention cisa the same prefill and decode run dense first, in the same invocation.
  Measurement dense_m, m;
  if (cisa) {
    ModelCliOptions dense_mo = mo;
    dense_mo.attention = "dense";
    dense_mo.indexer.clear();
    if (Status st = measure(*path, dense_mo, {}, context, n_decode, repeat, &dense_m); !st.ok())
      return fail(st.message());
  }
  if (Status st = measure(*path, mo, index, context, n_decode, repeat, &m); !st.ok())
    return fail(st.message());
  const Anchor anchor = no_anchor ? Anchor{.note = "not run (--no-anchor)"}
                                  : run_llamacpp_anchor(*path, context, n_decode, m.threads,
                                                        m.batch, repeat, anchor_fa);
  const LlamaStyleRun run{.model_arg = model_arg,
                          .path = *path,
                          .context = context,
                          .n_decode = n_decode,
                          .repeat = repeat,
                          .cisa = cisa,
                          .m = m,
                          .dense_m = dense_m,
                          .anchor = anchor};
  if (json) {
    print_json(llama_style_json(run));
    return 0;
  }
  print_llama_style_table(run);
  return 0;
}

}  // namespace cisa::cli
