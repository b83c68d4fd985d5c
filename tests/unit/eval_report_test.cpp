// The eval summary: its numbers on hand-made result lines computed by hand (the JSON reader and
// writer themselves are tested in json_format_test).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cisa/core/json.h"
#include "cisa/model/eval.h"

namespace cisa::eval {
namespace {

class SummaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() /
        ("cisa_eval_summary_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "results.jsonl") << text; }
  std::filesystem::path dir_;
};

std::string gen_line(const std::string& task, int index, const std::string& config, double score,
                     int gen) {
  Json j = Json::object();
  j["id"] = task + "/4096/" + std::to_string(index);
  j["task"] = task;
  j["length"] = 4096;
  j["index"] = index;
  j["config"] = config;
  j["budget"] = config == "dense" ? 0 : 16;
  j["score"] = score;
  j["generated_tokens"] = gen;
  return json_dump(j) + "\n";
}

TEST_F(SummaryTest, HandComputedNumbers) {
  std::string lines;
  // dense: niah [1, 1], vt [0, 0.4] → (1 + 0.2) / 2 = 60 points.
  // cisa:  niah [1, 0], vt [0, 0.4] → (0.5 + 0.2) / 2 = 35 points; paired Δ = (−0.5 + 0) / 2 = −25.
  lines += gen_line("niah_single", 0, "dense", 1, 8) + gen_line("niah_single", 1, "dense", 1, 8);
  lines += gen_line("vt", 0, "dense", 0, 10) + gen_line("vt", 1, "dense", 0.4, 14);
  lines += gen_line("niah_single", 0, "cisa:x8:g4", 1, 8) +
           gen_line("niah_single", 1, "cisa:x8:g4", 0, 12);
  lines += gen_line("vt", 0, "cisa:x8:g4", 0, 10) + gen_line("vt", 1, "cisa:x8:g4", 0.4, 10);
  // A configuration that keeps layers dense: its table row names them.
  lines += gen_line("niah_single", 0, "cisa:x8:g4:d2:e1:dl7-10+12", 1, 8);
  // Documents: ΔNLL = (9 − 8) / 4 = +0.25; KL = 0.4 / 4 = 0.1; agreement 3 / 4.
  lines +=
      R"({"id":"doc/4096/0/a","task":"doc","length":4096,"index":0,"config":"dense","nll":[1,2,3,2]})"
      "\n";
  lines +=
      R"({"id":"doc/4096/0/a","task":"doc","length":4096,"index":0,"config":"cisa:x8:g4","nll":[1.5,2,3,2.5],"kl":[0.1,0,0,0.3],"agree":[1,1,0,1]})"
      "\n";
  lines += "{\"id\":\"cut";  // an interrupted last line is ignored
  write(lines);
  auto s = write_summary(dir_.string(), 500);
  ASSERT_TRUE(s.ok()) << s.status().message();
  const std::string& md = *s;
  EXPECT_NE(md.find("| dense | 60.0 ["), std::string::npos) << md;
  EXPECT_NE(md.find("| cisa:x8:g4 | 35.0 ["), std::string::npos) << md;
  EXPECT_NE(md.find("| cisa:x8:g4 | -25.0 ["), std::string::npos) << md;
  // Generated tokens: dense 40 / 4 = 10, cisa 40 / 4 = 10 → +0.0%.
  EXPECT_NE(md.find("| cisa:x8:g4 | 4096 | 10.00 | +0.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("+0.2500"), std::string::npos) << md;
  EXPECT_NE(md.find("0.1000 [0.1000, 0.1000]"), std::string::npos) << md;
  EXPECT_NE(md.find("75.0%"), std::string::npos) << md;
  // KL by quarter: one position per quarter.
  EXPECT_NE(md.find("| cisa:x8:g4 | 4096 | 0.1000 | 0.0000 | 0.0000 | 0.3000 |"), std::string::npos)
      << md;
  // k = ceil((256 − 128) / 8) = 16 at 4096 tokens.
  EXPECT_NE(md.find("| cisa:x8:g4 | 4096 | 128 | 128 | 16 | 145 / 256 (1.8x) | — |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| cisa:x8:g4:d2:e1:dl7-10+12 | 4096 | 128 | 128 | 16 | 145 / 256 (1.8x) | "
                    "first 2, last 1, 7-10, 12 |"),
            std::string::npos)
      << md;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "summary.md"));
}

TEST_F(SummaryTest, MissingResults) {
  EXPECT_FALSE(write_summary((dir_ / "nothing").string()).ok());
}

}  // namespace
}  // namespace cisa::eval
