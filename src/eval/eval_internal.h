// eval_internal.h — pieces the eval sources share: a portable seeded generator, the length
// fitting search, and small string helpers. Not a public header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cisa/model/eval.h"

namespace cisa::eval::detail {

// splitmix64: the same stream on every platform and standard library (std distributions are
// not portable), which is what makes a seed name the same prompts everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (n > 0), by rejection so there is no modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }
  double uniform01() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t s_;
};

// A seed for one example, mixing the run seed with the task, length and index.
uint64_t example_seed(uint64_t seed, TaskKind kind, int64_t length, int64_t index);

// The largest n in [0, n_max] with count(build(n)) ≤ target, assuming the count grows with n.
// Interpolates between a fitting and a failing n (token counts grow almost linearly), so a
// 32K-token prompt needs a handful of tokenizations. kInvalidArgument when even n = 0 is too long.
Result<int64_t> fit_count(const std::function<std::string(int64_t)>& build, int64_t n_max,
                          int64_t target, const TokenCounter& count);

// Occurrences of `needle` in `text` (overlapping ones counted), exact bytes.
int64_t count_occurrences(std::string_view text, std::string_view needle);
std::string to_lower(std::string_view s);

// Word lists for needle keys ("adjective-noun"), written for this project.
extern const std::vector<std::string> kKeyAdjectives;
extern const std::vector<std::string> kKeyNouns;

}  // namespace cisa::eval::detail
