// Needle-in-a-haystack generators: single (book text or filler), multi-key, multi-value and
// multi-query, and RULER's other variants: a UUID value (niah_single_3) and a haystack made of
// needles with other keys (niah_multikey_2 with numbers, niah_multikey_3 with UUID keys and
// values). Needles are sentences inserted between haystack sentences; the queried needle sits at
// the example's depth (a fraction of the haystack sentences before it), the others at depths drawn
// from the seed. Keys are "adjective-noun" pairs (three words in a haystack of needles, for enough
// distinct keys), values 7-digit numbers or UUIDs; a draw whose key or value also occurs elsewhere
// in the prompt is redrawn, so every answer appears exactly once.
#include <algorithm>
#include <cmath>
#include <set>

#include "eval_internal.h"

namespace cisa::eval {
namespace {

using detail::Rng;

struct Needle {
  std::string key, value;
  double frac = 0;  // depth as a fraction of the haystack sentences before it
};

struct NiahShape {
  int needles = 1;          // needles placed
  int queried = 1;          // first `queried` needles are asked for (multi-query: all)
  bool shared_key = false;  // multi-value: every needle under the key of needle 0
  bool noise = false;       // filler haystack instead of book sentences
  bool needle_hay = false;  // the haystack is needles with other keys and values
  bool uuid_key = false, uuid_value = false;
};

NiahShape shape_of(TaskKind k) {
  switch (k) {
    case TaskKind::kPasskey:
      return {1, 1, false, true};
    case TaskKind::kNiahMultiKey:
      return {4, 1, false, false};
    case TaskKind::kNiahMultiValue:
      return {4, 4, true, false};
    case TaskKind::kNiahMultiQuery:
      return {4, 4, false, false};
    case TaskKind::kNiahSingleUuid:
      return {.uuid_value = true};
    case TaskKind::kNiahMultiKeyHay:
      return {.needle_hay = true};
    case TaskKind::kNiahMultiKeyUuid:
      return {.needle_hay = true, .uuid_key = true, .uuid_value = true};
    default:
      return {1, 1, false, false};
  }
}

std::string join_keys(const std::vector<Needle>& n, int count) {
  std::string s;
  for (int i = 0; i < count; ++i) {
    if (i > 0) s += (i + 1 == count) ? " and " : ", ";
    s += n[static_cast<size_t>(i)].key;
  }
  return s;
}

// 8-4-4-4-12 lowercase hex digits.
std::string uuid(Rng& rng) {
  static const char* hex = "0123456789abcdef";
  std::string u;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) u.push_back('-');
    u.push_back(hex[rng.below(16)]);
  }
  return u;
}

std::string word_key(Rng& rng, bool three) {
  std::string k = detail::kKeyAdjectives[rng.below(detail::kKeyAdjectives.size())] + "-" +
                  detail::kKeyNouns[rng.below(detail::kKeyNouns.size())];
  if (three) k += "-" + detail::kKeyNouns[rng.below(detail::kKeyNouns.size())];
  return k;
}

}  // namespace

Result<Example> generate_niah(const TaskSpec& spec, const Corpus& corpus,
                              const TokenCounter& count) {
  const NiahShape sh = shape_of(spec.kind);
  std::vector<std::string> filler;
  if (sh.noise)
    filler = split_sentences(kFillerSentence);
  else if (!sh.needle_hay && corpus.sentences.size() < 64)
    return invalid_argument("the corpus has too few sentences for a haystack");
  const std::vector<std::string>& src = sh.noise || sh.needle_hay ? filler : corpus.sentences;

  Rng rng(detail::example_seed(spec.seed, spec.kind, spec.length, spec.index));
  const std::string what = sh.uuid_value ? "uuid" : "number";
  auto draw_key = [&] { return sh.uuid_key ? uuid(rng) : word_key(rng, sh.needle_hay); };
  auto draw_value = [&] {
    return sh.uuid_value ? uuid(rng) : std::to_string(1000000 + rng.below(9000000));
  };
  const double depth = example_depth(spec.index, spec.num_examples);
  const size_t start = sh.noise || sh.needle_hay ? 0 : static_cast<size_t>(rng.below(src.size()));

  for (int attempt = 0; attempt < 20; ++attempt) {
    // Draw keys and values.
    std::vector<Needle> nd(static_cast<size_t>(sh.needles));
    std::vector<std::string> used_keys, used_values;
    for (size_t i = 0; i < nd.size(); ++i) {
      std::string key;
      do key = draw_key();
      while (std::find(used_keys.begin(), used_keys.end(), key) != used_keys.end());
      std::string value;
      do value = draw_value();
      while (std::find(used_values.begin(), used_values.end(), value) != used_values.end());
      used_keys.push_back(key);
      used_values.push_back(value);
      nd[i].key = sh.shared_key && i > 0 ? nd[0].key : key;
      nd[i].value = value;
      nd[i].frac = i == 0 ? depth : rng.uniform01();
    }

    // A haystack of needles: distinct keys and values, none containing a placed one (or inside
    // it), as many as the longest prompt could hold (each needle is well over one token per 8).
    if (sh.needle_hay) {
      filler.clear();
      const size_t n_hay = static_cast<size_t>(spec.length / 8 + 8);
      std::set<std::string> seen(used_keys.begin(), used_keys.end());
      seen.insert(used_values.begin(), used_values.end());
      auto clashes = [&](const std::string& s) {
        if (seen.count(s)) return true;
        for (const Needle& n : nd)
          if (s.find(n.key) != std::string::npos || n.key.find(s) != std::string::npos ||
              s.find(n.value) != std::string::npos || n.value.find(s) != std::string::npos)
            return true;
        return false;
      };
      for (int guard = 0; filler.size() < n_hay && guard < 1000000; ++guard) {
        const std::string k = draw_key(), v = draw_value();
        if (k == v || clashes(k) || clashes(v)) continue;
        seen.insert(k);
        seen.insert(v);
        filler.push_back("The special magic " + what + " for " + k + " is " + v + ".");
      }
    }
    const bool multi_value = sh.shared_key;
    const std::string header = [&]() -> std::string {
      if (sh.needle_hay)
        return "Many special magic " + what +
               "s are listed in the text below. Remember them: you will be asked for one of them "
               "after the text.\n\n";
      if (sh.needles == 1 && !multi_value)
        return "A special magic " + what +
               " is hidden in the text below. Remember it: you will be asked for it after the "
               "text.\n\n";
      return "Some special magic numbers are hidden in the text below. Remember them: you will be "
             "asked for them after the text.\n\n";
    }();
    std::string question;
    if (multi_value) {
      question = "\n\nQuestion: What are all the special magic numbers for " + nd[0].key +
                 "?\nAnswer: The special magic numbers for " + nd[0].key + " are";
    } else if (sh.queried > 1) {
      const std::string keys = join_keys(nd, sh.queried);
      question = "\n\nQuestion: What are the special magic numbers for " + keys +
                 "?\nAnswer: The special magic numbers for " + keys + " are";
    } else {
      question = "\n\nQuestion: What is the special magic " + what + " for " + nd[0].key +
                 "?\nAnswer: The special magic " + what + " for " + nd[0].key + " is";
    }
    auto needle_text = [&](const Needle& n) {
      return (multi_value ? "One of the special magic numbers for "
                          : "The special magic " + what + " for ") +
             n.key + " is " + n.value + ".";
    };

    int64_t needle_offset = -1;
    // The prompt with n haystack sentences; needle i goes before sentence round(frac_i · n).
    auto build = [&](int64_t n) {
      std::vector<std::pair<int64_t, size_t>> at;  // (sentence index, needle)
      for (size_t i = 0; i < nd.size(); ++i)
        at.emplace_back(std::llround(nd[i].frac * static_cast<double>(n)), i);
      std::sort(at.begin(), at.end());
      std::string p = header;
      size_t next = 0;
      bool first = true;
      auto put = [&](const std::string& s) {
        if (!first) p += ' ';
        first = false;
        p += s;
      };
      for (int64_t i = 0; i <= n; ++i) {
        while (next < at.size() && at[next].first == i) {
          if (at[next].second == 0)
            needle_offset = static_cast<int64_t>(p.size() + (first ? 0 : 1));
          put(needle_text(nd[at[next].second]));
          ++next;
        }
        if (i < n) put(src[(start + static_cast<size_t>(i)) % src.size()]);
      }
      return p + question;
    };
    const int64_t n_max =
        std::max<int64_t>(1, spec.length);  // every sentence is at least one token
    CISA_ASSIGN_OR_RETURN(int64_t n, detail::fit_count(build, n_max, spec.length, count));
    Example ex;
    ex.prompt = build(n);
    // Every value exactly once; every key only in its needles and the question.
    bool clean = true;
    for (size_t i = 0; i < nd.size(); ++i) {
      if (detail::count_occurrences(ex.prompt, nd[i].value) != 1) clean = false;
      const int64_t needles_with_key = multi_value ? sh.needles : 1;
      const int64_t in_question =
          (static_cast<int>(i) < sh.queried || (multi_value && i == 0)) ? 2 : 0;
      const int64_t expect = multi_value ? needles_with_key + 2 : 1 + in_question;
      if (detail::count_occurrences(ex.prompt, nd[i].key) != expect) clean = false;
    }
    if (!clean) continue;
    ex.kind = spec.kind;
    ex.id = std::string(task_name(spec.kind)) + "/" + std::to_string(spec.length) + "/" +
            std::to_string(spec.index);
    for (int i = 0; i < sh.queried; ++i) ex.answers.push_back(nd[static_cast<size_t>(i)].value);
    ex.match = MatchKind::kAll;
    ex.prompt_tokens = count(ex.prompt);
    ex.depth = n > 0 ? static_cast<double>(std::llround(depth * static_cast<double>(n))) /
                           static_cast<double>(n)
                     : 0;
    ex.needle_offset = needle_offset;
    ex.max_new_tokens = sh.queried > 1 ? 64 : sh.uuid_value ? 40 : 16;
    return ex;
  }
  return invalid_argument(
      "could not draw needles that occur exactly once in the haystack (example " +
      std::to_string(spec.index) + ")");
}

}  // namespace cisa::eval
