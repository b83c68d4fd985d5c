// Task generators of cisa eval: lengths, needle depths, answers that occur exactly once, the
// variable chain, word counts, determinism by seed. Every check recomputes the property from the
// prompt text itself (independent of the generator's bookkeeping).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "cisa/model/eval.h"

namespace cisa::eval {
namespace {

// Tokens ≈ whitespace-separated pieces: a stand-in tokenizer (monotone in the text, cheap).
int64_t count_pieces(std::string_view s) {
  int64_t n = 0;
  bool in = false;
  for (char c : s) {
    const bool sp = c == ' ' || c == '\n' || c == '\t';
    if (!sp && !in) ++n;
    in = !sp;
  }
  return n;
}

// A corpus of made-up sentences over a syllable vocabulary (thousands of distinct words).
Corpus test_corpus() {
  const char* syl[] = {"ba", "ko", "ri", "mu", "te", "sa", "lo", "ne",
                       "vi", "du", "pe", "go", "fa", "zi", "ho"};
  std::vector<std::string> texts;
  uint32_t x = 12345;
  auto rnd = [&] { return x = x * 1103515245u + 12345u, (x >> 16) & 0x7fff; };
  for (int d = 0; d < 2; ++d) {
    std::string t;
    for (int s = 0; s < 4000; ++s) {
      const int words = 4 + static_cast<int>(rnd() % 12);
      for (int w = 0; w < words; ++w) {
        std::string word;
        const int n = 2 + static_cast<int>(rnd() % 3);
        for (int k = 0; k < n; ++k) word += syl[rnd() % 15];
        if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
        t += word;
        t += (w + 1 == words) ? ". " : " ";
      }
      if (s % 7 == 6) t += "\n\n";
    }
    texts.push_back(t);
  }
  return make_corpus({"alpha", "beta"}, texts);
}

const Corpus& corpus() {
  static const Corpus c = test_corpus();
  return c;
}

TEST(EvalTexts, SplitSentences) {
  auto s = split_sentences("  Hello   there.  How are\nyou? Fine!Not split. 3.14 is pi. ...  \n");
  ASSERT_EQ(s.size(), 4u);  // "..." has no letter and is dropped
  EXPECT_EQ(s[0], "Hello there.");
  EXPECT_EQ(s[1], "How are you?");
  EXPECT_EQ(s[2], "Fine!Not split.");
  EXPECT_EQ(s[3], "3.14 is pi.");  // "3.14" has no whitespace after the dot
}

TEST(EvalTexts, SplitDropsPiecesWithoutLetters) {
  auto s = split_sentences("1. 2. Abc.");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0], "Abc.");
}

TEST(EvalTexts, LoadCorpusMissingDirectoryNamesTheScript) {
  auto r = load_corpus("/nonexistent/eval_texts");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("eval_texts.py"), std::string::npos);
}

class NiahTest : public ::testing::TestWithParam<TaskKind> {};

TEST_P(NiahTest, LengthDepthAndAnswersOnce) {
  const TaskKind kind = GetParam();
  const int64_t n_ex = 5;
  for (int64_t length : {300, 1500}) {
    for (int64_t i = 0; i < n_ex; ++i) {
      TaskSpec spec{.kind = kind, .length = length, .index = i, .num_examples = n_ex, .seed = 7};
      auto r = generate_example(spec, corpus(), count_pieces);
      ASSERT_TRUE(r.ok()) << r.status().message();
      const Example& ex = *r;
      const std::string& p = ex.prompt;
      // Length: never over, and filled to within the largest sentence (≤ 40 pieces here).
      EXPECT_EQ(ex.prompt_tokens, count_pieces(p));
      EXPECT_LE(ex.prompt_tokens, length);
      EXPECT_GE(ex.prompt_tokens, length - 40) << ex.id;
      // Every answer exactly once, and it is a 7-digit number or a UUID (8-4-4-4-12 hex).
      ASSERT_FALSE(ex.answers.empty());
      const bool uuid = kind == TaskKind::kNiahSingleUuid || kind == TaskKind::kNiahMultiKeyUuid;
      for (const auto& a : ex.answers) {
        EXPECT_EQ(a.size(), uuid ? 36u : 7u) << a;
        if (uuid) {
          EXPECT_TRUE(a[8] == '-' && a[13] == '-' && a[18] == '-' && a[23] == '-') << a;
        }
        size_t n = 0;
        for (size_t q = p.find(a); q != std::string::npos; q = p.find(a, q + 1)) ++n;
        EXPECT_EQ(n, 1u) << ex.id << " answer " << a;
      }
      // The queried needle is a sentence holding the first answer, at the recorded offset.
      const size_t at = p.find(ex.answers[0]);
      const size_t sentence = p.rfind(
          kind == TaskKind::kNiahMultiValue ? "One of the special" : "The special magic", at);
      ASSERT_NE(sentence, std::string::npos);
      EXPECT_EQ(static_cast<int64_t>(sentence), ex.needle_offset);
      // Depth: the fraction of haystack text before the needle matches the example's depth.
      const size_t ctx0 = p.find("\n\n") + 2;
      const size_t ctx1 = p.rfind("\n\nQuestion:");
      const double frac = static_cast<double>(sentence - ctx0) / static_cast<double>(ctx1 - ctx0);
      const double want = example_depth(i, n_ex);
      // The needle goes between sentences: the depth is the nearest sentence boundary.
      const double n_sent =
          static_cast<double>(split_sentences(p.substr(ctx0, ctx1 - ctx0)).size());
      EXPECT_NEAR(ex.depth, want, 0.5 / (n_sent - 4) + 1e-12) << ex.id;
      // Needles of other depths and varying sentence lengths shift the text fraction a little.
      EXPECT_NEAR(frac, want,
                  kind == TaskKind::kNiahSingle || kind == TaskKind::kPasskey ? 0.06 : 0.15)
          << ex.id;
      // The prompt ends with the answer prefix that asks for the first key.
      EXPECT_TRUE(p.ends_with(" is") || p.ends_with(" are")) << p.substr(p.size() - 40);
    }
  }
}

TEST_P(NiahTest, DeterministicInSeed) {
  TaskSpec spec{.kind = GetParam(), .length = 800, .index = 2, .num_examples = 4, .seed = 11};
  auto a = generate_example(spec, corpus(), count_pieces);
  auto b = generate_example(spec, corpus(), count_pieces);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->prompt, b->prompt);
  EXPECT_EQ(a->answers, b->answers);
  spec.seed = 12;
  auto c = generate_example(spec, corpus(), count_pieces);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->answers, c->answers);
}

INSTANTIATE_TEST_SUITE_P(AllNiah, NiahTest,
                         ::testing::Values(TaskKind::kNiahSingle, TaskKind::kPasskey,
                                           TaskKind::kNiahMultiKey, TaskKind::kNiahMultiValue,
                                           TaskKind::kNiahMultiQuery, TaskKind::kNiahSingleUuid,
                                           TaskKind::kNiahMultiKeyHay, TaskKind::kNiahMultiKeyUuid),
                         [](const auto& info) { return std::string(task_name(info.param)); });

// A haystack of needles (niah_multikey_2/3): every haystack sentence is a needle, each key occurs
// once in the haystack, and the queried key occurs in its needle and twice in the question.
TEST(EvalTasks, NeedleHaystacksAreAllNeedlesWithDistinctKeys) {
  for (TaskKind k : {TaskKind::kNiahMultiKeyHay, TaskKind::kNiahMultiKeyUuid}) {
    TaskSpec spec{.kind = k, .length = 2000, .index = 1, .num_examples = 3, .seed = 5};
    auto r = generate_example(spec, corpus(), count_pieces);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const std::string& p = r->prompt;
    const size_t ctx0 = p.find("\n\n") + 2, ctx1 = p.rfind("\n\nQuestion:");
    const std::vector<std::string> sents = split_sentences(p.substr(ctx0, ctx1 - ctx0));
    ASSERT_GT(sents.size(), 100u);
    std::set<std::string> keys;
    const std::string lead = "The special magic ";
    for (const std::string& s : sents) {
      ASSERT_EQ(s.rfind(lead, 0), 0u) << s;
      const size_t f = s.find(" for "), is = s.find(" is ");
      ASSERT_TRUE(f != std::string::npos && is != std::string::npos) << s;
      EXPECT_TRUE(keys.insert(s.substr(f + 5, is - f - 5)).second) << "repeated key in " << s;
    }
    const size_t q = p.rfind("for ") + 4;
    const std::string key = p.substr(q, p.size() - q - 3);  // "... for KEY is"
    EXPECT_TRUE(keys.count(key)) << key;
    size_t n = 0;
    for (size_t at = p.find(key); at != std::string::npos; at = p.find(key, at + 1)) ++n;
    EXPECT_EQ(n, 3u) << key;
  }
}

TEST(EvalTasks, MultiKindsAskForTheRightNumberOfValues) {
  auto ask = [](TaskKind k) {
    TaskSpec spec{.kind = k, .length = 600, .index = 0, .num_examples = 1, .seed = 3};
    return generate_example(spec, corpus(), count_pieces)->answers.size();
  };
  EXPECT_EQ(ask(TaskKind::kNiahSingle), 1u);
  EXPECT_EQ(ask(TaskKind::kNiahMultiKey), 1u);
  EXPECT_EQ(ask(TaskKind::kNiahMultiValue), 4u);
  EXPECT_EQ(ask(TaskKind::kNiahMultiQuery), 4u);
  // Multi-key: four needles, three of them distractors with other keys.
  TaskSpec spec{
      .kind = TaskKind::kNiahMultiKey, .length = 600, .index = 0, .num_examples = 1, .seed = 3};
  auto ex = generate_example(spec, corpus(), count_pieces);
  std::regex needle("The special magic number for ([a-z]+-[a-z]+) is ([0-9]{7})\\.");
  std::set<std::string> keys;
  for (std::sregex_iterator it(ex->prompt.begin(), ex->prompt.end(), needle), end; it != end; ++it)
    keys.insert((*it)[1].str());
  EXPECT_EQ(keys.size(), 4u);
}

TEST(EvalTasks, VariableTrackingChainResolvesToTheAnswers) {
  for (int64_t i = 0; i < 4; ++i) {
    TaskSpec spec{.kind = TaskKind::kVariableTracking,
                  .length = 1000,
                  .index = i,
                  .num_examples = 4,
                  .seed = 5};
    auto r = generate_example(spec, corpus(), count_pieces);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const std::string& p = r->prompt;
    EXPECT_LE(r->prompt_tokens, 1000);
    EXPECT_GE(r->prompt_tokens, 960);
    // Resolve the assignments in text order, as a reader would.
    std::regex stmt("VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|([0-9]+))\\.");
    std::map<std::string, std::string> value_of;
    for (std::sregex_iterator it(p.begin(), p.end(), stmt), end; it != end; ++it) {
      const auto& m = *it;
      value_of[m[1].str()] =
          m[4].matched ? m[4].str() : value_of.at(m[3].str());  // defined before use
    }
    ASSERT_EQ(value_of.size(), 5u);
    std::smatch q;
    ASSERT_TRUE(std::regex_search(p, q, std::regex("assigned the value ([0-9]+), directly")));
    std::set<std::string> expect;
    for (const auto& [k, v] : value_of)
      if (v == q[1].str()) expect.insert(k);
    EXPECT_EQ(std::set<std::string>(r->answers.begin(), r->answers.end()), expect);
    EXPECT_NEAR(r->depth, 0.8 * example_depth(i, 4), 0.02);
  }
}

TEST(EvalTasks, CommonWordsCounts) {
  TaskSpec spec{
      .kind = TaskKind::kCommonWords, .length = 1500, .index = 1, .num_examples = 2, .seed = 9};
  auto r = generate_example(spec, corpus(), count_pieces);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LE(r->prompt_tokens, 1500);
  EXPECT_GE(r->prompt_tokens, 1490);
  std::istringstream in(r->prompt);
  std::string line;
  std::map<std::string, int> counts;
  int expect_no = 1;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, std::regex("([0-9]+)\\. ([a-z]+)"))) continue;
    EXPECT_EQ(std::stoi(m[1].str()), expect_no++);
    counts[m[2].str()]++;
  }
  std::set<std::string> common;
  for (const auto& [w, c] : counts) {
    EXPECT_TRUE(c == 30 || c == 3) << w << " " << c;
    if (c == 30) common.insert(w);
  }
  EXPECT_EQ(common.size(), 10u);
  EXPECT_EQ(std::set<std::string>(r->answers.begin(), r->answers.end()), common);
}

TEST(EvalTasks, FrequentWordsTopThree) {
  TaskSpec spec{
      .kind = TaskKind::kFrequentWords, .length = 2000, .index = 0, .num_examples = 1, .seed = 2};
  auto r = generate_example(spec, corpus(), count_pieces);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LE(r->prompt_tokens, 2000);
  const std::string& p = r->prompt;
  const size_t b = p.find("\n\n") + 2, e = p.rfind("\n\nQuestion:");
  std::istringstream in(p.substr(b, e - b));
  std::map<std::string, int> counts;
  for (std::string w; in >> w;) counts[w]++;
  std::vector<std::pair<int, std::string>> byc;
  for (const auto& [w, c] : counts) byc.emplace_back(c, w);
  std::sort(byc.rbegin(), byc.rend());
  ASSERT_GE(byc.size(), 4u);
  EXPECT_GT(byc[0].first, byc[1].first);
  EXPECT_GT(byc[1].first, byc[2].first);
  EXPECT_GT(byc[2].first, byc[3].first);
  EXPECT_EQ(r->answers, (std::vector<std::string>{byc[0].second, byc[1].second, byc[2].second}));
}

TEST(EvalTasks, DocumentIsASliceOfABook) {
  TaskSpec spec{
      .kind = TaskKind::kDocument, .length = 3000, .index = 1, .num_examples = 2, .seed = 4};
  auto r = generate_example(spec, corpus(), count_pieces);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LE(r->prompt_tokens, 3000);
  EXPECT_GE(r->prompt_tokens, 2950);
  EXPECT_NE(corpus().documents[1].find(r->prompt), std::string::npos);
  EXPECT_EQ(r->tail, 256);
}

TEST(EvalTasks, Errors) {
  TaskSpec spec{.kind = TaskKind::kNiahSingle, .length = 20};
  EXPECT_FALSE(generate_example(spec, corpus(), count_pieces).ok());
  spec.length = 1000;
  spec.index = 3;
  spec.num_examples = 3;
  EXPECT_FALSE(generate_example(spec, corpus(), count_pieces).ok());
  spec.index = 0;
  EXPECT_FALSE(generate_example(spec, Corpus{}, count_pieces).ok());
  // A length too short for the fixed text of the task.
  spec.kind = TaskKind::kCommonWords;
  spec.length = 100;
  EXPECT_FALSE(generate_example(spec, corpus(), count_pieces).ok());
  EXPECT_FALSE(parse_task("niah").ok());
  EXPECT_EQ(*parse_task("vt"), TaskKind::kVariableTracking);
  for (TaskKind k : all_generation_tasks()) EXPECT_EQ(*parse_task(task_name(k)), k);
}

}  // namespace
}  // namespace cisa::eval
