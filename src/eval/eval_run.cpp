// The comparison loop of `cisa eval`: examples generated once, every configuration run on the
// same token ids, one JSON line per (example, configuration) appended as it completes, resume by
// skipping the (id, config) pairs already in the file, progress with an ETA on stderr.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cisa/core/atomic_file.h"
#include "cisa/core/json.h"
#include "cisa/core/thread_pool.h"
#include "cisa/model/gguf.h"
#include "cisa/model/tokenizer.h"
#include "eval_internal.h"

namespace cisa::eval {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string fmt_duration(double s) {
  char b[32];
  const long long t = static_cast<long long>(s + 0.5);
  if (t < 120)
    std::snprintf(b, sizeof b, "%llds", t);
  else if (t < 7200)
    std::snprintf(b, sizeof b, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  return b;
}

Json stats_json(const ForwardStats& s) {
  Json j = Json::object();
  j["global_pages_read"] = s.global_pages_read;
  j["global_pages_dense"] = s.global_pages_dense;
  j["seconds_attention"] = s.seconds_attention;
  // Selection reuse (rN): decode lists that kept their selection and that selected afresh.
  if (s.reuse_lists_kept > 0 || s.reuse_lists_selected > 0) {
    j["reuse_lists_kept"] = s.reuse_lists_kept;
    j["reuse_lists_selected"] = s.reuse_lists_selected;
  }
  return j;
}

template <class T>
Json array_of(const std::vector<T>& v) {
  Json a = Json::array();
  for (const T& x : v) a.push_back(x);
  return a;
}

struct Work {
  Example ex;
  std::vector<int32_t> ids;
  TaskSpec spec;
};

// The models of one prompt length, one per (configuration, sequences held): budgets depend on the
// length, and batched generation needs a cache of `batch` sequences where documents need one.
class ModelCache {
 public:
  explicit ModelCache(const EvalPlan& plan) : plan_(plan) {}
  Result<Model*> get(const EvalConfig& c, int64_t length, int64_t context, int page_size,
                     int sequences) {
    if (length != length_) models_.clear(), length_ = length;
    const std::string key = c.name + "#" + std::to_string(sequences);
    auto it = models_.find(key);
    if (it != models_.end()) return it->second.get();
    ModelOptions o;
    o.threads = plan_.threads;
    o.context = context;
    o.max_sequences = sequences;
    o.prefill_block = plan_.prefill_block;
    o.kv_dtype = plan_.kv_dtype;
    o.backend = plan_.backend;
    o.batch_invariant = plan_.batch_invariant;
    CISA_ASSIGN_OR_RETURN(o.attention, config_attention(c, length, page_size, &o.rep));
    o.rep_precision = c.rep_precision;
    if (c.calibrated) {
      auto it = plan_.index.find(c.indexer_label);
      if (it == plan_.index.end())
        return invalid_argument("configuration '" + c.name + "' uses calibrated projections (cal" +
                                c.indexer_label + ") but no indexer was given for them");
      o.attention.index = it->second;
    }
    CISA_ASSIGN_OR_RETURN(auto m, Model::load(plan_.model_path, o));
    Model* raw = m.get();
    models_[key] = std::move(m);
    return raw;
  }
  // Frees a model (and its KV cache) that no later work of this length needs.
  void drop(const EvalConfig& c, int sequences) {
    models_.erase(c.name + "#" + std::to_string(sequences));
  }

 private:
  const EvalPlan& plan_;
  int64_t length_ = -1;
  std::map<std::string, std::unique_ptr<Model>> models_;
};

// One result per line, appended as it completes (the file is a log: rewriting it per result would
// cost O(n²)); an interrupted append leaves at most a cut last line, which a resume drops.
Status append_line(const std::string& path, const Json& j) {
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << json_dump(j) << "\n";
  out.flush();
  out.close();
  if (!out) return data_loss("cannot append to '" + path + "'");
  return Status::Ok();
}

// The (id, config) pairs already in a run's results file.
using DoneSet = std::set<std::pair<std::string, std::string>>;

constexpr int kPageSize = 16;

Status check_plan(const EvalPlan& plan) {
  if (plan.configs.empty() || plan.configs[0].kind != ConfigKind::kDense)
    return invalid_argument("the first configuration must be dense (the reference)");
  if (plan.tasks.empty() || plan.lengths.empty()) return invalid_argument("no tasks or no lengths");
  if (plan.examples < 1) return invalid_argument("--examples must be >= 1");
  if (plan.batch < 1 || plan.batch > 4096)
    return invalid_argument("--batch must be in [1, 4096] (got " + std::to_string(plan.batch) +
                            ")");
  std::set<std::string> names;
  for (const auto& c : plan.configs)
    if (!names.insert(c.name).second)
      return invalid_argument("configuration '" + c.name + "' is listed twice");
  return Status::Ok();
}

// The pairs a resumed run has already done. A file with results needs --resume; lines cut by an
// interrupted write are dropped (and the file rewritten without them), so they are redone.
Result<DoneSet> read_done(const EvalPlan& plan, const std::string& results) {
  DoneSet done;
  std::error_code ec;
  if (!fs::exists(results) || fs::file_size(results, ec) == 0) return done;
  if (!plan.resume)
    return failed_precondition(
        "'" + results + "' already has results; pass --resume to continue it or choose another -o");
  std::ifstream in(results, std::ios::binary);
  std::string line, kept;
  int64_t lineno = 0, dropped = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    auto v = json_parse(line);
    if (!v.ok() || json_string(*v, "id").empty() || json_string(*v, "config").empty()) {
      // A line cut by an interrupted write: everything before it counts, it is redone.
      std::fprintf(stderr, "cisa eval: dropping unreadable line %lld of %s (%s)\n",
                   static_cast<long long>(lineno), results.c_str(),
                   v.ok() ? "no id or config" : v.status().message().c_str());
      ++dropped;
      continue;
    }
    done.emplace(json_string(*v, "id"), json_string(*v, "config"));
    kept += line;
    kept += '\n';
  }
  if (in.bad()) return data_loss("reading '" + results + "' failed");
  // Rewrite the file without the unreadable lines, every line ending in a newline, so the
  // results appended next start on a line of their own (never glued to a cut one).
  if (dropped > 0) CISA_RETURN_IF_ERROR(write_file_atomic(results, kept));
  return done;
}

// A resumed run must generate the same prompts: ids do not encode the example count (which
// sets the depths) or the seed, so check them against the run's description.
Status check_resume_matches(const EvalPlan& plan) {
  std::ifstream m(fs::path(plan.run_dir) / "run.json");
  std::stringstream ss;
  ss << m.rdbuf();
  if (auto meta = json_parse(ss.str()); m && meta.ok()) {
    const auto ex = static_cast<int64_t>(json_number(*meta, "examples", -1));
    const auto sd = static_cast<int64_t>(json_number(*meta, "seed", -1));
    const std::string model = json_string(*meta, "model_path");
    if (ex != plan.examples || sd != static_cast<int64_t>(plan.seed) || model != plan.model_path)
      return failed_precondition(
          "--resume of '" + plan.run_dir + "' needs the same model, --examples (" +
          std::to_string(ex) + ") and --seed (" + std::to_string(sd) + ") as the run it continues");
  }
  return Status::Ok();
}

// run.json: the run's description, for the summary.
Status write_run_description(const EvalPlan& plan, const ModelHparams& hp) {
  Json meta = Json::object();
  meta["model"] = plan.model_name;
  meta["model_path"] = plan.model_path;
  meta["arch"] = model_arch_name(hp.arch);
  meta["n_ctx_train"] = hp.n_ctx_train;
  meta["command"] = plan.command_line;
  if (!plan.indexer_path.empty()) meta["indexer"] = plan.indexer_path;
  if (plan.backend_name != "cpu") meta["backend"] = plan.backend_name;
  if (plan.batch > 1) meta["batch"] = plan.batch;
  if (plan.batch_invariant) meta["batch_invariant"] = true;
  if (plan.doc_rows != 64) meta["doc_rows"] = plan.doc_rows;
  meta["examples"] = plan.examples;
  meta["seed"] = static_cast<int64_t>(plan.seed);
  Json cfgs = Json::array();
  for (const auto& c : plan.configs) cfgs.push_back(c.name);
  meta["configs"] = cfgs;
  return write_json_atomic((fs::path(plan.run_dir) / "run.json").string(), meta);
}

// The examples with some configuration not yet done, in length order (lengths the model has no
// room for are skipped, with a note).
std::vector<TaskSpec> pending_specs(const EvalPlan& plan, const ModelHparams& hp,
                                    const DoneSet& done) {
  std::vector<TaskSpec> specs;
  for (int64_t requested : plan.lengths) {
    const int64_t length = eval_prompt_length(requested, hp.n_ctx_train);
    if (length == 0) {
      std::fprintf(stderr,
                   "cisa eval: skipping length %lld (the model was trained for %lld tokens)\n",
                   static_cast<long long>(requested), static_cast<long long>(hp.n_ctx_train));
      continue;
    }
    if (length != requested)
      std::fprintf(
          stderr,
          "cisa eval: length %lld leaves no room to generate in the model's %lld-token context: "
          "its prompts are %lld tokens (reported under that length)\n",
          static_cast<long long>(requested), static_cast<long long>(hp.n_ctx_train),
          static_cast<long long>(length));
    for (TaskKind t : plan.tasks) {
      for (int64_t i = 0; i < plan.examples; ++i) {
        TaskSpec spec{.kind = t,
                      .length = length,
                      .index = i,
                      .num_examples = plan.examples,
                      .seed = plan.seed};
        bool pending = false;
        const std::string id_prefix =
            std::string(task_name(t)) + "/" + std::to_string(length) + "/" + std::to_string(i);
        for (const auto& c : plan.configs) {
          bool found = false;
          for (auto it = done.lower_bound({id_prefix, ""});
               it != done.end() && it->first.rfind(id_prefix, 0) == 0; ++it)
            found = found || (it->second == c.name &&
                              (it->first == id_prefix || it->first[id_prefix.size()] == '/'));
          pending = pending || !found;
        }
        if (pending) specs.push_back(spec);
      }
    }
  }
  return specs;
}

// The prompts (a length search with the tokenizer each: about a second at 32K) in parallel; the
// tokenizer and corpus are immutable, and each example depends only on its spec.
Result<std::vector<Work>> make_work(const std::vector<TaskSpec>& specs, const Corpus& corpus,
                                    const Tokenizer& tok, int threads) {
  const TokenCounter count = [&](std::string_view s) {
    return static_cast<int64_t>(tok.encode(s, true).size());
  };
  std::vector<Result<Work>> made(specs.size(), Result<Work>(internal_error("not generated")));
  {
    ThreadPool pool(threads);
    std::atomic<int64_t> ready{0};
    pool.parallel_for(static_cast<int64_t>(specs.size()), [&](int64_t i, int) {
      const TaskSpec& spec = specs[static_cast<size_t>(i)];
      auto ex = generate_example(spec, corpus, count);
      if (!ex.ok()) {
        made[static_cast<size_t>(i)] =
            Status(ex.status().code(),
                   std::string(task_name(spec.kind)) + "/" + std::to_string(spec.length) + "/" +
                       std::to_string(spec.index) + ": " + ex.status().message());
      } else {
        Work w{std::move(*ex), {}, spec};
        w.ids = tok.encode(w.ex.prompt, true);
        made[static_cast<size_t>(i)] = std::move(w);
      }
      const int64_t n = ++ready;
      if (n % 50 == 0 || n == static_cast<int64_t>(specs.size()))
        std::fprintf(stderr, "cisa eval: %lld / %zu prompts made\r", static_cast<long long>(n),
                     specs.size());
    });
    if (!specs.empty()) std::fprintf(stderr, "\n");
  }
  std::vector<Work> work;
  for (auto& r : made) {
    if (!r.ok()) return r.status();
    work.push_back(std::move(*r));
  }
  return work;
}

// Runs the work of one run_eval call: models from a ModelCache, one results line appended per
// (example, configuration) done, progress with an ETA on stderr.
class Runner {
 public:
  Runner(const EvalPlan& plan, std::string results, const DoneSet& done, int64_t total_cost)
      : plan_(plan),
        results_(std::move(results)),
        done_(done),
        cache_(plan),
        total_cost_(total_cost) {}

  // Every configuration of one document, dense first: its log-probabilities are the reference of
  // the others.
  Status run_document(const Work& w, int64_t context) {
    std::vector<float> ref;
    for (const auto& c : plan_.configs) {
      const bool is_dense = c.kind == ConfigKind::kDense;
      if (!is_dense && done_.count({w.ex.id, c.name})) continue;
      bool others_pending = false;
      for (const auto& o : plan_.configs)
        others_pending =
            others_pending || (o.kind != ConfigKind::kDense && !done_.count({w.ex.id, o.name}));
      if (is_dense && done_.count({w.ex.id, c.name}) && !others_pending) continue;
      CISA_ASSIGN_OR_RETURN(Model * m, cache_.get(c, w.spec.length, context, kPageSize, 1));
      CISA_ASSIGN_OR_RETURN(DocumentScores d,
                            score_document(*m, w.ids, w.ex.tail, is_dense ? nullptr : &ref,
                                           is_dense ? &ref : nullptr, {}, plan_.doc_rows));
      if (done_.count({w.ex.id, c.name})) continue;
      Json j = base_line(w, c);
      j["tail"] = w.ex.tail;
      j["nll"] = array_of(d.nll);
      if (!is_dense) {
        j["kl"] = array_of(d.kl);
        j["agree"] = array_of(d.agree);
      }
      j["stats"] = stats_json(d.stats);
      j["seconds"] = d.seconds;
      CISA_RETURN_IF_ERROR(append_line(results_, j));
      double mean_nll = 0, mean_kl = 0;
      for (double x : d.nll) mean_nll += x / static_cast<double>(d.nll.size());
      for (double x : d.kl) mean_kl += x / static_cast<double>(d.kl.size());
      char b[96];
      std::snprintf(b, sizeof b, "nll %.3f kl %.4f (%.1fs)", mean_nll, mean_kl, d.seconds);
      report(w, c, b);
    }
    return Status::Ok();
  }

  // The prompts of one (length, configuration), up to plan.batch of them side by side.
  Status run_generation(std::span<const Work* const> todo, const EvalConfig& c, int64_t context) {
    const int sequences =
        static_cast<int>(std::min<int64_t>(plan_.batch, static_cast<int64_t>(todo.size())));
    CISA_ASSIGN_OR_RETURN(Model * m,
                          cache_.get(c, todo[0]->spec.length, context, kPageSize, sequences));
    std::vector<GreedyPrompt> prompts;
    for (const Work* w : todo)
      prompts.push_back({.prompt = w->ids, .max_new = w->ex.max_new_tokens});
    if (sequences == 1) m->reset_stats();
    CISA_RETURN_IF_ERROR(
        generate_greedy_batch(*m, prompts, [&](size_t i, const Generation& g) -> Status {
          const Work& w = *todo[i];
          Generation gen = g;
          // One at a time the model's counters are this prompt's alone (attention seconds too).
          if (sequences == 1) {
            gen.stats = m->stats();
            m->reset_stats();
          }
          const double score = score_prediction(w.ex, gen.text);
          Json j = base_line(w, c);
          j["depth"] = w.ex.depth;
          j["score"] = score;
          j["prediction"] = gen.text;
          j["answers"] = array_of(w.ex.answers);
          j["generated_tokens"] = gen.tokens;
          j["stats"] = stats_json(gen.stats);
          j["seconds"] = gen.seconds;
          if (sequences > 1) j["batch"] = sequences;
          CISA_RETURN_IF_ERROR(append_line(results_, j));
          char b[96];
          std::snprintf(b, sizeof b, "score %.2f gen %lld (%.1fs)", score,
                        static_cast<long long>(gen.tokens), gen.seconds);
          report(w, c, b);
          return Status::Ok();
        }));
    // A batch-sized KV cache is not kept for the next configuration (GPU memory).
    if (sequences > 1) cache_.drop(c, sequences);
    return Status::Ok();
  }

 private:
  void report(const Work& w, const EvalConfig& c, const std::string& what) {
    done_cost_ += static_cast<int64_t>(w.ids.size());
    const double el = std::chrono::duration<double>(Clock::now() - t_start_).count();
    const double eta = done_cost_ > 0 ? el * static_cast<double>(total_cost_ - done_cost_) /
                                            static_cast<double>(done_cost_)
                                      : 0;
    std::fprintf(stderr, "[%5.1f%%] %-28s %-22s %s  elapsed %s  ETA %s\n",
                 100.0 * static_cast<double>(done_cost_) /
                     static_cast<double>(std::max<int64_t>(1, total_cost_)),
                 w.ex.id.c_str(), c.name.c_str(), what.c_str(), fmt_duration(el).c_str(),
                 fmt_duration(eta).c_str());
  }

  Json base_line(const Work& w, const EvalConfig& c) const {
    Json j = Json::object();
    j["id"] = w.ex.id;
    j["task"] = task_name(w.ex.kind);
    j["length"] = w.spec.length;
    j["index"] = w.spec.index;
    j["config"] = c.name;
    j["budget"] = config_budget(c, w.spec.length, kPageSize);
    j["prompt_tokens"] = static_cast<int64_t>(w.ids.size());
    return j;
  }

  const EvalPlan& plan_;
  const std::string results_;
  const DoneSet& done_;
  ModelCache cache_;
  const Clock::time_point t_start_ = Clock::now();
  const int64_t total_cost_;
  int64_t done_cost_ = 0;
};

}  // namespace

Status run_eval(const EvalPlan& plan) {
  CISA_RETURN_IF_ERROR(check_plan(plan));
  std::error_code ec;
  fs::create_directories(plan.run_dir, ec);
  if (ec) return invalid_argument("cannot create '" + plan.run_dir + "': " + ec.message());
  const std::string results = (fs::path(plan.run_dir) / "results.jsonl").string();
  CISA_ASSIGN_OR_RETURN(const DoneSet done, read_done(plan, results));
  if (plan.resume) CISA_RETURN_IF_ERROR(check_resume_matches(plan));
  CISA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(plan.model_path));
  CISA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(file));
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, read_model_hparams(file));
  CISA_ASSIGN_OR_RETURN(Corpus corpus, load_corpus(plan.texts_dir));
  CISA_RETURN_IF_ERROR(write_run_description(plan, hp));

  // Every example first: the totals make the ETA honest from the first example on.
  CISA_ASSIGN_OR_RETURN(std::vector<Work> work,
                        make_work(pending_specs(plan, hp, done), corpus, tok, plan.threads));
  int64_t total_cost = 0;
  for (const Work& w : work)
    for (const auto& c : plan.configs)
      if (!done.count({w.ex.id, c.name})) total_cost += static_cast<int64_t>(w.ids.size());
  std::fprintf(
      stderr,
      "cisa eval: %zu examples to run (%zu (id, config) pairs already done), %lld prompt tokens\n",
      work.size(), done.size(), static_cast<long long>(total_cost));

  Runner runner(plan, results, done, total_cost);
  // Length by length (work is in length order): the generation tasks one configuration at a
  // time, then the documents.
  for (size_t i = 0, j = 0; i < work.size(); i = j) {
    const int64_t length = work[i].spec.length;
    int64_t context = 0;
    for (j = i; j < work.size() && work[j].spec.length == length; ++j) {
      // Room for the longest prompt of the length plus any task's generation limit.
      const int64_t n = static_cast<int64_t>(work[j].ids.size());
      context = std::max(
          context,
          ((std::max(length, n) + kEvalGenerationRoom + kPageSize - 1) / kPageSize) * kPageSize);
    }
    for (const auto& c : plan.configs) {
      std::vector<const Work*> todo;
      for (size_t k = i; k < j; ++k)
        if (work[k].ex.kind != TaskKind::kDocument && !done.count({work[k].ex.id, c.name}))
          todo.push_back(&work[k]);
      if (!todo.empty()) CISA_RETURN_IF_ERROR(runner.run_generation(todo, c, context));
    }
    for (size_t k = i; k < j; ++k)
      if (work[k].ex.kind == TaskKind::kDocument)
        CISA_RETURN_IF_ERROR(runner.run_document(work[k], context));
  }
  return Status::Ok();
}

}  // namespace cisa::eval
