// `cisa eval` with batched generation (EvalPlan::batch) against the same run one prompt at a time,
// on SmolLM2 (skips when models/ lacks it): every (example, configuration) line has the same
// prediction, score and generated length, and the pages it read, counted per sequence in the
// batch (Model::sequence_traffic), equal the model's whole count when the prompt ran alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "cisa/core/json.h"
#include "cisa/model/eval.h"

namespace cisa::eval {
namespace {

namespace fs = std::filesystem;

// Seeded pseudo-English sentences: a haystack corpus that needs no Debian package.
std::string corpus_text() {
  static const char* words[] = {
      "river",  "stone",  "quiet",   "morning", "garden", "letter",  "window", "silver", "candle",
      "harbor", "meadow", "lantern", "orchard", "pepper", "thunder", "violet", "willow", "anchor",
      "basket", "cobble", "dimmer",  "ember",   "fable",  "glimmer", "hollow"};
  std::string t;
  uint32_t s = 12345;
  for (int i = 0; i < 400; ++i) {
    std::string sentence;
    const int n = 6 + static_cast<int>(i % 7);
    for (int w = 0; w < n; ++w) {
      s = s * 1664525u + 1013904223u;
      std::string word = words[(s >> 16) % 25];
      if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      sentence += (w ? " " : "") + word;
    }
    t += sentence + ". ";
    if (i % 10 == 9) t += "\n";
  }
  return t;
}

std::map<std::string, Json> read_lines(const fs::path& file) {
  std::map<std::string, Json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    auto v = json_parse(line);
    EXPECT_TRUE(v.ok()) << line;
    if (v.ok()) out[json_string(*v, "id") + "|" + json_string(*v, "config")] = *v;
  }
  return out;
}

TEST(EvalBatch, BatchedRunEqualsOneAtATime) {
  const std::string model =
      std::string(CISA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "models/SmolLM2-135M-Instruct.Q4_1.gguf not downloaded";
  const fs::path root =
      fs::temp_directory_path() / ("cisa_eval_batch_" + std::to_string(::getpid()));
  fs::create_directories(root / "texts");
  std::ofstream(root / "texts" / "book.txt") << corpus_text();

  EvalPlan plan;
  plan.model_path = model;
  plan.model_name = "smollm2-135m";
  plan.texts_dir = (root / "texts").string();
  plan.tasks = {TaskKind::kNiahSingle, TaskKind::kVariableTracking};
  plan.lengths = {320};
  plan.examples = 2;
  plan.threads = 2;
  plan.prefill_block = 64;
  for (const char* c : {"dense", "cisa:k3:w2:g4", "cisa:k2:w2:g1"}) {
    auto cfg = parse_config(c);
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    plan.configs.push_back(*cfg);
  }
  plan.run_dir = (root / "one").string();
  plan.batch = 1;
  Status s = run_eval(plan);
  ASSERT_TRUE(s.ok()) << s.message();
  plan.run_dir = (root / "batched").string();
  plan.batch = 3;  // 4 prompts per configuration: a full batch and a partial one
  s = run_eval(plan);
  ASSERT_TRUE(s.ok()) << s.message();

  const auto one = read_lines(root / "one" / "results.jsonl");
  const auto batched = read_lines(root / "batched" / "results.jsonl");
  ASSERT_EQ(one.size(), 12u);
  ASSERT_EQ(batched.size(), one.size());
  int64_t sparse_read = 0, sparse_dense = 0;
  for (const auto& [key, a] : one) {
    ASSERT_TRUE(batched.count(key)) << key;
    const Json& b = batched.at(key);
    EXPECT_EQ(json_string(a, "prediction"), json_string(b, "prediction")) << key;
    EXPECT_EQ(json_number(a, "score"), json_number(b, "score")) << key;
    EXPECT_EQ(json_number(a, "generated_tokens"), json_number(b, "generated_tokens")) << key;
    const Json* sa = json_member(a, "stats");
    const Json* sb = json_member(b, "stats");
    ASSERT_TRUE(sa && sb) << key;
    EXPECT_EQ(json_number(*sa, "global_pages_read"), json_number(*sb, "global_pages_read")) << key;
    EXPECT_EQ(json_number(*sa, "global_pages_dense"), json_number(*sb, "global_pages_dense"))
        << key;
    EXPECT_GT(json_number(*sa, "global_pages_dense"), 0) << key;
    if (json_string(a, "config") != "dense") {
      sparse_read += static_cast<int64_t>(json_number(*sa, "global_pages_read"));
      sparse_dense += static_cast<int64_t>(json_number(*sa, "global_pages_dense"));
    } else {
      EXPECT_EQ(json_number(*sa, "global_pages_read"), json_number(*sa, "global_pages_dense"));
    }
    EXPECT_GE(json_number(b, "batch", 0), 1) << key;
  }
  EXPECT_LT(sparse_read, sparse_dense);
  fs::remove_all(root);
}

TEST(EvalBatch, BadBatchIsRejected) {
  EvalPlan plan;
  plan.configs.push_back(*parse_config("dense"));
  plan.tasks = {TaskKind::kPasskey};
  plan.lengths = {640};
  plan.batch = 0;
  EXPECT_EQ(run_eval(plan).code(), StatusCode::kInvalidArgument);
  plan.batch = 1 << 20;
  EXPECT_EQ(run_eval(plan).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cisa::eval
