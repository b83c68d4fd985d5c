// Multi-hop and aggregation generators (variable tracking, common words, frequent words), the
// long-document slices, and the dispatch from a TaskSpec to its generator.
#include <algorithm>
#include <cmath>
#include <map>

#include "eval_internal.h"

namespace cisa::eval {

Result<Example> generate_niah(const TaskSpec& spec, const Corpus& corpus,
                              const TokenCounter& count);

namespace {

using detail::Rng;

struct TaskInfo {
  TaskKind kind;
  const char* name;
};
constexpr TaskInfo kTasks[] = {
    {TaskKind::kNiahSingle, "niah_single"},
    {TaskKind::kPasskey, "passkey"},
    {TaskKind::kNiahMultiKey, "niah_multikey"},
    {TaskKind::kNiahMultiValue, "niah_multivalue"},
    {TaskKind::kNiahMultiQuery, "niah_multiquery"},
    {TaskKind::kNiahSingleUuid, "niah_single_3"},
    {TaskKind::kNiahMultiKeyHay, "niah_multikey_2"},
    {TaskKind::kNiahMultiKeyUuid, "niah_multikey_3"},
    {TaskKind::kVariableTracking, "vt"},
    {TaskKind::kCommonWords, "cwe"},
    {TaskKind::kFrequentWords, "fwe"},
    {TaskKind::kDocument, "doc"},
};

std::string example_id(const TaskSpec& s) {
  return std::string(task_name(s.kind)) + "/" + std::to_string(s.length) + "/" +
         std::to_string(s.index);
}

std::string random_upper(Rng& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>('A' + rng.below(26)));
  return s;
}

// Variable tracking: VAR X1 = v, then VAR X(i+1) = VAR Xi for 4 hops, in filler sentences. The
// statements sit in order at sorted seeded fractions of the haystack, the first at the depth.
Result<Example> generate_vt(const TaskSpec& spec, const TokenCounter& count) {
  Rng rng(detail::example_seed(spec.seed, spec.kind, spec.length, spec.index));
  const std::vector<std::string> filler = split_sentences(kFillerSentence);
  const int kVars = 5;
  const double depth = example_depth(spec.index, spec.num_examples);
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::vector<std::string> names;
    while (static_cast<int>(names.size()) < kVars) {
      std::string v = random_upper(rng, 5);
      if (std::find(names.begin(), names.end(), v) == names.end()) names.push_back(v);
    }
    const std::string value = std::to_string(10000 + rng.below(90000));
    // Fractions: the first at the depth (kept ≤ 0.8 so the chain fits after it), the rest after it.
    std::vector<double> frac(kVars);
    frac[0] = depth * 0.8;
    for (int i = 1; i < kVars; ++i)
      frac[static_cast<size_t>(i)] = frac[0] + rng.uniform01() * (1.0 - frac[0]);
    std::sort(frac.begin() + 1, frac.end());
    std::vector<std::string> stmt(kVars);
    stmt[0] = "VAR " + names[0] + " = " + value + ".";
    for (int i = 1; i < kVars; ++i)
      stmt[static_cast<size_t>(i)] = "VAR " + names[static_cast<size_t>(i)] + " = VAR " +
                                     names[static_cast<size_t>(i - 1)] + ".";
    const std::string header =
        "Memorize and track the chain of variable assignments hidden in the text below.\n\n";
    const std::string question =
        "\n\nQuestion: Which variables are assigned the value " + value +
        ", directly or through the chain?\nAnswer: The variables assigned the value " + value +
        " are:";
    int64_t first_offset = -1;
    auto build = [&](int64_t n) {
      std::string p = header;
      size_t next = 0;
      bool first = true;
      auto put = [&](const std::string& s) {
        if (!first) p += ' ';
        first = false;
        p += s;
      };
      for (int64_t i = 0; i <= n; ++i) {
        while (next < stmt.size() && std::llround(frac[next] * static_cast<double>(n)) == i) {
          if (next == 0) first_offset = static_cast<int64_t>(p.size() + (first ? 0 : 1));
          put(stmt[next++]);
        }
        if (i < n) put(filler[static_cast<size_t>(i) % filler.size()]);
      }
      return p + question;
    };
    CISA_ASSIGN_OR_RETURN(
        int64_t n, detail::fit_count(build, std::max<int64_t>(1, spec.length), spec.length, count));
    Example ex;
    ex.prompt = build(n);
    bool clean =
        detail::count_occurrences(ex.prompt, value) == 3;  // statement 0 and the question twice
    for (int i = 0; i < kVars; ++i)
      clean =
          clean && detail::count_occurrences(ex.prompt, "VAR " + names[static_cast<size_t>(i)]) ==
                       (i + 1 < kVars ? 2 : 1);
    if (!clean) continue;
    ex.kind = spec.kind;
    ex.id = example_id(spec);
    ex.answers = names;
    ex.match = MatchKind::kAll;
    ex.prompt_tokens = count(ex.prompt);
    ex.depth = n > 0 ? static_cast<double>(std::llround(frac[0] * static_cast<double>(n))) /
                           static_cast<double>(n)
                     : 0;
    ex.needle_offset = first_offset;
    ex.max_new_tokens = 40;
    return ex;
  }
  return invalid_argument("could not draw distinct variable names");
}

// Common words: 10 words appear 30 times each, the others 3 times, shuffled into a numbered list.
// The number of rare words is fitted to the length. No chosen word contains another.
Result<Example> generate_cwe(const TaskSpec& spec, const Corpus& corpus,
                             const TokenCounter& count) {
  const int kCommon = 10, kCommonFreq = 30, kRareFreq = 3;
  if (corpus.words.size() < 200)
    return invalid_argument("the corpus has too few distinct words for cwe");
  Rng rng(detail::example_seed(spec.seed, spec.kind, spec.length, spec.index));
  std::vector<std::string> pool = corpus.words;
  rng.shuffle(pool);
  // Greedy pick: skip words that contain or are contained in an already picked word, so a
  // substring match of one answer can never be credited by another word.
  std::vector<std::string> picked;
  const size_t want = std::min<size_t>(pool.size(), static_cast<size_t>(spec.length));
  for (const std::string& w : pool) {
    if (picked.size() >= want) break;
    bool ok = w.size() <= 10;
    for (size_t i = 0; ok && i < picked.size(); ++i)
      ok = picked[i].find(w) == std::string::npos && w.find(picked[i]) == std::string::npos;
    if (ok) picked.push_back(w);
  }
  if (picked.size() < static_cast<size_t>(kCommon) + 1)
    return invalid_argument("too few usable words for cwe");
  const std::vector<std::string> common(picked.begin(), picked.begin() + kCommon);
  const int64_t max_rare = static_cast<int64_t>(picked.size()) - kCommon;
  const uint64_t order_seed = rng.next();
  const std::string header =
      "Below is a numbered list of words. A few of the words appear many more times than the "
      "others.\n";
  const std::string question =
      "\nQuestion: What are the 10 most common words in the list above?\nAnswer: The 10 most "
      "common words in the list are:";
  auto entries = [&](int64_t rare) {
    std::vector<const std::string*> e;
    for (const auto& w : common)
      for (int r = 0; r < kCommonFreq; ++r) e.push_back(&w);
    for (int64_t i = 0; i < rare; ++i)
      for (int r = 0; r < kRareFreq; ++r) e.push_back(&picked[static_cast<size_t>(kCommon + i)]);
    Rng order(order_seed);
    order.shuffle(e);
    return e;
  };
  auto build = [&](int64_t rare) {
    std::string p = header;
    int64_t k = 0;
    for (const std::string* w : entries(rare)) p += std::to_string(++k) + ". " + *w + "\n";
    return p + question;
  };
  CISA_ASSIGN_OR_RETURN(int64_t rare, detail::fit_count(build, max_rare, spec.length, count));
  if (rare < 1)
    return invalid_argument("length " + std::to_string(spec.length) + " is too short for cwe");
  Example ex;
  ex.kind = spec.kind;
  ex.id = example_id(spec);
  ex.prompt = build(rare);
  ex.answers = common;
  ex.match = MatchKind::kAll;
  ex.prompt_tokens = count(ex.prompt);
  ex.max_new_tokens = 96;
  return ex;
}

// Frequent words: coded words (random lowercase strings) with counts floor(C / r²) by rank r
// (Zipf, α = 2); the top count C is fitted to the length; the answer is the top three.
Result<Example> generate_fwe(const TaskSpec& spec, const TokenCounter& count) {
  Rng rng(detail::example_seed(spec.seed, spec.kind, spec.length, spec.index));
  const uint64_t vocab_seed = rng.next(), order_seed = rng.next();
  auto vocab = [&](size_t n) {
    Rng r(vocab_seed);
    std::vector<std::string> v;
    while (v.size() < n) {
      std::string w;
      const int len = 3 + static_cast<int>(r.below(4));
      for (int i = 0; i < len; ++i) w.push_back(static_cast<char>('a' + r.below(26)));
      bool ok = true;  // no word inside another: substring credit stays exact
      for (const auto& x : v)
        ok = ok && x.find(w) == std::string::npos && w.find(x) == std::string::npos;
      if (ok) v.push_back(w);
    }
    return v;
  };
  const std::string header =
      "Read the coded text below and keep track of how often each coded word appears.\n\n";
  const std::string question =
      "\n\nQuestion: What are the three most frequent coded words in the text above?\nAnswer: "
      "The three most frequent coded words are:";
  // Up to 400 ranks (counts below 1 are dropped); generated once, prefixes used per C.
  const std::vector<std::string> words = vocab(400);
  auto build = [&](int64_t c) {
    std::vector<const std::string*> text;
    for (size_t r = 1; r <= words.size(); ++r) {
      const int64_t n = c / static_cast<int64_t>(r * r);
      if (n < 1) break;
      for (int64_t i = 0; i < n; ++i) text.push_back(&words[r - 1]);
    }
    Rng order(order_seed);
    order.shuffle(text);
    std::string p = header;
    for (size_t i = 0; i < text.size(); ++i) {
      if (i) p += ' ';
      p += *text[i];
    }
    return p + question;
  };
  CISA_ASSIGN_OR_RETURN(
      int64_t c, detail::fit_count(build, std::max<int64_t>(9, spec.length), spec.length, count));
  if (c < 9)
    return invalid_argument("length " + std::to_string(spec.length) + " is too short for fwe");
  Example ex;
  ex.kind = spec.kind;
  ex.id = example_id(spec);
  ex.prompt = build(c);
  ex.answers = {words[0], words[1], words[2]};
  ex.match = MatchKind::kAll;
  ex.prompt_tokens = count(ex.prompt);
  ex.max_new_tokens = 32;
  return ex;
}

// A slice of one book, starting at a seeded line, as long as fits in the length; the last quarter
// (at most 256 tokens) is scored.
Result<Example> generate_document(const TaskSpec& spec, const Corpus& corpus,
                                  const TokenCounter& count) {
  if (corpus.documents.empty()) return invalid_argument("the corpus has no documents");
  Rng rng(detail::example_seed(spec.seed, spec.kind, spec.length, spec.index));
  const size_t d = static_cast<size_t>(spec.index) % corpus.documents.size();
  const std::string& doc = corpus.documents[d];
  // Start at a line beginning in the first half, so the slice is long enough for most lengths.
  size_t start = static_cast<size_t>(rng.below(std::max<size_t>(1, doc.size() / 2)));
  start = doc.rfind('\n', start);
  start = start == std::string::npos ? 0 : start + 1;
  const int64_t max_chars = static_cast<int64_t>(doc.size() - start);
  // Grow by 64-byte steps so the interpolating search runs over a small range.
  auto build = [&](int64_t n) {
    return doc.substr(start, static_cast<size_t>(std::min<int64_t>(max_chars, n * 64)));
  };
  CISA_ASSIGN_OR_RETURN(int64_t n,
                        detail::fit_count(build, (max_chars + 63) / 64, spec.length, count));
  Example ex;
  ex.kind = spec.kind;
  ex.id = example_id(spec) + "/" + corpus.names[d];
  ex.prompt = build(n);
  ex.prompt_tokens = count(ex.prompt);
  if (ex.prompt_tokens < spec.length / 2)
    return invalid_argument("document '" + corpus.names[d] + "' is too short for length " +
                            std::to_string(spec.length));
  ex.tail = std::min<int64_t>(256, ex.prompt_tokens / 4);
  ex.max_new_tokens = 0;
  return ex;
}

}  // namespace

const char* task_name(TaskKind k) {
  for (const auto& t : kTasks)
    if (t.kind == k) return t.name;
  return "?";
}

Result<TaskKind> parse_task(std::string_view name) {
  std::string list;
  for (const auto& t : kTasks) {
    if (name == t.name) return t.kind;
    list += std::string(list.empty() ? "" : ", ") + t.name;
  }
  return invalid_argument("unknown task '" + std::string(name) + "' (tasks: " + list + ")");
}

std::vector<TaskKind> all_generation_tasks() {
  std::vector<TaskKind> v;
  for (const auto& t : kTasks)
    if (t.kind != TaskKind::kDocument) v.push_back(t.kind);
  return v;
}

double example_depth(int64_t index, int64_t num_examples) {
  if (num_examples <= 1) return 0.5;
  return static_cast<double>(index) / static_cast<double>(num_examples - 1);
}

Result<Example> generate_example(const TaskSpec& spec, const Corpus& corpus,
                                 const TokenCounter& count) {
  if (spec.length < 64)
    return invalid_argument("length must be at least 64 tokens (got " +
                            std::to_string(spec.length) + ")");
  if (spec.num_examples < 1 || spec.index < 0 || spec.index >= spec.num_examples)
    return invalid_argument("example index " + std::to_string(spec.index) + " outside [0, " +
                            std::to_string(spec.num_examples) + ")");
  switch (spec.kind) {
    case TaskKind::kVariableTracking:
      return generate_vt(spec, count);
    case TaskKind::kCommonWords:
      return generate_cwe(spec, corpus, count);
    case TaskKind::kFrequentWords:
      return generate_fwe(spec, count);
    case TaskKind::kDocument:
      return generate_document(spec, corpus, count);
    default:
      return generate_niah(spec, corpus, count);
  }
}

}  // namespace cisa::eval
