#include "cisa/core/diagnostics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace cisa {

std::vector<double> chunk_mass(std::span<const std::span<const double>> head_probs, int page_size) {
  size_t n = 0;
  for (auto h : head_probs) n = std::max(n, h.size());
  std::vector<double> mass(
      (n + static_cast<size_t>(page_size) - 1) / static_cast<size_t>(page_size), 0.0);
  for (auto h : head_probs)
    for (size_t s = 0; s < h.size(); ++s) mass[s / static_cast<size_t>(page_size)] += h[s];
  return mass;
}

double captured_mass(std::span<const double> mass, std::span<const int32_t> chunks) {
  const double total = std::accumulate(mass.begin(), mass.end(), 0.0);
  if (total <= 0) return 0;
  std::vector<int32_t> c(chunks.begin(), chunks.end());
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  double got = 0;
  for (int32_t j : c)
    if (j >= 0 && static_cast<size_t>(j) < mass.size()) got += mass[static_cast<size_t>(j)];
  return got / total;
}

std::vector<int32_t> oracle_topk(std::span<const double> mass, int64_t first, int64_t end,
                                 int64_t k) {
  end = std::min<int64_t>(end, static_cast<int64_t>(mass.size()));
  std::vector<int32_t> idx;
  for (int64_t j = std::max<int64_t>(0, first); j < end; ++j)
    idx.push_back(static_cast<int32_t>(j));
  const auto kk = static_cast<size_t>(std::clamp<int64_t>(k, 0, static_cast<int64_t>(idx.size())));
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(kk), idx.end(),
                    [&](int32_t a, int32_t b) {
                      const double ma = mass[static_cast<size_t>(a)],
                                   mb = mass[static_cast<size_t>(b)];
                      return ma != mb ? ma > mb : a < b;
                    });
  idx.resize(kk);
  std::sort(idx.begin(), idx.end());
  return idx;
}

double selection_overlap(std::span<const int32_t> a, std::span<const int32_t> b) {
  if (a.empty() && b.empty()) return 1.0;
  if (a.empty() || b.empty()) return 0.0;
  std::vector<int32_t> x(a.begin(), a.end()), y(b.begin(), b.end()), both;
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  x.erase(std::unique(x.begin(), x.end()), x.end());
  y.erase(std::unique(y.begin(), y.end()), y.end());
  std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(std::min(x.size(), y.size()));
}

double qshare_retention(std::span<const int32_t> shared, std::span<const int32_t> own, int64_t k) {
  if (k <= 0) return 1.0;
  std::vector<int32_t> x(shared.begin(), shared.end()), y(own.begin(), own.end()), both;
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(k);
}

double kl_divergence(std::span<const double> p, std::span<const double> q) {
  const double sp = std::accumulate(p.begin(), p.end(), 0.0),
               sq = std::accumulate(q.begin(), q.end(), 0.0);
  double kl = 0;
  for (size_t j = 0; j < p.size() && j < q.size(); ++j) {
    const double pj = p[j] / sp, qj = q[j] / sq;
    if (pj <= 0) continue;
    if (qj <= 0) return std::numeric_limits<double>::infinity();
    kl += pj * std::log(pj / qj);
  }
  return std::max(0.0, kl);
}

std::vector<double> softmax(std::span<const double> scores) {
  std::vector<double> out(scores.begin(), scores.end());
  if (out.empty()) return out;
  const double mx = *std::max_element(out.begin(), out.end());
  double sum = 0;
  for (auto& x : out) sum += (x = std::exp(x - mx));
  for (auto& x : out) x /= sum;
  return out;
}

WindowTradeoff window_tradeoff(std::span<const double> mass, std::span<const int32_t> selected,
                               int64_t eligible_end, int64_t window_first, int64_t window_end) {
  WindowTradeoff w;
  const double total = std::accumulate(mass.begin(), mass.end(), 0.0);
  if (total <= 0) return w;
  window_first = std::max<int64_t>(0, window_first);
  window_end = std::min<int64_t>(window_end, static_cast<int64_t>(mass.size()));
  for (int64_t j = window_first; j < window_end; ++j) w.window_mass += mass[static_cast<size_t>(j)];
  // The best eligible chunks that the selection left out, as many as the window has pages.
  std::vector<double> left;
  std::vector<char> taken(mass.size(), 0);
  for (int32_t j : selected)
    if (j >= 0 && static_cast<size_t>(j) < mass.size()) taken[static_cast<size_t>(j)] = 1;
  for (int64_t j = 0; j < std::min<int64_t>(eligible_end, static_cast<int64_t>(mass.size())); ++j)
    if (!taken[static_cast<size_t>(j)]) left.push_back(mass[static_cast<size_t>(j)]);
  const auto n = static_cast<size_t>(
      std::clamp<int64_t>(window_end - window_first, 0, static_cast<int64_t>(left.size())));
  std::partial_sort(left.begin(), left.begin() + static_cast<std::ptrdiff_t>(n), left.end(),
                    std::greater<>());
  for (size_t i = 0; i < n; ++i) w.extra_mass += left[i];
  w.window_mass /= total;
  w.extra_mass /= total;
  return w;
}

}  // namespace cisa
