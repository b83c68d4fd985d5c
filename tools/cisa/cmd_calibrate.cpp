// cisa calibrate — choose the CISA index projection of every global layer and KV group by
// attention-distribution matching on calibration text (SPEC §6) and write the indexer file.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
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

constexpr FailWith fail{"cisa calibrate"};

std::string candidate_name(const CandidateScore& c) {
  if (c.head == kFitCandidate) return "fit";
  if (c.head < 0) return "mean";
  char buf[16];
  std::snprintf(buf, sizeof buf, "h%d", c.head);
  return buf;
}

std::string duration(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  } else {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  }
  return buf;
}

// The per-layer table: for every group the oracle mass and each candidate's KL / captured mass,
// the winner marked with '*'.
void print_calibration_table(const Indexer& idx, FILE* out) {
  std::fprintf(
      out,
      "criterion %s, k = %lld chunks, W = %lld pages, %lld sink pages; KL in nats / mass captured "
      "at k "
      "(oracle: top-k of p)\n",
      calib_criterion_name(idx.settings.criterion), static_cast<long long>(idx.settings.budget),
      static_cast<long long>(idx.settings.window), static_cast<long long>(idx.settings.sink_pages));
  for (const GroupCalibration& g : idx.groups) {
    std::fprintf(out, "layer %2d group %d  n=%-5lld oracle %.4f |", g.layer, g.kv_group,
                 static_cast<long long>(g.positions), g.oracle);
    for (size_t c = 0; c < g.candidates.size(); ++c) {
      const CandidateScore& s = g.candidates[c];
      std::fprintf(out, " %s%-5s %.4f/%.4f", static_cast<int>(c) == g.chosen ? "*" : " ",
                   candidate_name(s).c_str(), s.kl, s.captured);
    }
    std::fprintf(out, "\n");
  }
}

}  // namespace

int cmd_calibrate(int argc, char** argv) {
  ArgParser p(
      "cisa calibrate",
      "Choose each global layer's CISA index projection on calibration text (SPEC section 6).");
  std::string model_arg, out_path, criterion = "kl";
  std::vector<std::string> data;
  int64_t budget = 0, window = 32, sink_pages = 0, positions = 64, seed = 1, max_tokens = 0,
          threads = 0, prefill_block = 512;
  bool json = false, quiet = false, fit = false;
  double fit_ridge = CalibSettings{}.fit_ridge;
  p.add_string("--model", &model_arg, "model name (gemma3-270m, smollm2-135m) or GGUF path", true);
  p.alias("-m", "--model");
  p.add_strings("--data", &data, "calibration text files (scripts/calib_texts.py makes them)",
                true);
  const IntRange pages{0, kMaxSelectionPages};
  p.add_int("--budget", &budget, "chunk budget k the captured-mass score uses",
            {1, kMaxSelectionPages}, true);
  p.add_int("--window", &window, "recent window W in pages (default 32); E_t = {j < c(t) - W}",
            pages);
  p.add_int("--sink-pages", &sink_pages, "first chunks always attended, outside E_t (default 0)",
            pages);
  p.add_choice("--criterion", &criterion, {"kl", "mass"},
               "winner by mean KL(p||pi) (default) or captured mass");
  p.add_int("--positions", &positions, "sampled positions per document (default 64)", {1, 1 << 20});
  p.add_int("--seed", &seed, "position sampling seed (default 1)", {0, INT64_MAX});
  p.add_int("--tokens", &max_tokens, "tokens per document (default: the model's training context)",
            {0, kMaxContextTokens});
  p.add_int("--threads", &threads, "worker threads (default: one per hardware thread)", {0, 1024});
  p.add_int("--prefill-block", &prefill_block, "rows per forward step (default 512)", {1, 65536});
  p.add_string("--output", &out_path, "indexer file to write", true);
  p.alias("-o", "--output");
  p.add_flag("--fit", &fit,
             "add a fitted mix of each group's heads to the candidates (least squares; models "
             "without q/k norms; docs/calibration.md)");
  p.add_double("--fit-ridge", &fit_ridge,
               "the fit's ridge toward the mean, a fraction of the mean diagonal (default 0.05)",
               {0, 1e6});
  p.add_flag("--json", &json, "print one JSON document instead of the table");
  p.add_flag("--quiet", &quiet, "no progress on stderr");
  if (int rc = p.parse(argc, argv); rc >= 0) return rc;
  if (Status s = validate_selection_params(
          {.budget = budget, .window = window, .qshare = 1, .sink_pages = sink_pages});
      !s.ok())
    return fail(s.message());
  // Before the calibration (which can take an hour): a typo in -o costs seconds.
  if (Status s = check_output_path(out_path); !s.ok()) return fail("--output: " + s.message());

  std::vector<CalibText> texts;
  for (const std::string& f : data) {
    auto text = read_input_file(f, "--data");
    if (!text.ok()) return fail(text.status().message());
    if (text->empty()) return fail("calibration file '" + f + "' is empty");
    const size_t slash = f.find_last_of('/');
    texts.push_back(
        {.name = slash == std::string::npos ? f : f.substr(slash + 1), .text = std::move(*text)});
  }
  auto path = resolve_model(model_arg);
  if (!path.ok()) return fail(path.status().message());

  CalibrateOptions o;
  o.settings.budget = budget;
  o.settings.window = window;
  o.settings.sink_pages = sink_pages;
  o.settings.positions = positions;
  o.settings.seed = static_cast<uint64_t>(seed);
  o.settings.criterion = criterion == "mass" ? CalibCriterion::kMass : CalibCriterion::kKl;
  o.settings.fit = fit;
  o.settings.fit_ridge = fit_ridge;
  o.threads = static_cast<int>(threads);
  o.max_tokens = max_tokens;
  o.prefill_block = static_cast<int>(prefill_block);
  const bool tty = !quiet && isatty(STDERR_FILENO);
  const Stopwatch clock;
  double last_print = -1;
  o.progress = [&](const CalibProgress& pr) {
    if (quiet) return;
    const double s = clock.seconds();
    if (tty ? s - last_print < 0.2 && pr.tokens_done < pr.tokens_total : s - last_print < 10)
      return;
    last_print = s;
    const double rate = s > 0 ? pr.tokens_done / s : 0;
    const double eta = rate > 0 ? (pr.tokens_total - pr.tokens_done) / rate : 0;
    std::fprintf(stderr, "%sdocument %d/%d %-7s %lld/%lld tokens  %.0f tok/s  elapsed %s  ETA %s%s",
                 tty ? "\r" : "", pr.document + 1, pr.documents, pr.stage,
                 static_cast<long long>(pr.tokens_done), static_cast<long long>(pr.tokens_total),
                 rate, duration(s).c_str(), duration(eta).c_str(), tty ? "   " : "\n");
    std::fflush(stderr);
  };
  auto idx = calibrate_indexer(*path, texts, o);
  if (tty) std::fputc('\n', stderr);
  if (!idx.ok()) return fail(idx.status().message());
  if (Status s = save_indexer(*idx, out_path); !s.ok()) return fail(s.message());

  if (json) {
    Json j = Json::object();
    j["model"] = *path;
    j["architecture"] = idx->model.arch;
    j["indexer"] = out_path;
    j["budget"] = budget;
    j["window"] = window;
    j["sink_pages"] = sink_pages;
    j["criterion"] = criterion;
    j["fit"] = fit;
    if (fit) j["fit_ridge"] = fit_ridge;
    j["seconds"] = clock.seconds();
    Json docs = Json::array();
    for (const CalibDocument& d : idx->settings.documents) {
      Json dj = Json::object();
      dj["name"] = d.name;
      dj["tokens"] = d.tokens;
      docs.push_back(dj);
    }
    j["documents"] = docs;
    Json groups = Json::array();
    for (const GroupCalibration& g : idx->groups) {
      Json gj = Json::object();
      gj["layer"] = g.layer;
      gj["kv_group"] = g.kv_group;
      gj["positions"] = g.positions;
      gj["oracle_mass"] = g.oracle;
      gj["chosen"] = candidate_name(g.candidates[static_cast<size_t>(g.chosen)]);
      Json cands = Json::array();
      for (const CandidateScore& c : g.candidates) {
        Json cj = Json::object();
        cj["candidate"] = candidate_name(c);
        cj["kl"] = c.kl;
        cj["captured_mass"] = c.captured;
        cands.push_back(cj);
      }
      gj["candidates"] = cands;
      groups.push_back(gj);
    }
    j["groups"] = groups;
    print_json(j);
  } else {
    int64_t tokens = 0;
    for (const CalibDocument& d : idx->settings.documents) tokens += d.tokens;
    std::printf("%s: %zu documents, %lld tokens, %.1f s\n", path->c_str(),
                idx->settings.documents.size(), static_cast<long long>(tokens), clock.seconds());
    print_calibration_table(*idx, stdout);
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}

}  // namespace cisa::cli
