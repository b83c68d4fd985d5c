// cisa/model/eval.h — quality evaluation of CISA against dense attention (issue 5): RULER-style
// synthetic tasks written for base models, their scorers, long-document likelihood, the
// configurations compared, and the statistics of the report.
//
// A task generator turns (task, target length, example index, seed) into a completion prompt
// whose answer can be copied from the context; lengths are measured with a TokenCounter (the
// model's tokenizer in `cisa eval`, any counter in tests). Everything is deterministic in the seed.
//
//   cisa::eval::Corpus corpus = *cisa::eval::load_corpus(".cache/eval_texts");
//   cisa::eval::TokenCounter count = [&](std::string_view s) {
//     return static_cast<int64_t>(tok.encode(s, true).size()); };
//   cisa::eval::TaskSpec spec{.kind = cisa::eval::TaskKind::kNiahSingle, .length = 8192,
//                             .index = 3, .num_examples = 10, .seed = 1};
//   cisa::eval::Example ex = *cisa::eval::generate_example(spec, corpus, count);
//   // … greedy-generate from ex.prompt, then:
//   double score = cisa::eval::score_prediction(ex, generated_text);   // ∈ [0, 1]
//
// Scoring follows RULER: the prediction is cleaned (control characters become newlines, ends
// trimmed) and every reference is searched case-insensitively as a substring. `all` scores the
// fraction of references found (needle, variable tracking, word extraction); `part` scores 1 when
// any is found.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/status.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/model.h"

namespace cisa::eval {

// ---- texts ------------------------------------------------------------------------------------

// Counts the tokens of a text as the model would see it as a prompt.
using TokenCounter = std::function<int64_t(std::string_view)>;

// Haystack sentences and long documents, from the files scripts/eval_texts.py writes.
struct Corpus {
  std::vector<std::string> sentences;  // every book cut into sentences, whitespace collapsed
  std::vector<std::string> documents;  // whole books, as written
  std::vector<std::string> names;      // one per document (file stem)
  std::vector<std::string> words;      // distinct lowercase words of ≥ 4 letters, sorted
};

// Reads every *.txt of `dir` (sorted by name). kNotFound naming scripts/eval_texts.py when the
// directory has no text.
Result<Corpus> load_corpus(const std::string& dir);
// Builds a corpus from texts in memory (tests).
Corpus make_corpus(const std::vector<std::string>& names, const std::vector<std::string>& texts);
// Cuts text into sentences at '.', '!' or '?' followed by whitespace; whitespace runs collapse
// to one space; pieces without a letter are dropped.
std::vector<std::string> split_sentences(std::string_view text);

// The repeated-sentence noise haystack (our own filler, in the spirit of RULER's).
extern const char* const kFillerSentence;

// ---- tasks ------------------------------------------------------------------------------------

enum class TaskKind {
  kNiahSingle,        // one needle in book text
  kPasskey,           // one needle in repeated filler
  kNiahMultiKey,      // one queried needle among 3 distractor needles with other keys
  kNiahMultiValue,    // 4 values under the same key; all must be recalled
  kNiahMultiQuery,    // 4 needles, all 4 keys asked at once
  kVariableTracking,  // a chain of 4 hops in filler; all names bound to the value
  kCommonWords,       // the 10 words repeated 30 times in a numbered list of rarer words
  kFrequentWords,     // the 3 most frequent coded words of a Zipf(2) text
  kDocument,          // long-document likelihood (no generation)
  // (Later kinds follow kDocument so the seeds of the kinds above never change.)
  kNiahSingleUuid,    // niah_single_3: one needle in book text, its value a UUID
  kNiahMultiKeyHay,   // niah_multikey_2: the haystack is all needles (other keys), numbers
  kNiahMultiKeyUuid,  // niah_multikey_3: a haystack of needles, UUID keys and values
};
const char* task_name(TaskKind k);
Result<TaskKind> parse_task(std::string_view name);
std::vector<TaskKind> all_generation_tasks();

enum class MatchKind { kAll, kPart };

struct TaskSpec {
  TaskKind kind = TaskKind::kNiahSingle;
  int64_t length = 4096;     // target prompt tokens (the prompt never exceeds it)
  int64_t index = 0;         // example index in [0, num_examples)
  int64_t num_examples = 1;  // depths are spread evenly over the examples
  uint64_t seed = 1;
};

struct Example {
  TaskKind kind = TaskKind::kNiahSingle;
  std::string id;                    // "niah_single/4096/3": unique within a run
  std::string prompt;                // completion prompt, ends with the answer prefix
  std::vector<std::string> answers;  // references
  MatchKind match = MatchKind::kAll;
  int64_t prompt_tokens = 0;  // measured by the TokenCounter
  double depth = -1;  // needle depth in [0, 1] (fraction of the haystack before it); −1: none
  int64_t needle_offset = -1;  // byte offset of the (first queried) needle in the prompt
  int max_new_tokens = 32;     // generation limit
  // kDocument: the text (prompt) is scored token by token over its last `tail` tokens.
  int64_t tail = 0;
};

// Builds one example. kInvalidArgument when the length cannot hold the task (shorter than its
// fixed text) or the corpus lacks what the task needs.
Result<Example> generate_example(const TaskSpec& spec, const Corpus& corpus,
                                 const TokenCounter& count);

// Depth of example i of n: spread evenly over [0, 1] (i/(n−1)); 0.5 when n = 1.
double example_depth(int64_t index, int64_t num_examples);

// ---- scoring ----------------------------------------------------------------------------------

// Control characters become '\n'; leading and trailing whitespace is removed.
std::string clean_prediction(std::string_view text);
// Case-insensitive substring search of every reference in the cleaned prediction.
double string_match_all(std::string_view prediction, const std::vector<std::string>& refs);
double string_match_part(std::string_view prediction, const std::vector<std::string>& refs);
double score_prediction(const Example& ex, std::string_view prediction);

// ---- statistics -------------------------------------------------------------------------------

struct Interval {
  double mean = 0, lo = 0, hi = 0;
};
// Percentile interval of the statistic "mean over groups of the group's mean" under resampling
// each group's values with replacement (the task bootstrap: groups are tasks, values are
// examples). `iters` resamples from a generator seeded with `seed`; the percentile at q is the
// value at index floor(q·(iters−1)) of the sorted statistics. Empty groups are skipped.
Interval bootstrap_interval(const std::vector<std::vector<double>>& groups, int iters,
                            uint64_t seed, double level = 0.95);

// ---- configurations ---------------------------------------------------------------------------

enum class ConfigKind { kDense, kCisa, kQuest, kRecency, kOracle, kMoment };

// One attention configuration of a run. Budget: a fixed chunk count k, or a nominal remote
// compression x (k = ceil(E / x), E the eligible chunks at the end of the prompt).
struct EvalConfig {
  std::string
      name;  // as given: "dense", "cisa:x8:g4", "quest:x8", "recency:x8", "cisa:k64:g4:last"
  ConfigKind kind = ConfigKind::kDense;
  int64_t budget = 0;      // k when > 0
  double compression = 0;  // x when > 0
  int64_t group = 4;       // G
  int64_t window = 128;    // W pages
  int64_t sinks = 0;
  int64_t dense_layers = 0;       // the first N layers stay dense (AttentionOptions::dense_layers)
  int64_t dense_last_layers = 0;  // eN: the last N layers stay dense
  std::vector<int> dense_layer_set;  // dlLIST: these layers stay dense
  // lb / lbLABEL: per-layer budgets (AttentionOptions::layer_budget_weights) from `cisa eval
  // --layer-budgets [LABEL=]FILE`, which fills `layer_budget_weights` after parsing.
  bool layer_budgets = false;
  std::string layer_budgets_label;
  std::vector<double> layer_budget_weights;
  QShareQuery query = QShareQuery::kMean;
  // cal / calLABEL: index projections from the indexer file `cisa eval --indexer [LABEL=]FILE`
  // names (EvalPlan::index).
  bool calibrated = false;
  std::string indexer_label;
  int64_t reuse_steps = 1;  // rN: decode steps one selection serves (SelectionParams::reuse_steps)
  // mN: reuse check "mass" with SelectionParams::reuse_mass_slack = N / 1000; −1: the default
  // check (new-chunks).
  int64_t reuse_mass_milli = -1;
  // fp8 | int8: 8-bit representatives (KvCacheConfig::rep_precision; cisa and quest only).
  RepPrecision rep_precision = RepPrecision::kNative;
};
// "dense" | KIND[:OPT]… with KIND cisa|quest|recency|oracle and OPT kN (budget), xR (nominal
// compression), gN (G), wN (window pages), sN (sink pages), dN (first N layers dense), eN (last N
// layers dense), dlLIST (the listed layers dense; LIST = items joined by '+', each a layer or an
// inclusive range a-b: dl0-2+29), lb or lbLABEL (per-layer budgets from --layer-budgets
// [LABEL=]FILE, LABEL letters, digits, '_' or '-'; not with recency),
// mean|last, cal or calLABEL (the calibrated index projections of `cisa eval --indexer
// [LABEL=]FILE`; otherwise each group's mean).
Result<EvalConfig> parse_config(std::string_view text);
// A layer-budget sidecar (docs/calibration.md): lines "LAYER WEIGHT", '#' comments and blank lines
// ignored, layers 0 … n−1 each exactly once, weights finite and >= 0. Errors name the file and
// line.
Result<std::vector<double>> read_layer_budget_weights(const std::string& path);
// The chunk budget for a prompt of `tokens` tokens and page size B.
int64_t config_budget(const EvalConfig& c, int64_t tokens, int page_size);
// Model attention options for the config at that prompt length: dense; cisa/quest (rep kind set
// in `rep`); recency = budget 0 with the window widened by k pages (same pages read as CISA);
// oracle = CISA's budget, G, window and sinks with oracle_page_selector() choosing the k chunks.
Result<AttentionOptions> config_attention(const EvalConfig& c, int64_t tokens, int page_size,
                                          RepKind* rep);

// Tokens kept free after every prompt for its continuation (each task's max_new_tokens fits).
inline constexpr int64_t kEvalGenerationRoom = 128;
// The prompt length a run uses for a requested length on a model trained for n_ctx tokens
// (n_ctx ≤ 0: unknown, no limit): the request when it leaves kEvalGenerationRoom free, else
// n_ctx − kEvalGenerationRoom (so 32768 on a 32K model gives prompts of 32640 tokens, reported
// under that length); 0 when the request exceeds n_ctx (the length is skipped).
int64_t eval_prompt_length(int64_t requested, int64_t n_ctx);

// ---- running on a model -----------------------------------------------------------------------

// A greedy continuation of one prompt.
struct Generation {
  std::string text;
  int64_t tokens = 0;  // generated tokens, the stop token excluded
  ForwardStats stats;  // of the whole example (prefill and decode)
  double seconds = 0;
};

// Greedy continuations of many prompts on one model (cisa::Generator: up to
// ModelOptions::max_sequences run side by side, the rest wait; max_sequences = 1 runs them one at
// a time). Each stops at an end-of-generation token, at a line break after some non-space text,
// or after max_new tokens. `done(i, g)` is called as prompt i finishes; an error it returns ends
// the batch with that error. Each Generation's stats hold that prompt's own pages
// (Model::sequence_traffic) and tokens; its seconds are those of the forward calls that ran it,
// shared with the prompts batched beside it.
struct GreedyPrompt {
  std::span<const int32_t> prompt;
  int max_new = 16;
};
using GreedyDoneFn = std::function<Status(size_t index, const Generation& g)>;
Status generate_greedy_batch(Model& model, std::span<const GreedyPrompt> prompts,
                             const GreedyDoneFn& done, const ProgressFn& progress = {});

// Next-token log-likelihood over the last `tail` tokens of a document: rows [n − tail, n − 1)
// predict tokens n − tail + 1 … n − 1 (tail − 1 scored positions). With `reference` (the dense
// run's log-probabilities of the same rows, [tail − 1][n_vocab]) also KL(reference ‖ this) and
// top-1 agreement per position; `keep` receives this run's log-probabilities.
struct DocumentScores {
  std::vector<double> nll;  // [tail − 1] nats
  std::vector<double> kl;   // [tail − 1] nats (empty without a reference)
  std::vector<int> agree;   // [tail − 1] 1 when both argmaxes agree
  ForwardStats stats;
  double seconds = 0;
};
// `rows`: tail rows per forward call (64; 1 feeds the tail as decode steps, one token each, so
// decode-only behaviour such as selection reuse shows in the scores).
Result<DocumentScores> score_document(Model& model, std::span<const int32_t> ids, int64_t tail,
                                      const std::vector<float>* reference, std::vector<float>* keep,
                                      const ProgressFn& progress = {}, int64_t rows = 64);

// A whole comparison: every (task, length, example) prompt under every configuration, one JSON
// line per (example, configuration) appended to RUN_DIR/results.jsonl as it completes; a rerun
// with resume skips the lines already there. Progress with an ETA goes to stderr.
struct EvalPlan {
  std::string model_path;
  std::string model_name;  // as given on the command line (for the report)
  std::string texts_dir;   // scripts/eval_texts.py output
  std::vector<TaskKind> tasks;
  std::vector<int64_t> lengths;
  std::vector<EvalConfig> configs;  // the first must be dense (the reference)
  int64_t examples = 4;             // per (task, length)
  uint64_t seed = 1;
  std::string run_dir;
  bool resume = false;
  int threads = 0;
  int prefill_block = 512;
  // Prompts of one (length, configuration) generated side by side (ModelOptions::max_sequences);
  // 1 runs them one at a time. Greedy tokens do not depend on it on the CPU; on CUDA a GEMM may
  // pick other tiles for other row counts, so bf16-level differences can change a near tie, unless
  // batch_invariant.
  int batch = 1;
  // ModelOptions::batch_invariant for every model of the run (CUDA only): results that do not
  // depend on `batch` or on which prompts share a step.
  bool batch_invariant = false;
  // Rows of a document's scored tail per forward call (score_document); 1: decode steps.
  int64_t doc_rows = 64;
  KvDtype kv_dtype = KvDtype::kF32;
  // Makes the backend every model of the run runs on (backend.h); empty: the CPU backend.
  BackendFactory backend;
  std::string backend_name = "cpu";  // recorded in the report
  // Index projections of every global layer from indexer files (cisa calibrate) by label ("" for
  // plain `cal`), used by the configurations with the `cal` / `calLABEL` option.
  std::map<std::string, std::vector<IndexProjection>> index;
  std::string indexer_path;  // the --indexer argument, recorded in the report
  std::string command_line;  // recorded in the report
};
Status run_eval(const EvalPlan& plan);

// Reads RUN_DIR/results.jsonl and writes RUN_DIR/summary.md (and returns its text): accuracy by
// configuration and length with 95% task-bootstrap intervals, the paired change against dense,
// per-task tables, generated length against dense, and the long-document likelihood tables.
Result<std::string> write_summary(const std::string& run_dir, int bootstrap_iters = 2000);

// ---- oracle selection -------------------------------------------------------------------------

// The oracle upper bound: page lists with select_pages' query groups, sinks, window and tail, but
// each sparse group's k chunks are the eligible chunks with the largest true dense attention mass
// (summed over the group's positions and the KV group's query heads; ties to the smaller chunk).
// q: [rows][num_q_heads][head_dim], the queries attention uses (after q-norm and RoPE); scale
// multiplies q·k. Costs a dense attention pass (logits only, in double) per sparse group.
Status select_pages_oracle(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                           const float* q, int num_q_heads, float scale, const SelectionParams& p,
                           ThreadPool* pool, PageLists* out);

// select_pages_oracle as the model's page selector (AttentionOptions::selector, model.h): every
// CISA layer then attends to the oracle's pages, with the queries and scale the layer itself uses.
//
//   options.attention.mode = cisa::AttentionMode::kCisa;
//   options.attention.selection = {.budget = 16, .window = 128, .qshare = 4};
//   options.attention.selector = cisa::eval::oracle_page_selector();
PageSelector oracle_page_selector();

}  // namespace cisa::eval
