// The Markdown summary of a run directory: accuracy by configuration and length with 95% task
// bootstrap intervals, the paired change against dense on the same prompts, per-task tables,
// generated length, pages read, and the long-document likelihood tables.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cisa/core/atomic_file.h"
#include "cisa/core/json.h"
#include "eval_internal.h"

namespace cisa::eval {
namespace {

namespace fs = std::filesystem;

struct Record {
  std::string id, task, config;
  int64_t length = 0, index = 0, budget = 0;
  double score = 0, gen_tokens = 0, pages_read = 0, pages_dense = 0;
  std::vector<double> nll, kl, agree;
  bool doc = false;
};

std::string f2(double x, const char* f = "%.1f") {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

std::string interval(const Interval& iv, double scale, const char* f = "%.1f") {
  return f2(iv.mean * scale, f) + " [" + f2(iv.lo * scale, f) + ", " + f2(iv.hi * scale, f) + "]";
}

}  // namespace

namespace {

// The layers a configuration keeps dense, as its options say: "first 3, last 2, 7-10", or "—".
std::string dense_layers_text(const EvalConfig& c) {
  std::string out;
  const auto add = [&out](const std::string& part) {
    if (!out.empty()) out.append(", ");
    out.append(part);
  };
  if (c.dense_layers > 0) add("first " + std::to_string(c.dense_layers));
  if (c.dense_last_layers > 0) add("last " + std::to_string(c.dense_last_layers));
  const std::vector<int>& set = c.dense_layer_set;
  for (size_t i = 0; i < set.size();) {
    size_t j = i;  // a run of consecutive layers prints as a-b
    while (j + 1 < set.size() && set[j + 1] == set[j] + 1) ++j;
    std::string item = std::to_string(set[i]);
    if (j > i) item.append("-").append(std::to_string(set[j]));
    add(item);
    i = j + 1;
  }
  return out.empty() ? "—" : out;
}

const std::string kDense = "dense";

// A run's results as the summary reads them. `by` points into `recs`: a Run is built in place.
struct Run {
  std::vector<Record> recs;
  std::string command, model;
  std::vector<std::string> configs;  // run.json's order, then any others the results name
  std::set<int64_t> lengths;
  std::set<std::string> tasks;  // generation tasks (documents apart)
  // (task, length, index, config) → record.
  std::map<std::tuple<std::string, int64_t, int64_t, std::string>, const Record*> by;
  bool any_doc = false;
  // The dense result on r's prompt, or null.
  const Record* dense_of(const Record& r) const {
    const auto d = by.find({r.task, r.length, r.index, kDense});
    return d == by.end() ? nullptr : d->second;
  }
  Run() = default;
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
};

// The results of results.jsonl; lines cut by an interrupted write, or no result at all, are
// skipped. `lines`: the non-empty lines read.
Result<std::vector<Record>> read_records(const fs::path& results, int64_t* lines) {
  std::ifstream in(results);
  if (!in) return not_found("no results in '" + results.string() + "'");
  std::vector<Record> recs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++*lines;
    const auto v = json_parse(line);
    if (!v.ok() || json_string(*v, "id").empty() || json_string(*v, "config").empty() ||
        json_string(*v, "task").empty())
      continue;
    Record r;
    r.id = json_string(*v, "id");
    r.task = json_string(*v, "task");
    r.config = json_string(*v, "config");
    r.length = static_cast<int64_t>(json_number(*v, "length"));
    r.index = static_cast<int64_t>(json_number(*v, "index"));
    r.budget = static_cast<int64_t>(json_number(*v, "budget"));
    r.score = json_number(*v, "score");
    r.gen_tokens = json_number(*v, "generated_tokens");
    if (const Json* s = json_member(*v, "stats")) {
      r.pages_read = json_number(*s, "global_pages_read");
      r.pages_dense = json_number(*s, "global_pages_dense");
    }
    r.doc = r.task == "doc";
    r.nll = json_numbers(*v, "nll");
    r.kl = json_numbers(*v, "kl");
    r.agree = json_numbers(*v, "agree");
    recs.push_back(std::move(r));
  }
  return recs;
}

// Reads a run directory (results.jsonl and run.json) into `run`.
Status load_run(const std::string& run_dir, Run* run) {
  const fs::path results = fs::path(run_dir) / "results.jsonl";
  int64_t lines = 0;
  CISA_ASSIGN_OR_RETURN(run->recs, read_records(results, &lines));
  if (run->recs.empty()) {
    // (Appended piece by piece: g++ 12 warns, wrongly, on the one-expression form here.)
    std::string why = "'";
    why.append(results.string()).append("' holds no results (").append(std::to_string(lines));
    why.append(" non-empty lines, none a result of cisa eval); summary.md not written");
    return data_loss(why);
  }
  std::ifstream m(fs::path(run_dir) / "run.json");
  std::stringstream ss;
  ss << m.rdbuf();
  if (auto meta = json_parse(ss.str()); meta.ok()) {
    run->command = json_string(*meta, "command");
    run->model = json_string(*meta, "model");
    run->configs = json_strings(*meta, "configs");
  }
  for (const auto& r : run->recs) {
    if (std::find(run->configs.begin(), run->configs.end(), r.config) == run->configs.end())
      run->configs.push_back(r.config);
    run->lengths.insert(r.length);
    if (!r.doc) run->tasks.insert(r.task);
    run->any_doc = run->any_doc || r.doc;
    run->by[{r.task, r.length, r.index, r.config}] = &r;
  }
  return Status::Ok();
}

// What each configuration attends to at the end of a prompt of each length (SPEC §3, B = 16).
void write_configurations(const Run& run, std::ostringstream& md) {
  md << "## Configurations\n\nAt the end of a prompt of each length: eligible remote chunks E "
        "(older than the "
        "window W), the budget k, and the pages a query attends (k + W + its own page, plus "
        "sinks) against the "
        "dense page count, in each layer that runs CISA; the layers a configuration keeps "
        "dense read every page (\"dense layers\"), and per-layer budgets (lb) give each layer "
        "its own k. The pages read over all layers are in \"Generated length and pages "
        "read\".\n\n| config | length | W | E | k | attended / dense pages | dense layers "
        "|\n|---|---|---|---|---|---|---|\n";
  std::set<std::pair<std::string, int64_t>> seen;
  for (const auto& r : run.recs) {
    if (!seen.insert({r.config, r.length}).second) continue;
    auto c = parse_config(r.config);
    if (!c.ok() || c->kind == ConfigKind::kDense) continue;
    RepKind rep;
    auto a = config_attention(*c, r.length, 16, &rep);
    if (!a.ok()) continue;
    const int64_t pages = r.length / 16, W = a->selection.window, k = a->selection.budget;
    const int64_t E = std::max<int64_t>(0, pages - W - a->selection.sink_pages);
    const int64_t att = std::min(pages, std::min(k, E) + W + 1 + a->selection.sink_pages);
    md << "| " << r.config << " | " << r.length << " | " << W << " | " << E << " | "
       << (c->layer_budgets ? std::string("per layer") : std::to_string(k)) << " | " << att << " / "
       << pages << " ("
       << f2(static_cast<double>(pages) / static_cast<double>(std::max<int64_t>(1, att)), "%.1fx")
       << ") | " << dense_layers_text(*c) << " |\n";
  }
  md << "\n";
}

// Task accuracy by configuration and length, with task-bootstrap intervals.
void write_accuracy_by_length(const Run& run, int iters, std::ostringstream& md) {
  md << "## Task accuracy by length\n\n| config |";
  for (int64_t L : run.lengths) md << " " << L << " |";
  md << "\n|---|";
  for (size_t i = 0; i < run.lengths.size(); ++i) md << "---|";
  md << "\n";
  for (const auto& c : run.configs) {
    md << "| " << c << " |";
    for (int64_t L : run.lengths) {
      std::vector<std::vector<double>> groups;
      for (const auto& t : run.tasks) {
        std::vector<double> g;
        for (const auto& r : run.recs)
          if (!r.doc && r.config == c && r.length == L && r.task == t) g.push_back(r.score);
        groups.push_back(g);
      }
      bool any = false;
      for (const auto& g : groups) any = any || !g.empty();
      md << " " << (any ? interval(bootstrap_interval(groups, iters, 1), 100.0) : "–") << " |";
    }
    md << "\n";
  }
}

// The paired change against dense on the same prompts, and each configuration's worst length.
void write_change_against_dense(const Run& run, int iters, std::ostringstream& md) {
  md << "\n## Change against dense (paired, points)\n\n| config |";
  for (int64_t L : run.lengths) md << " " << L << " |";
  md << " worst |\n|---|";
  for (size_t i = 0; i <= run.lengths.size(); ++i) md << "---|";
  md << "\n";
  for (const auto& c : run.configs) {
    if (c == kDense) continue;
    md << "| " << c << " |";
    double worst = 0;
    bool any_len = false;
    for (int64_t L : run.lengths) {
      std::vector<std::vector<double>> groups;
      bool any = false;
      for (const auto& t : run.tasks) {
        std::vector<double> g;
        for (const auto& [key, r] : run.by) {
          if (std::get<0>(key) != t || std::get<1>(key) != L || std::get<3>(key) != c) continue;
          auto d = run.by.find({t, L, std::get<2>(key), kDense});
          if (d != run.by.end()) g.push_back(r->score - d->second->score);
        }
        any = any || !g.empty();
        groups.push_back(g);
      }
      if (!any) {
        md << " – |";
        continue;
      }
      const Interval iv = bootstrap_interval(groups, iters, 2);
      worst = any_len ? std::min(worst, iv.mean) : iv.mean;
      any_len = true;
      md << " " << (iv.mean >= 0 ? "+" : "") << interval(iv, 100.0) << " |";
    }
    md << " " << (any_len ? f2(100.0 * worst, "%+.1f") : "–") << " |\n";
  }
}

// Mean score per task, configuration and length.
void write_accuracy_by_task(const Run& run, std::ostringstream& md) {
  md << "\n## Accuracy by task\n\n";
  for (int64_t L : run.lengths) {
    md << "### " << L << " tokens\n\n| config |";
    for (const auto& t : run.tasks) md << " " << t << " |";
    md << "\n|---|";
    for (size_t i = 0; i < run.tasks.size(); ++i) md << "---|";
    md << "\n";
    for (const auto& c : run.configs) {
      md << "| " << c << " |";
      for (const auto& t : run.tasks) {
        double s = 0;
        int n = 0;
        for (const auto& r : run.recs)
          if (!r.doc && r.config == c && r.length == L && r.task == t) s += r.score, ++n;
        md << " " << (n ? f2(100.0 * s / n) + " (n=" + std::to_string(n) + ")" : "–") << " |";
      }
      md << "\n";
    }
    md << "\n";
  }
}

// Generated tokens and pages read against dense on the same prompts.
void write_generated_length(const Run& run, std::ostringstream& md) {
  md << "## Generated length and pages read\n\n"
        "Generated tokens per example (greedy, stopped at a line break or end of generation) and "
        "the change against dense on the same prompts. Pages read: global-layer K/V pages read "
        "under SPEC §8's traffic model (every query position reads its list's pages up to its "
        "own page), summed over the prompt and the generated tokens, against dense's count for "
        "the same positions.\n\n"
        "| config | length | gen tokens | Δ vs dense | pages read / dense "
        "|\n|---|---|---|---|---|\n";
  for (const auto& c : run.configs)
    for (int64_t L : run.lengths) {
      double g = 0, gd = 0, pr = 0, pd = 0;
      int n = 0;
      for (const auto& r : run.recs) {
        if (r.doc || r.config != c || r.length != L) continue;
        const Record* d = run.dense_of(r);
        if (!d) continue;
        g += r.gen_tokens, gd += d->gen_tokens, pr += r.pages_read, pd += r.pages_dense, ++n;
      }
      if (!n) continue;
      md << "| " << c << " | " << L << " | " << f2(g / n, "%.2f") << " | "
         << (c == kDense ? "–" : f2(gd > 0 ? 100.0 * (g - gd) / gd : 0.0, "%+.1f%%")) << " | "
         << (pd > 0 ? f2(100.0 * pr / pd, "%.1f%%") : "–") << " |\n";
    }
  md << "\n";
}

// Long documents: NLL, perplexity, KL against dense (document bootstrap) and top-1 agreement.
void write_document_likelihood(const Run& run, int iters, std::ostringstream& md) {
  md << "## Long-document likelihood\n\n"
        "Next-token NLL (nats) over the final stretch of each document, perplexity exp(mean "
        "NLL), "
        "KL(dense ‖ config) in nats per token (95% bootstrap over documents) and top-1 agreement "
        "with dense.\n\n"
        "| config | length | docs | positions | NLL | PPL | ΔNLL | KL | top-1 agree "
        "|\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& c : run.configs)
    for (int64_t L : run.lengths) {
      double nll = 0, nll_d = 0, agree = 0;
      int64_t pos = 0, docs = 0;
      std::vector<double> kl_doc;
      for (const auto& r : run.recs) {
        if (!r.doc || r.config != c || r.length != L) continue;
        const Record* d = run.dense_of(r);
        if (!d || d->nll.size() != r.nll.size()) continue;
        ++docs;
        double k = 0;
        for (size_t i = 0; i < r.nll.size(); ++i) {
          nll += r.nll[i], nll_d += d->nll[i], ++pos;
          if (i < r.kl.size()) k += r.kl[i];
          if (i < r.agree.size()) agree += r.agree[i];
        }
        kl_doc.push_back(r.nll.empty() ? 0 : k / static_cast<double>(r.nll.size()));
      }
      if (!pos) continue;
      const double mn = nll / static_cast<double>(pos), mnd = nll_d / static_cast<double>(pos);
      md << "| " << c << " | " << L << " | " << docs << " | " << pos << " | " << f2(mn, "%.4f")
         << " | " << f2(std::exp(mn), "%.3f") << " | " << f2(mn - mnd, "%+.4f") << " | "
         << (c == kDense ? "–" : interval(bootstrap_interval({kl_doc}, iters, 3), 1.0, "%.4f"))
         << " | " << (c == kDense ? "–" : f2(100.0 * agree / static_cast<double>(pos), "%.1f%%"))
         << " |\n";
    }
}

// KL against dense by quarter of each document's scored stretch.
void write_kl_by_quarter(const Run& run, std::ostringstream& md) {
  md << "\n### KL(dense ‖ config) by position in the scored stretch (nats/token)\n\n"
        "Quarters of the final stretch, earliest first.\n\n| config | length | q1 | q2 | q3 | q4 "
        "|\n|---|---|---|---|---|---|\n";
  for (const auto& c : run.configs) {
    if (c == kDense) continue;
    for (int64_t L : run.lengths) {
      double s[4] = {0, 0, 0, 0};
      int64_t n[4] = {0, 0, 0, 0};
      for (const auto& r : run.recs) {
        if (!r.doc || r.config != c || r.length != L) continue;
        for (size_t i = 0; i < r.kl.size(); ++i) {
          const size_t b = std::min<size_t>(3, 4 * i / r.kl.size());
          s[b] += r.kl[i], ++n[b];
        }
      }
      if (!n[0]) continue;
      md << "| " << c << " | " << L << " |";
      for (int b = 0; b < 4; ++b)
        md << " " << (n[b] ? f2(s[b] / static_cast<double>(n[b]), "%.4f") : "–") << " |";
      md << "\n";
    }
  }
  md << "\n";
}

}  // namespace

Result<std::string> write_summary(const std::string& run_dir, int bootstrap_iters) {
  Run run;
  CISA_RETURN_IF_ERROR(load_run(run_dir, &run));
  std::ostringstream md;
  md << "# cisa eval: " << (run.model.empty() ? run_dir : run.model) << "\n\n";
  if (!run.command.empty()) md << "Command:\n\n```\n" << run.command << "\n```\n\n";
  md << "Scores are RULER-style (fraction of reference strings found in the greedy continuation), "
        "in points "
        "(0–100). Intervals are 95% percentile bootstrap intervals ("
     << bootstrap_iters
     << " resamples of the examples within each task; the statistic is the mean over tasks of the "
        "task means). "
        "Δ is the paired change against dense on the same prompts.\n\n";

  write_configurations(run, md);
  if (!run.tasks.empty()) {
    write_accuracy_by_length(run, bootstrap_iters, md);
    write_change_against_dense(run, bootstrap_iters, md);
    write_accuracy_by_task(run, md);
    write_generated_length(run, md);
  }
  if (run.any_doc) {
    write_document_likelihood(run, bootstrap_iters, md);
    write_kl_by_quarter(run, md);
  }
  const std::string text = md.str();
  CISA_RETURN_IF_ERROR(write_file_atomic((fs::path(run_dir) / "summary.md").string(), text));
  return text;
}

}  // namespace cisa::eval
