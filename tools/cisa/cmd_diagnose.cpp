// cisa diagnose — SPEC §9 selection diagnostics on a model's real activations, per global layer:
// a table, --json, and --plot (scripts/plot_diagnose.py draws the PNG).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cisa/core/atomic_file.h"
#include "cisa/core/json.h"
#include "cisa/core/plan.h"
#include "cisa/model/indexer.h"
#include "cisa/model/model_store.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"

namespace cisa::cli {
namespace {

constexpr FailWith fail{"cisa diagnose"};

Json to_json(const DiagnoseReport& r, const DiagnoseOptions& o, const std::string& model,
             const std::string& indexer) {
  Json j = Json::object();
  j["model"] = model;
  j["architecture"] = r.model.arch;
  j["indexer"] = indexer.empty() ? Json("none: mean of each group's query heads") : Json(indexer);
  j["tokens"] = r.tokens;
  j["positions"] = r.positions;
  j["budget"] = o.budget;
  j["window"] = o.window;
  j["sink_pages"] = o.sink_pages;
  Json qs = Json::array(), lags = Json::array();
  for (int64_t g : o.qshare) qs.push_back(g);
  for (int64_t l : o.lags) lags.push_back(l);
  j["qshare"] = qs;
  j["lags"] = lags;
  Json layers = Json::array();
  for (const LayerDiagnostics& l : r.layers) {
    Json lj = Json::object();
    lj["layer"] = l.layer;
    lj["samples"] = l.samples;
    lj["cisa_mass"] = l.cisa_mass;
    lj["oracle_mass"] = l.oracle_mass;
    lj["recency_mass"] = l.recency_mass;
    Json ret = Json::array(), lost = Json::array(), ovl = Json::array();
    for (double v : l.qshare_retention) ret.push_back(v);
    for (double v : l.qshare_mass_lost) lost.push_back(v);
    for (double v : l.overlap) ovl.push_back(v);
    lj["qshare_retention"] = ret;
    lj["qshare_mass_lost"] = lost;
    lj["overlap"] = ovl;
    lj["window_mass"] = l.window_mass;
    lj["extra_mass_index"] = l.extra_mass_index;
    lj["extra_mass_oracle"] = l.extra_mass_oracle;
    lj["fp8_mass"] = l.fp8_mass;
    lj["int8_mass"] = l.int8_mass;
    lj["fp8_overlap"] = l.fp8_overlap;
    lj["int8_overlap"] = l.int8_overlap;
    Json gc = Json::array(), go = Json::array();
    for (double v : l.group_cisa_mass) gc.push_back(v);
    for (double v : l.group_oracle_mass) go.push_back(v);
    lj["group_cisa_mass"] = gc;
    lj["group_oracle_mass"] = go;
    layers.push_back(lj);
  }
  j["layers"] = layers;
  return j;
}

void print_table(const DiagnoseReport& r, const DiagnoseOptions& o) {
  std::printf("%lld tokens, %lld positions, k = %lld, W = %lld, sinks %lld; index queries: %s\n",
              static_cast<long long>(r.tokens), static_cast<long long>(r.positions),
              static_cast<long long>(o.budget), static_cast<long long>(o.window),
              static_cast<long long>(o.sink_pages),
              r.calibrated ? "calibrated indexer" : "mean of each group's query heads");
  std::printf(
      "dense mass on the attended pages (selection + window + current page), %% of the position's "
      "mass\n");
  std::printf("layer  samples   CISA  oracle recency |");
  for (int64_t g : o.qshare) std::printf(" ret G%-3lld", static_cast<long long>(g));
  for (int64_t g : o.qshare) std::printf(" lost G%-3lld", static_cast<long long>(g));
  std::printf(" |");
  for (int64_t l : o.lags) std::printf(" ovl l%-3lld", static_cast<long long>(l));
  std::printf(" | window  +W idx +W orcl |   fp8   int8 ovl fp8 ovl int8\n");
  for (const LayerDiagnostics& l : r.layers) {
    std::printf("%5d  %7lld %6.2f %7.2f %7.2f |", l.layer, static_cast<long long>(l.samples),
                100 * l.cisa_mass, 100 * l.oracle_mass, 100 * l.recency_mass);
    for (double v : l.qshare_retention) std::printf(" %7.2f", 100 * v);
    for (double v : l.qshare_mass_lost) std::printf(" %8.2f", 100 * v);
    std::printf(" |");
    for (double v : l.overlap) std::printf(" %7.2f", 100 * v);
    std::printf(" | %6.2f %6.2f %7.2f | %6.2f %6.2f %7.2f %8.2f\n", 100 * l.window_mass,
                100 * l.extra_mass_index, 100 * l.extra_mass_oracle, 100 * l.fp8_mass,
                100 * l.int8_mass, 100 * l.fp8_overlap, 100 * l.int8_overlap);
  }
}

// scripts/plot_diagnose.py beside the working directory or the repository the binary was built in.
std::string find_plot_script() {
  std::vector<std::filesystem::path> roots = {std::filesystem::current_path()};
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (auto p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
      roots.push_back(p);
  for (const auto& r : roots)
    if (std::filesystem::exists(r / "scripts" / "plot_diagnose.py"))
      return (r / "scripts" / "plot_diagnose.py").string();
  return "";
}

}  // namespace

int cmd_diagnose(int argc, char** argv) {
  ArgParser p("cisa diagnose",
              "CISA selection diagnostics on real activations, per global layer (SPEC section 9).");
  std::string model_arg, indexer_path, text_path, plot_path;
  DiagnoseOptions o;
  int64_t budget = 128, window = 32, sinks = 0, positions = 32, seed = 1, threads = 0,
          max_tokens = 0;
  bool json = false, quiet = false;
  p.add_string("--model", &model_arg, "model name (gemma3-270m, smollm2-135m) or GGUF path", true);
  p.alias("-m", "--model");
  p.add_string("--indexer", &indexer_path,
               "indexer from cisa calibrate (default: mean of each group's heads)");
  p.add_string("--file", &text_path, "text to run the model over", true);
  p.alias("-f", "--file");
  const IntRange pages{0, kMaxSelectionPages};
  p.add_int("--budget", &budget, "chunk budget k (default: the indexer's, else 128)",
            {1, kMaxSelectionPages});
  p.add_int("--window", &window, "window W in pages (default: the indexer's, else 32)", pages);
  p.add_int("--sink-pages", &sinks, "first pages always attended (default 0)", pages);
  p.add_int("--positions", &positions, "sampled positions (default 32)", {1, 1 << 20});
  p.add_int("--seed", &seed, "position sampling seed (default 1)", {0, INT64_MAX});
  p.add_int("--tokens", &max_tokens, "use at most this many tokens of the text",
            {0, kMaxContextTokens});
  p.add_int("--threads", &threads, "worker threads (default: one per hardware thread)", {0, 1024});
  p.add_string("--plot", &plot_path, "also write a PNG plot (python3 + matplotlib)");
  p.add_flag("--json", &json, "print one JSON document instead of the table");
  p.add_flag("--quiet", &quiet, "no progress on stderr");
  if (int rc = p.parse(argc, argv); rc >= 0) return rc;
  if (!plot_path.empty()) {
    if (Status s = check_output_path(plot_path); !s.ok()) return fail("--plot: " + s.message());
    if (Status s = check_output_path(plot_path + ".json"); !s.ok())
      return fail("--plot: " + s.message());
  }

  auto text = read_input_file(text_path, "--file");
  if (!text.ok()) return fail(text.status().message());
  if (text->empty()) return fail("--file: '" + text_path + "' is empty");
  auto path = resolve_model(model_arg);
  if (!path.ok()) return fail(path.status().message());
  Indexer idx;
  if (!indexer_path.empty()) {
    auto loaded = load_indexer(indexer_path);
    if (!loaded.ok()) return fail(loaded.status().message());
    idx = std::move(*loaded);
  }
  // A value given on the command line always wins; otherwise the indexer's, else the defaults.
  o.budget = p.given("--budget") || indexer_path.empty() ? budget : idx.settings.budget;
  o.window = p.given("--window") || indexer_path.empty() ? window : idx.settings.window;
  o.sink_pages = sinks;
  o.positions = positions;
  o.seed = static_cast<uint64_t>(seed);
  o.threads = static_cast<int>(threads);
  o.max_tokens = max_tokens;
  const bool tty = !quiet && isatty(STDERR_FILENO);
  const Stopwatch clock;
  o.progress = [&](int64_t done, int64_t total) {
    if (quiet) return;
    const double s = clock.seconds();
    const double eta =
        done > 0 ? s * static_cast<double>(total - done) / static_cast<double>(done) : 0;
    std::fprintf(stderr, "%sprefill %lld/%lld tokens  %.0f tok/s  ETA %.0fs%s", tty ? "\r" : "",
                 static_cast<long long>(done), static_cast<long long>(total),
                 s > 0 ? done / s : 0.0, eta, tty ? "   " : "\n");
  };
  auto report = diagnose_model(*path, *text, indexer_path.empty() ? nullptr : &idx, o);
  if (tty) std::fputc('\n', stderr);
  if (!report.ok()) return fail(report.status().message());
  const Json j = to_json(*report, o, *path, indexer_path);
  if (!plot_path.empty()) {
    const std::string script = find_plot_script();
    if (script.empty())
      return fail("--plot: scripts/plot_diagnose.py not found (run from the repository)");
    const std::string json_path = plot_path + ".json";
    if (Status s = write_json_atomic(json_path, j); !s.ok()) return fail(s.message());
    if (plot_path.find('\'') != std::string::npos || script.find('\'') != std::string::npos)
      return fail("--plot: the paths may not contain a quote");
    const std::string cmd = "python3 '" + script + "' '" + json_path + "' '" + plot_path + "'";
    if (std::system(cmd.c_str()) != 0) return fail("the plot script failed: " + cmd);
  }
  if (json) {
    print_json(j);
  } else {
    print_table(*report, o);
    if (!plot_path.empty())
      std::printf("plot: %s (data %s.json)\n", plot_path.c_str(), plot_path.c_str());
  }
  return 0;
}

}  // namespace cisa::cli
