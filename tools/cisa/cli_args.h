// cli_args.h — the small argument parser every `cisa` subcommand uses.
//
//   ArgParser p("cisa traffic", "Attention-traffic model of SPEC section 8");
//   int64_t context = 0; p.add_int("--context", &context, "context length N", /*required=*/true);
//   bool json = false;   p.add_flag("--json", &json, "print one JSON document");
//   if (int rc = p.parse(argc, argv); rc >= 0) return rc;   // --help or an error: exit with rc
//
// Unknown options, missing values and malformed numbers are reported with the option's name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cisa::cli {

class ArgParser {
 public:
  ArgParser(std::string program, std::string summary);

  void add_flag(const std::string& name, bool* out, const std::string& help);
  void add_int(const std::string& name, int64_t* out, const std::string& help, bool required = false);
  void add_double(const std::string& name, double* out, const std::string& help,
                  bool required = false);
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
    std::function<bool(const std::string&)> set;  // false: malformed value
    std::function<void()> set_flag;
  };
  Option* find(const std::string& name);
  std::string program_, summary_;
  std::vector<Option> options_;
  std::vector<std::pair<std::string, std::string>> aliases_;
};

}  // namespace cisa::cli
