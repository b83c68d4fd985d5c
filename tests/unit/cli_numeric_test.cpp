// The CLI's argument parser: numbers outside an option's range, outside int64, or not finite are
// errors naming the option and its range, and never change the value. The parser lives in
// tools/cisa (it is the CLI's, not the library's), so its one source file is compiled in here.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../../tools/cisa/cli_args.cpp"

namespace cisa::cli {
namespace {

// Runs p.parse on {"cmd", args...}; returns the exit code (-1: parsed) and stderr in *err.
int parse(ArgParser& p, std::vector<std::string> args, std::string* err) {
  args.insert(args.begin(), "cmd");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  const int rc = p.parse(static_cast<int>(argv.size()), argv.data());
  *err = ::testing::internal::GetCapturedStderr();
  return rc;
}

TEST(CliNumeric, OutOfRangeIsAnErrorNamingOptionAndRange) {
  ArgParser p("cisa x", "test");
  int64_t page = 16;
  p.add_int("--page", &page, "page size", {1, 1 << 20});
  std::string err;
  EXPECT_EQ(parse(p, {"--page", "9223372036854775807"}, &err), 2);
  EXPECT_NE(err.find("--page"), std::string::npos) << err;
  EXPECT_NE(err.find("[1, 1048576]"), std::string::npos) << err;
  EXPECT_EQ(page, 16);
  EXPECT_EQ(parse(p, {"--page", "0"}, &err), 2);
  EXPECT_EQ(parse(p, {"--page=1048577"}, &err), 2);
  EXPECT_EQ(page, 16);
  EXPECT_EQ(parse(p, {"--page", "1048576"}, &err), -1) << err;
  EXPECT_EQ(page, 1048576);
}

TEST(CliNumeric, BeyondInt64AndWrappingValuesAreRejected) {
  ArgParser p("cisa x", "test");
  int64_t k = 40;
  p.add_int("--top-k", &k, "top k");  // the default range: [0, INT32_MAX]
  std::string err;
  // -4294967295 wraps to 1 when stored in 32 bits; it must not get that far.
  EXPECT_EQ(parse(p, {"--top-k", "-4294967295"}, &err), 2);
  EXPECT_NE(err.find("[0, 2147483647]"), std::string::npos) << err;
  EXPECT_EQ(parse(p, {"--top-k", "99999999999999999999999"}, &err), 2);
  EXPECT_EQ(parse(p, {"--top-k", "2147483648"}, &err), 2);
  EXPECT_EQ(parse(p, {"--top-k", "-5"}, &err), 2);
  EXPECT_EQ(parse(p, {"--top-k", "12abc"}, &err), 2);
  EXPECT_EQ(parse(p, {"--top-k", ""}, &err), 2);
  EXPECT_EQ(k, 40);
  EXPECT_EQ(parse(p, {"--top-k", "+7"}, &err), -1) << err;
  EXPECT_EQ(k, 7);
}

TEST(CliNumeric, NegativeRangesAccepted) {
  ArgParser p("cisa x", "test");
  int64_t v = 0;
  p.add_int("--offset", &v, "offset", {-10, 10});
  std::string err;
  EXPECT_EQ(parse(p, {"--offset", "-10"}, &err), -1) << err;
  EXPECT_EQ(v, -10);
  EXPECT_EQ(parse(p, {"--offset", "-11"}, &err), 2);
}

TEST(CliNumeric, DoublesMustBeFiniteAndInRange) {
  ArgParser p("cisa x", "test");
  double t = 0.8, top_p = 0.95;
  p.add_double("--temperature", &t, "temperature");
  p.add_double("--top-p", &top_p, "nucleus mass", {0.0, 1.0});
  std::string err;
  for (const char* bad : {"nan", "inf", "-inf", "1e999", " 1", "0.5x"}) {
    EXPECT_EQ(parse(p, {"--temperature", bad}, &err), 2) << bad;
    EXPECT_NE(err.find("--temperature"), std::string::npos) << err;
  }
  EXPECT_EQ(t, 0.8);
  EXPECT_EQ(parse(p, {"--top-p", "1.5"}, &err), 2);
  EXPECT_NE(err.find("[0, 1]"), std::string::npos) << err;
  EXPECT_EQ(top_p, 0.95);
  EXPECT_EQ(parse(p, {"--temperature", "0", "--top-p", "0.5"}, &err), -1) << err;
  EXPECT_EQ(t, 0.0);
  EXPECT_EQ(top_p, 0.5);
}

TEST(CliNumeric, HelpShowsTheRange) {
  ArgParser p("cisa x", "test");
  int64_t w = 0;
  p.add_int("--window", &w, "window", {0, 64});
  std::string err;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(parse(p, {"--help"}, &err), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("[0, 64]"), std::string::npos) << out;
}

TEST(CliInputFile, AFolderIsAClearError) {
  const std::string dir = ::testing::TempDir();
  auto r = read_input_file(dir, "--file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is a folder"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("--file"), std::string::npos);
  auto missing = read_input_file(dir + "/no-such-file.txt", "--file");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);
}

TEST(TerminalSafe, ControlCharactersAreShownNotSent) {
  EXPECT_EQ(terminal_safe("plain \xe2\x96\x81 text\t!"), "plain \xe2\x96\x81 text\t!");
  EXPECT_EQ(terminal_safe("\x1b]0;title\x07"), "\\x1b]0;title\\x07");
  EXPECT_EQ(terminal_safe("a\nb\rc\x7f"), "a\\x0ab\\x0dc\\x7f");
  // C1 controls (U+009B is CSI) and bytes that are not UTF-8.
  EXPECT_EQ(terminal_safe("\xc2\x9b"
                          "2J"),
            "\\xc2\\x9b2J");
  EXPECT_EQ(terminal_safe("\xff\xc3"), "\\xff\\xc3");
  EXPECT_EQ(terminal_safe("\xc3\xa9"), "\xc3\xa9");
}

}  // namespace
}  // namespace cisa::cli
