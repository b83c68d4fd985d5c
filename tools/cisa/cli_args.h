// cli_args.h — the small argument parser every `cisa` subcommand uses.
//
//   ArgParser p("cisa traffic", "Attention-traffic model of SPEC section 8");
//   int64_t context = 0; p.add_int("--context", &context, "context length N", {1, 1 << 30}, true);
//   bool json = false;   p.add_flag("--json", &json, "print one JSON document");
//   if (int rc = p.parse(argc, argv); rc >= 0) return rc;   // --help or an error: exit with rc
//
// Unknown options, missing values, malformed numbers and numbers outside the option's range are
// reported with the option's name and the accepted range; a bad value is never replaced by the
// default. Every integer option has a range: the one given where it is declared, else
// kDefaultIntRange (non-negative and within int32). Doubles must be finite and within their range.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cisa/core/status.h"

namespace cisa::cli {

struct IntRange {
  int64_t min = 0, max = INT32_MAX;
};
struct DoubleRange {
  double min = -1e300, max = 1e300;
};
// Options declared without a range: counts, sizes, seeds and thread numbers, none negative, all
// stored in int somewhere.
inline constexpr IntRange kDefaultIntRange{0, INT32_MAX};
// Tokens of a context or a document: 2^30 (the largest page index then stays far inside int32).
inline constexpr int64_t kMaxContextTokens = int64_t{1} << 30;

// The whole content of a text file the user named; errors say which option named it and why it
// cannot be read (missing, a folder, unreadable).
Result<std::string> read_input_file(const std::string& path, const std::string& option);

// `s` made safe to print on a terminal: control characters (C0, DEL, C1 such as the escape that
// starts a colour or title sequence) and bytes that are not UTF-8 become \xNN; tab stays.
std::string terminal_safe(std::string_view s);

class ArgParser {
 public:
  ArgParser(std::string program, std::string summary);

  void add_flag(const std::string& name, bool* out, const std::string& help);
  void add_int(const std::string& name, int64_t* out, const std::string& help, IntRange range,
               bool required = false);
  void add_int(const std::string& name, int64_t* out, const std::string& help,
               bool required = false) {
    add_int(name, out, help, kDefaultIntRange, required);
  }
  void add_double(const std::string& name, double* out, const std::string& help, DoubleRange range,
                  bool required = false);
  void add_double(const std::string& name, double* out, const std::string& help,
                  bool required = false) {
    add_double(name, out, help, DoubleRange{}, required);
  }
  void add_string(const std::string& name, std::string* out, const std::string& help,
                  bool required = false);
  // An option that may repeat (--data a.txt --data b.txt) or take several values (--data a b).
  void add_strings(const std::string& name, std::vector<std::string>* out, const std::string& help,
                   bool required = false);
  // One of a fixed set of words (--backend cpu|cuda).
  void add_choice(const std::string& name, std::string* out, std::vector<std::string> choices,
                  const std::string& help);
  // A short alias for an option already added: p.alias("-m", "--model").
  void alias(const std::string& short_name, const std::string& name);
  // Bare words after the options (e.g. a model path); help names them.
  void add_positional(const std::string& name, std::string* out, const std::string& help,
                      bool required = false);

  // Returns -1 when parsing succeeded and the command should run; otherwise the exit code to
  // return (0 after --help, 2 after an error, which has already been printed to stderr).
  int parse(int argc, char** argv);
  void print_help() const;
  // True when the option was given on the command line (not just defaulted).
  bool given(const std::string& name) const;

 private:
  struct Option {
    std::string name, help, kind;  // kind: flag|int|double|string|strings|choice|positional
    bool required = false, seen = false;
    std::vector<std::string> choices;
    std::string range;  // "[min, max]" of a number option, for errors and help
    std::function<bool(const std::string&)> set;  // false: malformed value
    std::function<void()> set_flag;
  };
  Option* find(const std::string& name);
  std::string program_, summary_;
  std::vector<Option> options_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

}  // namespace cisa::cli
