// The built `cisa` binary against a careless user: extreme numbers, folders given as files,
// unwritable outputs, a full disk, hostile model metadata, cut result files. Each case must end
// quickly with a clear message and a non-zero exit (or a correct result), never hang, crash or
// write a wrong file. Every command runs under `timeout`, so a regression fails instead of hanging.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "unit/gguf_test_builder.h"

namespace {

namespace fs = std::filesystem;

// The `cisa` of this build: the test runs from <build>/tests/, the CLI is <build>/cisa. Searched
// upward from this executable, so any build folder (in or out of the source tree) works.
fs::path find_cisa() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  for (fs::path d = exe.parent_path(); !d.empty(); d = d.parent_path()) {
    for (const fs::path& c : {d / "cisa", d / "tools" / "cisa" / "cisa"})
      if (fs::is_regular_file(c) && ::access(c.c_str(), X_OK) == 0) return c;
    if (d == d.root_path()) break;
  }
  return {};
}

struct CliRun {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CliRun cisa(const std::string& args, int seconds = 60) {
  static const fs::path bin = find_cisa();
  CliRun r;
  if (bin.empty()) {
    ADD_FAILURE() << "the cisa binary of this build was not found (build the `cisa` target)";
    return r;
  }
  const std::string cmd =
      "timeout " + std::to_string(seconds) + " " + quote(bin.string()) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  EXPECT_NE(r.rc, 124) << "timed out: " << cmd;
  return r;
}

const std::string kModel = std::string(CISA_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";

class HardeningCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("hardening_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    text_ = (dir_ / "text.txt").string();
    std::ofstream(text_) << "The quick brown fox jumps over the lazy dog.\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  bool have_model() const { return fs::exists(kModel); }
  fs::path dir_;
  std::string text_;
};

bool has(const CliRun& r, const std::string& s) {
  return r.out.find(s) != std::string::npos;
}

TEST_F(HardeningCli, TrafficRejectsHugeValuesAndAnswersHugeContextsAtOnce) {
  CliRun r = cisa("traffic --context 1024 --budget 4 --page 9223372036854775807");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r, "--page") && has(r, "[1, 1048576]")) << r.out;
  r = cisa("traffic --context 9223372036854775807 --budget 4");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r, "--context")) << r.out;
  // The largest accepted context: closed forms, no loop over 2^40 positions.
  r = cisa("traffic --context 1099511627776 --budget 64 --json", 10);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r, "\"nominal_compression\": 1073741824")) << r.out;
  EXPECT_FALSE(has(r, ": -")) << r.out;  // no negative number anywhere
}

TEST_F(HardeningCli, CalibrateBoundsItsOptionsAndChecksTheOutputFirst) {
  if (!have_model()) GTEST_SKIP() << "no model at " << kModel;
  const std::string out = (dir_ / "x.idx").string();
  CliRun r = cisa("calibrate -m " + quote(kModel) + " --data " + quote(text_) +
                  " --budget 9223372036854775807 -o " + quote(out));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r, "--budget") && has(r, "[1, 67108864]")) << r.out;
  EXPECT_FALSE(fs::exists(out));
  r = cisa("calibrate -m " + quote(kModel) + " --data " + quote(text_) +
           " --window 9223372036854775807 --budget 8 -o " + quote(out));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_FALSE(fs::exists(out));
  // An output in a folder that does not exist is reported in seconds, before the calibration.
  r = cisa("calibrate -m " + quote(kModel) + " --data " + quote(text_) + " --budget 8 -o " +
               quote((dir_ / "missing" / "x.idx").string()),
           20);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r, "--output") && has(r, "does not exist")) << r.out;
  r = cisa("calibrate -m " + quote(kModel) + " --data " + quote(dir_.string()) + " --budget 8 -o " +
           quote(out));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r, "is a folder")) << r.out;
}

TEST_F(HardeningCli, DiagnoseNeverReplacesBadValuesOrGrowsWithoutBound) {
  if (!have_model()) GTEST_SKIP() << "no model at " << kModel;
  const std::string m = "diagnose -m " + quote(kModel) + " -f " + quote(text_);
  CliRun r = cisa(m + " --budget 0");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r, "--budget")) << r.out;
  for (const char* opt : {"--budget 4611686018427387904", "--sink-pages 9223372036854775807",
                          "--window 9223372036854775807"}) {
    r = cisa(m + " " + opt);
    EXPECT_EQ(r.rc, 2) << opt << ": " << r.out;
    EXPECT_TRUE(has(r, "[")) << r.out;
  }
  // In range but far more than the text holds: an error naming the tokens needed.
  r = cisa(m + " --sink-pages 67108864 --quiet", 120);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r, "need at least")) << r.out;
  r = cisa("diagnose -m " + quote(kModel) + " -f " + quote(dir_.string()));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r, "--file") && has(r, "is a folder")) << r.out;
}

TEST_F(HardeningCli, BenchAttentionChecksMemoryAndOutputs) {
  // 2^30 tokens need terabytes of K/V: refused with needed against available memory.
  CliRun r = cisa("bench attention --context 1073741824");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r, "needs about") && has(r, "available")) << r.out;
  r = cisa("bench attention --out " + quote((dir_ / "missing" / "b.json").string()));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r, "--out")) << r.out;
  r = cisa("bench attention --context -5");
  EXPECT_EQ(r.rc, 2) << r.out;
  if (fs::exists("/dev/full")) {
    r = cisa(
        "bench attention --context 2048 --prefill-queries 16 --repeats 1 --geometry 4:1 "
        "--phase decode --threads 2 --out /dev/full",
        300);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_TRUE(has(r, "No space left")) << r.out;
  }
}

TEST_F(HardeningCli, BenchLayerHelpSucceedsInEveryBuild) {
  const CliRun r = cisa("bench layer --help");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r, "layer")) << r.out;
}

#ifdef CISA_WITH_CUDA
// --sm-rates only sizes the shares of --even-shares: alone it is refused before any device work.
TEST_F(HardeningCli, BenchLayerSmRatesNeedEvenShares) {
  const CliRun r = cisa("bench layer --sm-rates");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(has(r, "add --even-shares")) << r.out;
}
#endif

TEST_F(HardeningCli, InfoShowsHostileMetadataSafely) {
  cisa::testing::GgufBuilder g;
  g.add_string("general.architecture", "llama");
  g.add_string("general.name", "evil\x1b]0;pwned\x07\x1b[2J name");
  g.add_string("general.description", "cut \xe2\x96 and latin-1 \xe9");
  const std::vector<uint8_t> bytes = g.build();
  const std::string path = (dir_ / "evil.gguf").string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  CliRun r = cisa("info " + quote(path));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << "escape sequence reached the terminal";
  EXPECT_EQ(r.out.find('\x07'), std::string::npos);
  EXPECT_TRUE(has(r, "\\x1b]0;pwned")) << r.out;
  r = cisa("info --json " + quote(path));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r, "\\u001b]0;pwned")) << r.out;
  EXPECT_TRUE(has(r, "cut \\ufffd\\ufffd and latin-1 \\ufffd")) << r.out;
  EXPECT_EQ(r.out.find('\xe9'), std::string::npos) << "raw invalid UTF-8 in --json output";
}

TEST_F(HardeningCli, EvalSummaryOfGarbageIsAnError) {
  std::ofstream(dir_ / "results.jsonl") << "this is not json\n{\"also\": \"no result\"}\n";
  const CliRun r = cisa("eval --summary-only -o " + quote(dir_.string()));
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r, "no results")) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "summary.md"));
}

TEST_F(HardeningCli, EvalResumeDropsACutLastLine) {
  if (!have_model()) GTEST_SKIP() << "no model at " << kModel;
  const std::string good = "{\"id\":\"niah/1024/0\",\"config\":\"dense\",\"task\":\"niah\"}";
  std::ofstream(dir_ / "results.jsonl", std::ios::binary) << good << "\n{\"id\":\"niah/10";
  // The run stops at the missing --texts folder, after the resume has repaired the file.
  const CliRun r = cisa("eval -m " + quote(kModel) + " --resume --texts " +
                        quote((dir_ / "no-texts").string()) + " -o " + quote(dir_.string()));
  EXPECT_NE(r.rc, 0) << r.out;
  std::ifstream in(dir_ / "results.jsonl", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), good + "\n") << "the next result would be glued onto the cut line";
}

}  // namespace
