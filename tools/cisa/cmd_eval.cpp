// cisa eval — quality of CISA against dense on the same prompts: RULER-style tasks and
// long-document likelihood, one JSON line per (example, configuration), a Markdown summary.
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cisa/core/json.h"
#include "cisa/model/eval.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model_store.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"
#include "model_cli.h"

namespace cisa::cli {
namespace {

constexpr FailWith fail{"cisa eval"};

// Splits "a,b c" style lists: every value of a repeated option, each cut at commas.
std::vector<std::string> split_list(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const auto& v : values) {
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) out.push_back(item);
  }
  return out;
}

// "[LABEL=]FILE" items of a list option (--indexer, --layer-budgets): label → file, "" for an
// item without a label; a label given twice is an error naming the option.
Result<std::map<std::string, std::string>> labelled_files(const std::vector<std::string>& values,
                                                          const std::string& option) {
  std::map<std::string, std::string> out;
  for (const std::string& arg : split_list(values)) {
    const size_t eq = arg.find('=');
    const std::string label = eq == std::string::npos ? "" : arg.substr(0, eq);
    if (!out.emplace(label, eq == std::string::npos ? arg : arg.substr(eq + 1)).second)
      return invalid_argument(option + ": label '" + label + "' given twice");
  }
  return out;
}

// --tasks (default: every generation task, then doc).
Status add_tasks(const std::vector<std::string>& args, eval::EvalPlan* plan) {
  std::vector<std::string> tasks = split_list(args);
  if (tasks.empty()) {
    for (auto t : eval::all_generation_tasks()) tasks.push_back(eval::task_name(t));
    tasks.push_back("doc");
  }
  for (const auto& t : tasks) {
    CISA_ASSIGN_OR_RETURN(eval::TaskKind k, eval::parse_task(t));
    plan->tasks.push_back(k);
  }
  return Status::Ok();
}

// --lengths (default 4K, 8K, 16K, 32K), each an integer >= 64.
Status add_lengths(const std::vector<std::string>& args, eval::EvalPlan* plan) {
  std::vector<std::string> lengths = split_list(args);
  if (lengths.empty()) lengths = {"4096", "8192", "16384", "32768"};
  for (const auto& l : lengths) {
    char* end = nullptr;
    const long long v = std::strtoll(l.c_str(), &end, 10);
    if (end != l.c_str() + l.size() || v < 64)
      return invalid_argument("bad length '" + l + "' (an integer >= 64)");
    plan->lengths.push_back(v);
  }
  return Status::Ok();
}

// --configs (default: the comparison set), with dense first (added when missing) and written
// "dense".
Status add_configs(const std::vector<std::string>& args, eval::EvalPlan* plan) {
  std::vector<std::string> configs = split_list(args);
  if (configs.empty())
    configs = {"dense",      "cisa:x8:g4",  "cisa:x8:g4:last", "cisa:x8:g16",
               "cisa:x4:g4", "cisa:x16:g4", "quest:x8:g4",     "recency:x8"};
  if (configs[0] != "dense") configs.insert(configs.begin(), "dense");
  for (const auto& c : configs) {
    CISA_ASSIGN_OR_RETURN(eval::EvalConfig cfg, eval::parse_config(c));
    if (cfg.kind == eval::ConfigKind::kDense && c != "dense")
      return invalid_argument("write the dense configuration as 'dense'");
    if (c == "dense" && !plan->configs.empty()) continue;  // again after the implicit first one
    plan->configs.push_back(std::move(cfg));
  }
  return Status::Ok();
}

// Every 'calLABEL' configuration has its --indexer file.
Status check_indexer_labels(const std::map<std::string, std::string>& indexers,
                            const eval::EvalPlan& plan) {
  for (const auto& c : plan.configs)
    if (c.calibrated && !indexers.count(c.indexer_label))
      return invalid_argument("configuration '" + c.name + "' uses 'cal" + c.indexer_label +
                              "': give --indexer " +
                              (c.indexer_label.empty() ? "" : c.indexer_label + "=") + "FILE");
  return Status::Ok();
}

// --layer-budgets: each 'lbLABEL' configuration gets its file's per-layer weights.
Status add_layer_budgets(const std::vector<std::string>& args, eval::EvalPlan* plan) {
  CISA_ASSIGN_OR_RETURN(auto files, labelled_files(args, "--layer-budgets"));
  std::map<std::string, std::vector<double>> weights;  // label → weights
  for (const auto& [label, file] : files) {
    CISA_ASSIGN_OR_RETURN(auto w, eval::read_layer_budget_weights(file));
    weights.emplace(label, std::move(w));
  }
  for (auto& c : plan->configs) {
    if (!c.layer_budgets) continue;
    auto it = weights.find(c.layer_budgets_label);
    if (it == weights.end())
      return invalid_argument(
          "configuration '" + c.name + "' uses per-layer budgets: give --layer-budgets " +
          (c.layer_budgets_label.empty() ? "" : c.layer_budgets_label + "=") + "FILE");
    c.layer_budget_weights = it->second;
  }
  return Status::Ok();
}

// The --indexer files' projections, for every global layer (a configuration's dense layers
// simply do not use theirs).
Status load_indexers(const std::map<std::string, std::string>& indexers,
                     const std::string& indexer_path, eval::EvalPlan* plan) {
  if (indexers.empty()) return Status::Ok();
  CISA_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(plan->model_path));
  CISA_ASSIGN_OR_RETURN(auto hp, read_model_hparams(f));
  for (const auto& [label, file] : indexers) {
    CISA_ASSIGN_OR_RETURN(auto proj, load_index_projections(file, f, hp, /*dense_layers=*/0));
    plan->index[label] = std::move(proj);
  }
  plan->indexer_path = indexer_path;
  return Status::Ok();
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  ArgParser p("cisa eval",
              "Compare attention configurations on the same prompts: RULER-style tasks "
              "(niah_single, passkey, "
              "niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe) and long-document "
              "likelihood (doc). "
              "Configurations: dense | KIND[:OPT]... with KIND cisa, quest, recency (same pages, "
              "all recent) or "
              "oracle (top-k by true dense mass: the upper bound; costs a dense pass), and OPT kN "
              "(budget in chunks), xR (nominal remote compression: k = E/R at "
              "the length), "
              "gN (QShare G), wN (window pages), sN (sink pages), mean|last (QShare query).");
  std::string model_arg, out_dir, texts_dir, kv = "auto", backend = "cpu", indexer_path;
  std::vector<std::string> task_args, length_args, config_args;
  int64_t examples = 4, seed = 1, threads = 0, prefill_block = 512, bootstrap = 2000, batch = 1,
          doc_rows = 64;
  bool resume = false, summary_only = false, json = false, batch_invariant = false;
  p.add_string("--model", &model_arg, "model name (gemma3-270m, smollm2-135m) or GGUF path");
  p.alias("-m", "--model");
  p.add_strings("--tasks", &task_args,
                "tasks, comma-separated (default: all generation tasks and doc)");
  p.add_strings("--lengths", &length_args,
                "prompt lengths in tokens (default 4096,8192,16384,32768)");
  p.add_strings(
      "--configs", &config_args,
      "configurations (default dense,cisa:x8:g4,cisa:x8:g4:last,cisa:x8:g16,cisa:x4:g4,cisa:x16:g4,"
      "quest:x8:g4,recency:x8)");
  p.add_int("--examples", &examples,
            "examples per (task, length); needle depths spread evenly (default 4)");
  p.add_int("--seed", &seed, "seed of every generator (default 1)");
  p.add_string("--output", &out_dir, "run directory: results.jsonl, run.json, summary.md", true);
  p.alias("-o", "--output");
  p.add_flag("--resume", &resume, "continue a run directory, skipping the lines already written");
  p.add_flag("--summary-only", &summary_only, "only (re)write summary.md from results.jsonl");
  p.add_string("--texts", &texts_dir,
               "haystack texts from scripts/eval_texts.py (default SOURCE/.cache/eval_texts)");
  p.add_string("--indexer", &indexer_path,
               "[LABEL=]FILE,...: indexer files from cisa calibrate, for configurations with the "
               "'cal' (no label) or 'calLABEL' option");
  p.add_int("--threads", &threads, "worker threads (default: all)");
  p.add_int("--prefill-block", &prefill_block, "rows per forward step (default 512)");
  p.add_int("--batch", &batch,
            "prompts of one (length, configuration) generated side by side (default 1; on CUDA "
            "16-64 keep the GPU busy)");
  p.add_int("--doc-rows", &doc_rows,
            "rows of a document's scored tail per forward call (default 64; 1 feeds it as decode "
            "steps, e.g. to measure --reuse-steps' rN)");
  p.add_choice("--kv-dtype", &kv, {"auto", "f32", "bf16"},
               "KV cache storage (default auto: f32 on the CPU, bf16 on CUDA)");
  p.add_choice("--backend", &backend, {"cpu", "cuda"}, "where the models run (default cpu)");
  p.add_flag("--batch-invariant", &batch_invariant,
             "--backend cuda: results that do not depend on --batch (slower)");
  p.add_int("--bootstrap", &bootstrap, "bootstrap resamples for the intervals (default 2000)");
  std::vector<std::string> layer_budget_args;
  p.add_strings("--layer-budgets", &layer_budget_args,
                "per-layer budget weights (LAYER WEIGHT lines), comma-separated [LABEL=]FILE: "
                "configuration option lbLABEL uses FILE (lb: the one without a label)");
  p.add_flag("--json", &json, "print one JSON document (the run directory and summary path)");
  if (int rc = p.parse(argc, argv); rc >= 0) return rc;
  if (bootstrap < 0 || bootstrap > 1000000) return fail("--bootstrap must be in [0, 1000000]");

  if (!summary_only) {
    if (model_arg.empty()) return fail("-m MODEL is required (unless --summary-only)");
    eval::EvalPlan plan;
    auto path = resolve_model(model_arg);
    if (!path.ok()) return fail(path.status().message());
    plan.model_path = *path;
    plan.model_name = model_arg;
    if (texts_dir.empty()) {
      auto src = find_source_dir();
      if (!src.ok()) return fail("give --texts DIR (" + src.status().message() + ")");
      texts_dir = *src + "/.cache/eval_texts";
    }
    plan.texts_dir = texts_dir;
    if (Status s = add_tasks(task_args, &plan); !s.ok()) return fail(s.message());
    if (Status s = add_lengths(length_args, &plan); !s.ok()) return fail(s.message());
    if (Status s = add_configs(config_args, &plan); !s.ok()) return fail(s.message());
    plan.examples = examples;
    plan.seed = static_cast<uint64_t>(seed);
    plan.run_dir = out_dir;
    plan.resume = resume;
    plan.threads = static_cast<int>(threads);
    plan.prefill_block = static_cast<int>(prefill_block);
    if (batch < 1 || batch > 4096) return fail("--batch must be in [1, 4096]");
    plan.batch = static_cast<int>(batch);
    if (doc_rows < 1 || doc_rows > 4096) return fail("--doc-rows must be in [1, 4096]");
    plan.doc_rows = doc_rows;
    if (backend == "cuda" && kv == "f32")
      return fail("--backend cuda keeps K/V in bf16: drop --kv-dtype f32");
    plan.kv_dtype =
        kv == "bf16" || (kv == "auto" && backend == "cuda") ? KvDtype::kBF16 : KvDtype::kF32;
    if (batch_invariant && backend != "cuda")
      return fail("--batch-invariant is a --backend cuda mode");
    plan.batch_invariant = batch_invariant;
    auto factory = cli::backend_factory(backend);
    if (!factory.ok()) return fail(factory.status().message());
    plan.backend = *factory;
    plan.backend_name = backend;
    auto indexers = labelled_files({indexer_path}, "--indexer");
    if (!indexers.ok()) return fail(indexers.status().message());
    if (Status s = check_indexer_labels(*indexers, plan); !s.ok()) return fail(s.message());
    if (Status s = add_layer_budgets(layer_budget_args, &plan); !s.ok()) return fail(s.message());
    if (Status s = load_indexers(*indexers, indexer_path, &plan); !s.ok()) return fail(s.message());
    std::string cmd = "cisa";
    for (int i = 0; i < argc; ++i) cmd += std::string(" ") + argv[i];
    plan.command_line = cmd;
    if (Status s = eval::run_eval(plan); !s.ok()) return fail(s.message());
  }
  auto summary = eval::write_summary(out_dir, static_cast<int>(bootstrap));
  if (!summary.ok()) return fail(summary.status().message());
  if (json) {
    Json j = Json::object();
    j["run_dir"] = out_dir;
    j["results"] = out_dir + "/results.jsonl";
    j["summary"] = out_dir + "/summary.md";
    print_json(j);
  } else {
    std::printf("%s", summary->c_str());
  }
  return 0;
}

}  // namespace cisa::cli
