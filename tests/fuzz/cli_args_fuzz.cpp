// cli_args_fuzz — libFuzzer target for the CLI's option parser, cisa::cli::ArgParser, and for
// cli::terminal_safe (tests/fuzz/CMakeLists.txt says how to run it; seeds in
// tests/fuzz/corpus/cli_args/, option names in cli_args.dict).
//
// Input: byte 0 picks a parser declaration (which options are required, ranges); the rest is split
// at NUL bytes into argv[1…] (at most 64 words). The parser declares every kind of option the
// subcommands use: flags, ranged and default-ranged integers, ranged and unranged doubles,
// strings, a repeating option, choices, aliases and a positional argument. Invariants:
//  - parse returns -1 (run), 0 (after --help, which printed help and was in argv) or 2;
//  - 2 always comes with a message on stderr naming the program; -1 and 0 print nothing there;
//  - after -1 every required option was given, each integer lies in its range (or kept its
//    default when not given), each double is finite and in its range, each choice is a listed one;
//  - terminal_safe of every word is valid UTF-8 without C0/DEL/C1 controls except tab, leaves
//    printable UTF-8 alone, and is idempotent.
// stdout and stderr are sent to memory files while parse runs, so that the messages can be
// checked; sanitizer reports still go to the real stderr.
#include <sanitizer/common_interface_defs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli_args.h"

namespace {

int g_real_stderr = -1;
int g_out_fd = -1, g_err_fd = -1;

[[noreturn]] void fail(const char* why) {
  if (g_real_stderr >= 0) dup2(g_real_stderr, 2);
  std::fprintf(stderr, "cli_args_fuzz: invariant broken: %s\n", why);
  __builtin_trap();
}

// Runs f with fds 1 and 2 writing to the memory files; returns what each received.
template <class F>
void captured(F&& f, std::string* out, std::string* err) {
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved_out = dup(1), saved_err = dup(2);
  for (int fd : {g_out_fd, g_err_fd}) {
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) fail("cannot reset a memory file");
  }
  dup2(g_out_fd, 1);
  dup2(g_err_fd, 2);
  f();
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  for (auto [fd, s] : {std::pair{g_out_fd, out}, std::pair{g_err_fd, err}}) {
    const off_t n = lseek(fd, 0, SEEK_END);
    s->assign(static_cast<size_t>(n > 0 ? n : 0), '\0');
    if (n > 0 && pread(fd, s->data(), s->size(), 0) != n) fail("cannot read a memory file");
  }
}

bool valid_utf8_no_controls(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t') || c == 0x7F) return false;
      ++i;
      continue;
    }
    const size_t n = c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    const auto c1 = static_cast<unsigned char>(s[i + 1]);
    if (n == 2 && c == 0xC2 && c1 < 0xA0) return false;  // C1 controls
    if (n == 3 && ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F))) return false;
    if (n == 4 && ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F))) return false;
    i += n;
  }
  return true;
}

void check_terminal_safe(const std::string& word) {
  const std::string safe = cisa::cli::terminal_safe(word);
  if (!valid_utf8_no_controls(safe)) fail("terminal_safe left a control or invalid UTF-8");
  if (valid_utf8_no_controls(word) && safe != word) fail("terminal_safe changed printable text");
  if (cisa::cli::terminal_safe(safe) != safe) fail("terminal_safe is not idempotent");
}

constexpr int64_t kUnset = -777;  // an integer default no range below contains

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  g_real_stderr = dup(2);
  __sanitizer_set_report_fd(reinterpret_cast<void*>(static_cast<intptr_t>(g_real_stderr)));
  g_out_fd = memfd_create("cli_args_fuzz_stdout", 0);
  g_err_fd = memfd_create("cli_args_fuzz_stderr", 0);
  if (g_out_fd < 0 || g_err_fd < 0) fail("memfd_create failed");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t config = data[0];
  std::vector<std::string> words = {"cisa fuzz"};
  std::string cur;
  for (size_t i = 1; i < size && words.size() <= 64; ++i) {
    if (data[i] == 0) {
      words.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  if (words.size() <= 64) words.push_back(cur);
  for (size_t i = 1; i < words.size(); ++i) check_terminal_safe(words[i]);

  namespace cli = cisa::cli;
  const bool context_required = config & 1, model_required = config & 2;
  const cli::IntRange signed_range{config & 4 ? INT64_MIN : -1000, config & 4 ? INT64_MAX : 1000};
  const cli::DoubleRange temp_range{0.0, 100.0}, top_p_range{0.0, 1.0};
  bool json = false, greedy = false;
  int64_t context = kUnset, tokens = kUnset, offset = kUnset;
  double temperature = -1.0, top_p = -1.0, scale = -1.0;
  // The initial values hold a NUL, which no argv string can: "still unset" can never be confused
  // with a value the fuzzer passed (it once passed the word "unset" itself).
  const std::string kUnsetText("\0unset", 6);
  std::string model = kUnsetText, prompt = kUnsetText, backend = kUnsetText, file = kUnsetText;
  std::vector<std::string> docs;

  cli::ArgParser p("cisa fuzz", "the fuzzer's parser");
  p.add_flag("--json", &json, "print one JSON document");
  p.add_flag("--greedy", &greedy, "argmax sampling");
  p.add_int("--context", &context, "context tokens", {1, cli::kMaxContextTokens}, context_required);
  p.add_int("--tokens", &tokens, "tokens to generate");
  p.alias("-n", "--tokens");
  p.add_int("--offset", &offset, "a signed number", signed_range);
  p.add_double("--temperature", &temperature, "sampling temperature", temp_range);
  p.add_double("--top-p", &top_p, "nucleus mass", top_p_range);
  p.add_double("--scale", &scale, "any finite number");
  p.add_string("--prompt", &prompt, "prompt text");
  p.alias("-p", "--prompt");
  p.add_string("--model", &model, "model name or path", model_required && (config & 8));
  p.alias("-m", "--model");
  p.add_strings("--data", &docs, "text files");
  p.add_choice("--backend", &backend, {"cpu", "cuda"}, "backend");
  p.add_positional("FILE", &file, "a positional argument", model_required && !(config & 8));

  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  int rc = -3;
  std::string out, err;
  captured([&] { rc = p.parse(static_cast<int>(words.size()), argv.data()); }, &out, &err);

  if (rc != -1 && rc != 0 && rc != 2) fail("parse returned an exit code other than -1, 0, 2");
  if (rc == 2) {
    if (err.empty()) fail("a rejection printed no message");
    if (err.rfind("cisa fuzz: ", 0) != 0) fail("a rejection message does not name the program");
    return 0;
  }
  if (!err.empty()) fail("an accepted command line printed to stderr");
  if (rc == 0) {
    bool asked = false;
    for (size_t i = 1; i < words.size(); ++i) asked |= words[i] == "-h" || words[i] == "--help";
    if (!asked || out.empty()) fail("exit code 0 without --help, or an empty help");
    return 0;
  }
  // rc == -1: the command would run with these values.
  if (context_required && !p.given("--context")) fail("a required option was not given");
  if (model_required && (config & 8) && !p.given("--model")) fail("required --model missing");
  if (model_required && !(config & 8) && file == kUnsetText) fail("required positional missing");
  const auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  if (p.given("--context") ? !in(context, 1, cli::kMaxContextTokens) : context != kUnset)
    fail("--context out of range");
  if (p.given("--tokens") ? !in(tokens, 0, INT32_MAX) : tokens != kUnset)
    fail("--tokens out of the default range");
  if (p.given("--offset") ? !in(offset, signed_range.min, signed_range.max) : offset != kUnset)
    fail("--offset out of range");
  const auto din = [&p](const char* name, double v, double lo, double hi) {
    return p.given(name) ? std::isfinite(v) && v >= lo && v <= hi : v == -1.0;
  };
  if (!din("--temperature", temperature, 0, 100) || !din("--top-p", top_p, 0, 1) ||
      !din("--scale", scale, -1e300, 1e300))
    fail("a double option is not finite or out of range");
  if (p.given("--backend") ? backend != "cpu" && backend != "cuda" : backend != kUnsetText)
    fail("--backend is not one of its choices");
  return 0;
}
