// Calibration by attention-distribution matching (SPEC §6), independent of any model: the scores
// of one sampled position, their means over positions, the winner, and position sampling.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cisa/core/diagnostics.h"
#include "cisa/model/indexer.h"

namespace cisa {

const char* calib_criterion_name(CalibCriterion c) {
  return c == CalibCriterion::kKl ? "kl" : "mass";
}

Result<CalibCriterion> parse_calib_criterion(const std::string& s) {
  if (s == "kl") return CalibCriterion::kKl;
  if (s == "mass") return CalibCriterion::kMass;
  return invalid_argument("unknown calibration criterion '" + s + "' (expected kl or mass)");
}

Result<PositionScores> score_position(std::span<const double> mass, std::span<const float> reps,
                                      std::span<const float> index_q, int d, int64_t k) {
  const size_t n = mass.size();
  if (d < 1 || k < 1) return invalid_argument("score_position: d and k must be >= 1");
  if (n == 0 || reps.size() != n * static_cast<size_t>(d))
    return invalid_argument("score_position: " + std::to_string(reps.size()) +
                            " representative values for " + std::to_string(n) +
                            " chunks of dimension " + std::to_string(d));
  if (index_q.empty() || index_q.size() % static_cast<size_t>(d) != 0)
    return invalid_argument("score_position: index queries are not a whole number of d-vectors");
  const double total = std::accumulate(mass.begin(), mass.end(), 0.0);
  if (!(total > 0) || !std::isfinite(total))
    return invalid_argument("score_position: chunk mass must be positive and finite");
  for (double m : mass)
    if (!(m >= 0)) return invalid_argument("score_position: negative or NaN chunk mass");

  const size_t C = index_q.size() / static_cast<size_t>(d);
  PositionScores out;
  out.kl.resize(C);
  out.captured.resize(C);
  out.oracle = captured_mass(mass, oracle_topk(mass, 0, static_cast<int64_t>(n), k));
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> s(n);
  for (size_t c = 0; c < C; ++c) {
    const float* q = index_q.data() + c * static_cast<size_t>(d);
    double smax = -std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < n; ++j) {
      const float* r = reps.data() + j * static_cast<size_t>(d);
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * static_cast<double>(r[i]);
      s[j] = dot * inv_sqrt_d;
      smax = std::max(smax, s[j]);
    }
    // log π_j = s_j − logsumexp(s); KL(p ‖ π) = Σ_j p_j (log p_j − log π_j).
    double z = 0;
    for (size_t j = 0; j < n; ++j) z += std::exp(s[j] - smax);
    const double lse = smax + std::log(z);
    double kl = 0;
    for (size_t j = 0; j < n; ++j) {
      const double pj = mass[j] / total;
      if (pj > 0) kl += pj * (std::log(pj) - (s[j] - lse));
    }
    out.kl[c] = std::max(0.0, kl);
    // top-k by score with the selection's tie rule (larger first, then the smaller chunk).
    out.captured[c] = captured_mass(mass, oracle_topk(s, 0, static_cast<int64_t>(n), k));
  }
  return out;
}

GroupAccumulator::GroupAccumulator(int layer, int kv_group, std::vector<int> candidate_heads) {
  acc_.layer = layer;
  acc_.kv_group = kv_group;
  for (int h : candidate_heads) acc_.candidates.push_back({.head = h});
}

void GroupAccumulator::add(const PositionScores& s) {
  const size_t C = std::min(s.kl.size(), acc_.candidates.size());
  for (size_t c = 0; c < C; ++c) {
    acc_.candidates[c].kl += s.kl[c];
    acc_.candidates[c].captured += s.captured[c];
  }
  oracle_sum_ += s.oracle;
  acc_.positions += 1;
}

GroupCalibration GroupAccumulator::result(CalibCriterion criterion) const {
  GroupCalibration g = acc_;
  const double n = g.positions > 0 ? static_cast<double>(g.positions) : 1.0;
  for (CandidateScore& c : g.candidates) {
    c.kl /= n;
    c.captured /= n;
  }
  g.oracle = oracle_sum_ / n;
  g.chosen = 0;
  for (size_t c = 1; c < g.candidates.size(); ++c) {
    const CandidateScore& a = g.candidates[c];
    const CandidateScore& best = g.candidates[static_cast<size_t>(g.chosen)];
    if (criterion == CalibCriterion::kKl ? a.kl < best.kl : a.captured > best.captured)
      g.chosen = static_cast<int>(c);
  }
  return g;
}

std::vector<int64_t> sample_positions(int64_t n_tokens, int64_t count, const CalibSettings& s,
                                      uint64_t seed) {
  // c(t) − W − sinks ≥ 4k  ⇔  t ≥ (W + sinks + 4k)·B.
  const int64_t t_min = (s.window + s.sink_pages + 4 * s.budget) * s.page_size;
  std::vector<int64_t> out;
  if (count < 1 || n_tokens <= t_min) return out;
  const double width = static_cast<double>(n_tokens - t_min) / static_cast<double>(count);
  uint64_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    // splitmix64: a jitter in [0, 1) per stratum.
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    const int64_t t = t_min + std::min(n_tokens - t_min - 1,
                                       static_cast<int64_t>((static_cast<double>(i) + u) * width));
    if (out.empty() || t > out.back()) out.push_back(t);
  }
  return out;
}

}  // namespace cisa
