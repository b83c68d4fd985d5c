// cli_common.h — what every `cisa` subcommand shares: its error line, its clock, its JSON output.
//
//   namespace { constexpr FailWith fail{"cisa run"}; }   // once per subcommand file
//   if (!s.ok()) return fail(s.message());                // "cisa run: <message>" on stderr, 1
//   if (bad_flags) return fail("need --context", 2);      // exit status 2
//
//   Stopwatch sw;
//   work();
//   const double tok_s = n / sw.seconds();
//
//   print_json(doc);                                      // json_dump(doc, 2) and a newline
//
//   doc["date"] = utc_now();  doc["cpu"] = cpu_model_name();   // what a benchmark ran on, when
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "cisa/core/json.h"

namespace cisa::cli {

// Reports an error of one subcommand: `fail(msg)` prints "<command>: <msg>" on stderr and returns
// the exit status (1: the work failed; 2 by convention: the command line is unusable).
struct FailWith {
  const char* command;
  int operator()(const std::string& msg, int status = 1) const {
    std::fprintf(stderr, "%s: %s\n", command, msg.c_str());
    return status;
  }
};

// Wall-clock time on the steady clock since construction or the last restart().
class Stopwatch {
 public:
  Stopwatch() : t0_(Clock::now()) {}
  void restart() { t0_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  double ms() const {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_;
};

// A subcommand's --json document on stdout: json_dump(j, 2) and a newline.
inline void print_json(const Json& j) {
  std::printf("%s\n", json_dump(j, 2).c_str());
}

// The current time in UTC, ISO 8601 to the second ("2026-12-04T21:38:02Z").
inline std::string utc_now() {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return date;
}

// The processor's name from the first "model name" line of /proc/cpuinfo; "" where there is none.
inline std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "";
}

}  // namespace cisa::cli
