// RULER-style scoring of generated text, and the task bootstrap of the report.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "eval_internal.h"

namespace cisa::eval {

std::string clean_prediction(std::string_view text) {
  std::string s(text);
  // Control characters (other than tab, newline, carriage return) become line breaks.
  for (char& c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f) c = '\n';
  }
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

namespace {
bool contains_ci(const std::string& lower_text, const std::string& ref) {
  return lower_text.find(detail::to_lower(ref)) != std::string::npos;
}
}  // namespace

double string_match_all(std::string_view prediction, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0.0;
  const std::string p = detail::to_lower(clean_prediction(prediction));
  double hit = 0;
  for (const auto& r : refs) hit += contains_ci(p, r) ? 1.0 : 0.0;
  return hit / static_cast<double>(refs.size());
}

double string_match_part(std::string_view prediction, const std::vector<std::string>& refs) {
  const std::string p = detail::to_lower(clean_prediction(prediction));
  for (const auto& r : refs)
    if (contains_ci(p, r)) return 1.0;
  return 0.0;
}

double score_prediction(const Example& ex, std::string_view prediction) {
  return ex.match == MatchKind::kAll ? string_match_all(prediction, ex.answers)
                                     : string_match_part(prediction, ex.answers);
}

Interval bootstrap_interval(const std::vector<std::vector<double>>& groups, int iters,
                            uint64_t seed, double level) {
  std::vector<const std::vector<double>*> g;
  for (const auto& v : groups)
    if (!v.empty()) g.push_back(&v);
  Interval out;
  if (g.empty()) return out;
  auto stat = [&](auto&& value_of) {
    double s = 0;
    for (size_t i = 0; i < g.size(); ++i) s += value_of(i);
    return s / static_cast<double>(g.size());
  };
  out.mean = stat([&](size_t i) {
    double s = 0;
    for (double x : *g[i]) s += x;
    return s / static_cast<double>(g[i]->size());
  });
  if (iters < 1) {
    out.lo = out.hi = out.mean;
    return out;
  }
  detail::Rng rng(seed);
  std::vector<double> stats(static_cast<size_t>(iters));
  for (int it = 0; it < iters; ++it) {
    stats[static_cast<size_t>(it)] = stat([&](size_t i) {
      const auto& v = *g[i];
      double s = 0;
      for (size_t k = 0; k < v.size(); ++k) s += v[rng.below(v.size())];
      return s / static_cast<double>(v.size());
    });
  }
  std::sort(stats.begin(), stats.end());
  const double a = (1.0 - level) / 2.0;
  auto at = [&](double q) {
    return stats[static_cast<size_t>(std::floor(q * static_cast<double>(iters - 1)))];
  };
  out.lo = at(a);
  out.hi = at(1.0 - a);
  return out;
}

}  // namespace cisa::eval
