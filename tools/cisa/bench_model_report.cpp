// The decode roofline and the report of `cisa bench model`'s fixed-output protocol (see
// bench_model_report.h and docs/bench-model.md).
#include "bench_model_report.h"
#include "cli_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "cisa/core/plan.h"
#include "cisa/model/model_store.h"

namespace cisa::cli {
namespace {

// Parameters of the model's matrices (norm gains are too small to matter).
double matrix_params(const ModelHparams& hp) {
  const double E = hp.n_embd, F = hp.n_ff, Dq = double(hp.n_head) * hp.head_dim,
               Dkv = double(hp.n_head_kv) * hp.head_dim, V = hp.n_vocab;
  const double layer = E * Dq * 2 + E * Dkv * 2 + 3 * E * F;
  return hp.n_layer * layer + V * E * (hp.tied_output ? 1 : 2);
}

std::string commit_id() {
  if (const char* c = std::getenv("CISA_COMMIT"); c && *c) return c;  // the session script's
  auto src = find_source_dir();
  if (!src.ok()) return "unknown";
  std::string out;
  if (FILE* f = popen(("git -C '" + *src + "' rev-parse --short HEAD 2>/dev/null").c_str(), "r")) {
    char buf[128];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

Json nullable(double v) {
  return std::isnan(v) ? Json() : Json(v);
}

struct Derived {
  int64_t steps = 0;
  double decode_s = 0, step_ms = 0, decode_tok_s = 0, total_tok_s = 0;
  Roofline roof;
};

Derived derive(const ProtocolRun& r, const ProtocolReport& rep) {
  const ProtocolArgs& a = *rep.args;
  Derived d;
  d.steps = static_cast<int64_t>(r.step_s.size());
  for (double s : r.step_s) d.decode_s += s;
  d.step_ms = d.steps ? 1e3 * median_of(r.step_s) : NAN;
  d.decode_tok_s = d.decode_s > 0 ? double(a.batch) * d.steps / d.decode_s : NAN;
  const double tokens = double(a.batch) * a.tokens;
  d.total_tok_s = std::isnan(r.ttft_s)
                      ? d.decode_tok_s
                      : (double(a.batch) * a.context + tokens) / (r.ttft_s + d.decode_s);
  d.roof = decode_roofline(r, rep.bandwidth_gb_s, a.batch, a.context);
  return d;
}

Json run_json(const ProtocolRun& r, const Derived& d) {
  Json j = Json::object();
  j["attention_mode"] = r.mode;
  j["backend"] = r.backend;
  // Whether decode steps ran from CUDA graphs (BackendOptions::step_graphs): steps launched one
  // by one, recorded, and replayed, over the whole run (warm-up, prefill or fill, decode).
  Json g = Json::object();
  g["enabled"] = r.graphs.enabled;
  g["eager_steps"] = r.graphs.eager;
  g["captured_steps"] = r.graphs.captured;
  g["replayed_steps"] = r.graphs.replayed;
  j["cuda_graphs"] = g;
  // The kernel each matrix-product shape ran on (the per-shape timing's pick; CUDA only).
  if (!r.gemm_choices.empty()) {
    Json c = Json::array();
    for (const std::string& line : r.gemm_choices) c.push_back(line);
    j["gemm_choices"] = c;
  }
  j["load_s"] = r.load_s;
  j["ttft_s"] = nullable(r.ttft_s);
  if (std::isnan(r.ttft_s))
    j["ttft_note"] = "not measured: the cache was filled with random K/V (--fill random)";
  j["fill_s"] = nullable(r.fill_s);
  j["decode_steps"] = d.steps;
  j["decode_s"] = d.decode_s;
  j["decode_step_ms_median"] = nullable(d.step_ms);
  j["decode_tok_s"] = nullable(d.decode_tok_s);
  j["total_tok_s"] = nullable(d.total_tok_s);
  j["decode_step_ms"] = Json::array();
  for (double s : r.step_s) j["decode_step_ms"].push_back(1e3 * s);
  j["peak_memory_bytes"] = r.peak_memory;
  j["weight_bytes"] = r.weight_bytes;
  j["kv_cache_bytes"] = kv_cache_bytes(r.cache);
  j["threads"] = r.threads;
  j["attention"] = r.attention;
  Json roof = Json::object();
  roof["weight_bytes_per_step"] = d.roof.weight_bytes;
  roof["kv_bytes_per_step"] = d.roof.kv_bytes;
  roof["rep_bytes_per_step"] = d.roof.rep_bytes;
  roof["bytes_per_step"] = d.roof.bytes();
  roof["floor_ms"] = 1e3 * d.roof.floor_s;
  roof["step_ms"] = nullable(d.step_ms);
  roof["percent_of_roofline"] = nullable(100.0 * 1e3 * d.roof.floor_s / d.step_ms);
  j["roofline"] = roof;
  return j;
}

}  // namespace

double median_of(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Roofline decode_roofline(const ProtocolRun& r, double bandwidth_gb_s, int64_t batch,
                         int64_t context) {
  Roofline roof;
  const ModelHparams& hp = r.hp;
  const double params = matrix_params(hp);
  const double bytes_per_param = params > 0 ? r.weight_bytes / params : 0;
  roof.weight_bytes =
      r.weight_bytes - (hp.tied_output ? 0.0 : double(hp.n_vocab) * hp.n_embd * bytes_per_param);
  const double elem = r.cache.dtype == KvDtype::kBF16 ? 2.0 : 4.0;
  const int64_t steps = static_cast<int64_t>(r.step_s.size());
  const int P = r.cache.page_size;
  if (steps > 0) {
    const double pages =
        double(r.total.global_pages_read - r.prefill.global_pages_read) / double(steps);
    roof.kv_bytes = pages * P * hp.head_dim * 2 * elem;
  }
  // Every step at the middle position of the decode, for the terms counted from a formula.
  const int64_t pos = context + steps / 2;
  int n_swa = 0, n_cisa = 0;
  for (int l = 0; l < hp.n_layer; ++l) {
    if (!hp.is_global(l))
      ++n_swa;
    else if (l >= r.options.attention.dense_layers)
      ++n_cisa;
  }
  if (n_swa > 0 && hp.sliding_window > 0)
    roof.kv_bytes += double(batch) * n_swa * hp.n_head_kv *
                     double(std::min<int64_t>(pos + 1, hp.sliding_window)) * hp.head_dim * 2 * elem;
  if (r.options.attention.mode == AttentionMode::kCisa) {
    SelectionParams sel = r.options.attention.selection;
    sel.qshare = 1;  // decode rows are groups of one
    roof.rep_bytes = double(batch) * n_cisa * hp.n_head_kv * double(eligible_count(pos, P, sel)) *
                     rep_width(r.cache.rep, hp.head_dim) * elem;
  }
  roof.floor_s = bandwidth_gb_s > 0 ? roof.bytes() / (bandwidth_gb_s * 1e9) : NAN;
  return roof;
}

int print_protocol_report(const ProtocolReport& rep) {
  const ProtocolArgs& a = *rep.args;
  const bool synthetic = !a.mo.synthetic.empty();
  std::vector<Derived> d;
  for (const ProtocolRun& r : rep.runs) d.push_back(derive(r, rep));
  const ProtocolRun& last = rep.runs.back();
  Json j = Json::object();
  j["benchmark"] = "model-fixed-output";
  j["model"] = synthetic ? "synthetic:" + a.mo.synthetic : a.model_path;
  if (synthetic) j["weights"] = kSyntheticNote;
  if (synthetic && a.mo.synthetic_layers > 0) j["synthetic_layers"] = last.hp.n_layer;
  j["architecture"] = model_arch_name(last.hp.arch);
  j["model_name"] = last.hp.name;
  j["backend"] = last.backend;
  if (!rep.device.empty()) {
    j["gpu"] = rep.device;
    j["gpu_memory_bytes"] = rep.device_memory;
    j["cuda_driver_api"] = rep.driver_api;
    j["cuda_runtime_api"] = rep.runtime_api;
  }
  j["commit"] = commit_id();
  j["command"] = a.command;
  j["date"] = utc_now();
  j["batch"] = a.batch;
  j["context"] = a.context;
  j["tokens"] = a.tokens;
  j["fill"] = a.fill;
  j["seed"] = a.seed;
  j["prefill_block"] = last.options.prefill_block;
  j["kv_dtype"] = kv_dtype_name(last.cache.dtype);
  j["batch_invariant"] = last.options.batch_invariant;
  j["mixed_tiles"] = last.options.mixed_tiles;
  j["eos"] = "ignored: every request generates exactly --tokens tokens (greedy)";
  Json bw = Json::object();
  bw["gb_per_s"] = rep.bandwidth_gb_s;
  bw["kind"] = rep.bandwidth_kind;
  bw["buffer_bytes"] = rep.bandwidth_bytes;
  j["bandwidth"] = bw;
  j["roofline_formula"] =
      "step >= (weight bytes + sum over sequences of attended K/V bytes + representative bytes "
      "scanned) / bandwidth";
  j["runs"] = Json::object();
  for (size_t i = 0; i < rep.runs.size(); ++i)
    j["runs"][rep.runs[i].mode] = run_json(rep.runs[i], d[i]);
  const bool compare = rep.runs.size() == 2;
  if (compare) {
    Json v = Json::object();
    v["decode_speedup"] = nullable(d[1].decode_tok_s / d[0].decode_tok_s);
    v["ttft_speedup"] = nullable(rep.runs[0].ttft_s / rep.runs[1].ttft_s);
    v["total_speedup"] = nullable(d[1].total_tok_s / d[0].total_tok_s);
    v["roofline_speedup"] = d[0].roof.floor_s / d[1].roof.floor_s;
    j["cisa_vs_dense"] = v;
  }
  if (a.json) {
    print_json(j);
    return 0;
  }
  std::printf("%s%s: B=%lld requests x L=%lld context, T=%lld tokens each, fill %s, %s, KV %s\n",
              synthetic ? last.hp.name.c_str() : a.model_path.c_str(),
              synthetic ? " (synthetic weights, speed only)" : "", static_cast<long long>(a.batch),
              static_cast<long long>(a.context), static_cast<long long>(a.tokens), a.fill.c_str(),
              last.backend.c_str(), kv_dtype_name(last.cache.dtype));
  std::printf("bandwidth %.1f GB/s (%s)\n", rep.bandwidth_gb_s, rep.bandwidth_kind.c_str());
  std::printf("%-8s %10s %12s %12s %12s %11s %11s %8s %10s\n", "", "TTFT s", "decode tok/s",
              "total tok/s", "step ms", "floor ms", "GB/step", "% roof", "peak GiB");
  for (size_t i = 0; i < rep.runs.size(); ++i) {
    const ProtocolRun& r = rep.runs[i];
    char ttft[32] = "-";
    if (!std::isnan(r.ttft_s)) std::snprintf(ttft, sizeof ttft, "%.3f", r.ttft_s);
    std::printf("%-8s %10s %12.1f %12.1f %12.3f %11.3f %11.2f %7.1f%% %10.2f\n", r.mode.c_str(),
                ttft, d[i].decode_tok_s, d[i].total_tok_s, d[i].step_ms, 1e3 * d[i].roof.floor_s,
                d[i].roof.bytes() / 1e9, 100.0 * 1e3 * d[i].roof.floor_s / d[i].step_ms,
                r.peak_memory / double(int64_t{1} << 30));
  }
  if (compare) {
    std::printf("cisa / dense: decode %.2fx", d[1].decode_tok_s / d[0].decode_tok_s);
    if (!std::isnan(rep.runs[0].ttft_s))
      std::printf(", TTFT %.2fx, total %.2fx", rep.runs[0].ttft_s / rep.runs[1].ttft_s,
                  d[1].total_tok_s / d[0].total_tok_s);
    std::printf("; roofline ratio %.2fx\n", d[0].roof.floor_s / d[1].roof.floor_s);
  }
  if (a.fill == "random")
    std::printf("TTFT not measured: each cache was filled with %lld tokens of random K/V\n",
                static_cast<long long>(a.context));
  if (synthetic) std::printf("(%s)\n", kSyntheticNote);
  return 0;
}

}  // namespace cisa::cli
