// Haystack texts: reading the books scripts/eval_texts.py extracts, cutting them into sentences,
// the filler sentence, the key word lists, and the length search every generator uses.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "eval_internal.h"

namespace cisa::eval {

const char* const kFillerSentence =
    "The river runs past the old mill. The bread is warm on the table. A bell rings in the tower. "
    "We walk home along the hill. Then the day is done.";

std::vector<std::string> split_sentences(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  bool has_letter = false;
  auto flush = [&] {
    while (!cur.empty() && cur.back() == ' ') cur.pop_back();
    if (has_letter && !cur.empty()) out.push_back(cur);
    cur.clear();
    has_letter = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (std::isspace(c)) {
      if (!cur.empty() && cur.back() != ' ') cur.push_back(' ');
      continue;
    }
    cur.push_back(static_cast<char>(c));
    if (std::isalpha(c)) has_letter = true;
    const bool end = c == '.' || c == '!' || c == '?';
    if (end && (i + 1 == text.size() || std::isspace(static_cast<unsigned char>(text[i + 1]))))
      flush();
  }
  flush();
  return out;
}

Corpus make_corpus(const std::vector<std::string>& names, const std::vector<std::string>& texts) {
  Corpus c;
  std::set<std::string> words;
  for (size_t i = 0; i < texts.size(); ++i) {
    for (auto& s : split_sentences(texts[i])) c.sentences.push_back(std::move(s));
    c.documents.push_back(texts[i]);
    c.names.push_back(i < names.size() ? names[i] : "doc" + std::to_string(i));
    std::string w;
    auto take = [&] {
      if (w.size() >= 4) words.insert(w);
      w.clear();
    };
    for (char ch : texts[i]) {
      const unsigned char u = static_cast<unsigned char>(ch);
      if (std::isalpha(u) && u < 128)
        w.push_back(static_cast<char>(std::tolower(u)));
      else
        take();
    }
    take();
  }
  c.words.assign(words.begin(), words.end());
  return c;
}

Result<Corpus> load_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return not_found("eval texts directory '" + dir +
                     "' does not exist; run `python3 scripts/eval_texts.py " + dir +
                     "` (needs the Debian packages bible-kjv and r-cran-janeaustenr)");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  if (ec) return not_found("cannot list '" + dir + "': " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<std::string> names, texts;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in.good() && !in.eof()) return data_loss("cannot read '" + p.string() + "'");
    if (ss.str().empty()) continue;
    names.push_back(p.stem().string());
    texts.push_back(ss.str());
  }
  if (texts.empty())
    return not_found("no .txt files in '" + dir + "'; run `python3 scripts/eval_texts.py " + dir +
                     "`");
  return make_corpus(names, texts);
}

namespace detail {

uint64_t example_seed(uint64_t seed, TaskKind kind, int64_t length, int64_t index) {
  Rng r(seed ^ (0x5bd1e995ull * (static_cast<uint64_t>(kind) + 1)));
  uint64_t h = r.next() ^ static_cast<uint64_t>(length) * 0x9E3779B97F4A7C15ull;
  Rng r2(h ^ static_cast<uint64_t>(index) * 0xC2B2AE3D27D4EB4Full);
  return r2.next();
}

Result<int64_t> fit_count(const std::function<std::string(int64_t)>& build, int64_t n_max,
                          int64_t target, const TokenCounter& count) {
  const int64_t c0 = count(build(0));
  if (c0 > target)
    return invalid_argument("length " + std::to_string(target) +
                            " cannot hold the task's fixed text (" + std::to_string(c0) +
                            " tokens)");
  int64_t lo = 0, c_lo = c0;  // largest known fitting n
  int64_t hi = -1, c_hi = 0;  // smallest known failing n (−1: none yet)
  // Grow from a small probe by extrapolating tokens per unit until some n fails (or n_max fits).
  int64_t n = std::min<int64_t>(n_max, 16);
  while (hi < 0) {
    if (n <= lo) break;
    const int64_t c = count(build(n));
    if (c <= target) {
      lo = n, c_lo = c;
      if (n == n_max) return n_max;
      const double per = static_cast<double>(std::max<int64_t>(1, c - c0)) / static_cast<double>(n);
      const int64_t guess = static_cast<int64_t>(static_cast<double>(target - c0) / per * 1.05) + 1;
      n = std::min(n_max, std::max(n + 1, guess));
    } else {
      hi = n, c_hi = c;
    }
  }
  if (hi < 0) return lo;
  while (hi - lo > 1) {
    // Secant step on the nearly linear count, kept strictly inside (lo, hi); bisection when the
    // step lands on an end or the bracket is small.
    const double frac =
        static_cast<double>(target - c_lo) / static_cast<double>(std::max<int64_t>(1, c_hi - c_lo));
    int64_t m = lo + static_cast<int64_t>(frac * static_cast<double>(hi - lo));
    if (m <= lo || m >= hi || hi - lo <= 8) m = lo + (hi - lo) / 2;
    const int64_t c = count(build(m));
    if (c <= target)
      lo = m, c_lo = c;
    else
      hi = m, c_hi = c;
  }
  return lo;
}

int64_t count_occurrences(std::string_view text, std::string_view needle) {
  if (needle.empty()) return 0;
  int64_t n = 0;
  for (size_t p = text.find(needle); p != std::string_view::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

std::string to_lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

const std::vector<std::string> kKeyAdjectives = {
    "amber",  "brisk",  "copper",  "dusty",  "eager", "frosty",  "gentle", "hollow", "icy",
    "jolly",  "lanky",  "mellow",  "nimble", "olive", "plucky",  "quiet",  "rusty",  "silver",
    "tawny",  "velvet", "wistful", "zesty",  "bold",  "crimson", "dapper", "fickle", "gusty",
    "hasty",  "ivory",  "jagged",  "knotty", "lofty", "murky",   "noble",  "opal",   "pebbly",
    "quaint", "rowdy",  "sandy",   "tidy",   "umber", "vivid",   "windy",  "yellow", "azure",
    "bumpy",  "chilly", "dreamy",  "fuzzy",  "glossy"};
const std::vector<std::string> kKeyNouns = {
    "lantern",  "badger",  "compass", "dolphin", "harbor",   "falcon", "garnet",  "hammock",
    "island",   "juniper", "kettle",  "lobster", "meadow",   "nutmeg", "orchard", "pelican",
    "quill",    "raven",   "saddle",  "thimble", "umbrella", "violin", "walrus",  "yarrow",
    "zeppelin", "anchor",  "biscuit", "canyon",  "donkey",   "ember",  "fiddle",  "glacier",
    "heron",    "igloo",   "jasmine", "kayak",   "locket",   "marble", "nectar",  "otter",
    "pepper",   "quarry",  "ribbon",  "spindle", "turnip",   "valley", "wagon",   "bramble",
    "cobbler",  "drizzle"};

}  // namespace detail
}  // namespace cisa::eval
