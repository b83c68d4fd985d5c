#include "cli_args.h"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace cisa::cli {

namespace {

std::string format_double(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// "[lo, hi]", built by appending (GCC 12 warns falsely about `"[" + std::string` chains).
std::string range_text(const std::string& lo, const std::string& hi) {
  std::string r = "[";
  r += lo;
  r += ", ";
  r += hi;
  r += ']';
  return r;
}

}  // namespace

std::string terminal_safe(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto hex = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  };
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = u(i);
    if (c == '\t' || (c >= 0x20 && c < 0x7F)) {
      out += static_cast<char>(c);
      continue;
    }
    if (c < 0x80 || c < 0xC2) {  // C0 controls, DEL, stray continuation bytes
      hex(c);
      continue;
    }
    // A well-formed UTF-8 sequence passes unless it encodes a C1 control (U+0080 … U+009F).
    const size_t n = c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (u(i + k) & 0xC0) == 0x80;
    if (ok && n == 3) ok = !(c == 0xE0 && u(i + 1) < 0xA0) && !(c == 0xED && u(i + 1) > 0x9F);
    if (ok && n == 4) ok = !(c == 0xF0 && u(i + 1) < 0x90) && !(c == 0xF4 && u(i + 1) > 0x8F);
    if (ok && n == 2 && c == 0xC2 && u(i + 1) < 0xA0) ok = false;
    if (!ok) {
      hex(c);
      continue;
    }
    out.append(s.substr(i, n));
    i += n - 1;
  }
  return out;
}

Result<std::string> read_input_file(const std::string& path, const std::string& option) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return not_found(option + ": cannot read '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return invalid_argument(option + ": '" + path + "' is a folder; give a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(option + ": cannot open '" + path + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return data_loss(option + ": reading '" + path + "' failed");
  return ss.str();
}

ArgParser::ArgParser(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void ArgParser::add_flag(const std::string& name, bool* out, const std::string& help) {
  Option o{name, help, "flag"};
  o.set_flag = [out] { *out = true; };
  options_.push_back(std::move(o));
}

void ArgParser::add_int(const std::string& name, int64_t* out, const std::string& help,
                        IntRange range, bool required) {
  Option o{name, help, "int", required};
  o.range = range_text(std::to_string(range.min), std::to_string(range.max));
  o.set = [out, range](const std::string& v) {
    // A leading '+' is accepted as in "--seed +3"; from_chars takes only '-'.
    const char* b = v.data() + (v.size() > 1 && v[0] == '+' ? 1 : 0);
    int64_t x = 0;
    auto [p, ec] = std::from_chars(b, v.data() + v.size(), x);
    // Out of int64 (result_out_of_range) is out of every range too.
    if (ec != std::errc() || p != v.data() + v.size()) return false;
    if (x < range.min || x > range.max) return false;
    *out = x;
    return true;
  };
  options_.push_back(std::move(o));
}

void ArgParser::add_double(const std::string& name, double* out, const std::string& help,
                           DoubleRange range, bool required) {
  Option o{name, help, "double", required};
  const DoubleRange any;
  if (range.min != any.min || range.max != any.max)
    o.range = range_text(format_double(range.min), format_double(range.max));
  o.set = [out, range](const std::string& v) {
    if (v.empty() || std::isspace(static_cast<unsigned char>(v[0]))) return false;
    char* end = nullptr;
    errno = 0;
    double x = std::strtod(v.c_str(), &end);
    if (end != v.c_str() + v.size() || errno == ERANGE) return false;
    if (!std::isfinite(x) || x < range.min || x > range.max) return false;
    *out = x;
    return true;
  };
  options_.push_back(std::move(o));
}

void ArgParser::add_string(const std::string& name, std::string* out, const std::string& help,
                           bool required) {
  Option o{name, help, "string", required};
  o.set = [out](const std::string& v) {
    *out = v;
    return true;
  };
  options_.push_back(std::move(o));
}

void ArgParser::add_strings(const std::string& name, std::vector<std::string>* out,
                            const std::string& help, bool required) {
  Option o{name, help, "strings", required};
  o.set = [out](const std::string& v) {
    out->push_back(v);
    return true;
  };
  options_.push_back(std::move(o));
}

void ArgParser::add_choice(const std::string& name, std::string* out,
                           std::vector<std::string> choices, const std::string& help) {
  Option o{name, help, "choice"};
  o.choices = choices;
  o.set = [out, choices](const std::string& v) {
    for (const auto& c : choices)
      if (c == v) {
        *out = v;
        return true;
      }
    return false;
  };
  options_.push_back(std::move(o));
}

void ArgParser::alias(const std::string& short_name, const std::string& name) {
  aliases_.emplace_back(short_name, name);
}

void ArgParser::add_positional(const std::string& name, std::string* out, const std::string& help,
                               bool required) {
  Option o{name, help, "positional", required};
  o.set = [out](const std::string& v) {
    *out = v;
    return true;
  };
  options_.push_back(std::move(o));
}

ArgParser::Option* ArgParser::find(const std::string& name) {
  std::string n = name;
  for (const auto& [a, full] : aliases_)
    if (a == name) n = full;
  for (auto& o : options_)
    if (o.kind != "positional" && o.name == n) return &o;
  return nullptr;
}

bool ArgParser::given(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return o.seen;
  return false;
}

void ArgParser::print_help() const {
  std::printf("usage: %s [options]", program_.c_str());
  for (const auto& o : options_)
    if (o.kind == "positional") std::printf(o.required ? " %s" : " [%s]", o.name.c_str());
  std::printf("\n\n%s\n\noptions:\n", summary_.c_str());
  for (const auto& o : options_) {
    std::string left = o.name;
    for (const auto& [a, full] : aliases_)
      if (full == o.name) left = a + ", " + left;
    if (o.kind == "int") left += " N";
    if (o.kind == "double") left += " X";
    if (o.kind == "string" || o.kind == "strings") left += " VALUE";
    if (o.kind == "choice") {
      left += " ";
      for (size_t i = 0; i < o.choices.size(); ++i) left += (i ? "|" : "") + o.choices[i];
    }
    const std::string range = o.range.empty() ? "" : " " + o.range;
    std::printf("  %-34s %s%s%s\n", left.c_str(), o.help.c_str(), range.c_str(),
                o.required ? " (required)" : "");
  }
  std::printf("  %-34s %s\n", "-h, --help", "show this help");
}

int ArgParser::parse(int argc, char** argv) {
  // argv[0] is the subcommand name.
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      print_help();
      return 0;
    }
    std::string value;
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      if (auto eq = arg.find('='); eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        inline_value = true;
      }
    }
    if (arg.size() > 1 && arg[0] == '-' && !(arg[1] >= '0' && arg[1] <= '9')) {
      Option* o = find(arg);
      if (!o) {
        std::fprintf(stderr, "%s: unknown option '%s' (see --help)\n", program_.c_str(),
                     arg.c_str());
        return 2;
      }
      o->seen = true;
      if (o->kind == "flag") {
        if (inline_value) {
          std::fprintf(stderr, "%s: option %s takes no value\n", program_.c_str(), arg.c_str());
          return 2;
        }
        o->set_flag();
        continue;
      }
      auto take = [&](const std::string& v) {
        if (!o->set(v)) {
          std::string expect = o->kind == "int" ? "an integer in " + o->range
                               : o->kind == "double"
                                   ? "a finite number" + (o->range.empty() ? "" : " in " + o->range)
                                   : "one of the listed choices";
          std::fprintf(stderr, "%s: option %s expects %s (got '%s')\n", program_.c_str(),
                       o->name.c_str(), expect.c_str(), v.c_str());
          return false;
        }
        return true;
      };
      if (inline_value) {
        if (!take(value)) return 2;
      } else {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "%s: option %s needs a value\n", program_.c_str(), o->name.c_str());
          return 2;
        }
        if (!take(argv[++i])) return 2;
        // A multi-valued option swallows following bare words.
        while (o->kind == "strings" && i + 1 < argc && argv[i + 1][0] != '-') take(argv[++i]);
      }
      continue;
    }
    // Positional.
    bool placed = false;
    for (auto& o : options_)
      if (o.kind == "positional" && !o.seen) {
        o.seen = true;
        o.set(arg);
        placed = true;
        break;
      }
    if (!placed) {
      std::fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", program_.c_str(),
                   arg.c_str());
      return 2;
    }
  }
  for (const auto& o : options_)
    if (o.required && !o.seen) {
      std::fprintf(stderr, "%s: missing required %s %s (see --help)\n", program_.c_str(),
                   o.kind == "positional" ? "argument" : "option", o.name.c_str());
      return 2;
    }
  return -1;
}

}  // namespace cisa::cli
