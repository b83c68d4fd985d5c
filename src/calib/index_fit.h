// index_fit.h — the fitted index query of calibration (docs/calibration.md, "A fitted index
// query"): a mix of the KV group's own query heads, one scaled rotation per head and RoPE
// frequency pair, fitted by weighted least squares so that its scores over the chunk
// representatives follow the log of the dense attention mass. Not public.
//
// The family: for head h and frequency pair i with channels (c1, c2), coefficients (α, β) act on
// the head's query as the complex number α + iβ: (A q)[c1] = α q[c1] − β q[c2],
// (A q)[c2] = β q[c1] + α q[c2]. A scaled rotation commutes with RoPE's rotation of the same pair,
// so Σ_h A_h RoPE_t(W_h x) = RoPE_t((Σ_h A_h W_h) x): the mix is one index projection W̃ that the
// engine runs like any other (mix_projection). It holds every head alone (α = 1 on that head) and
// the mean (α = 1/h_g on every head); it does not commute with a per-head q-norm, so models with
// q/k norms (Gemma 3) are not offered it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/core/status.h"

namespace cisa::calib {

// The channel pairs RoPE rotates together: (2i, 2i + 1) for kNorm, (i, i + d/2) for kNeox.
std::vector<std::array<int, 2>> rope_pairs(int d, RopeStyle style);

// Mix coefficients: [heads][d/2][2] (α, β per head and pair). mean_mix: α = 1/heads, β = 0.
std::vector<float> mean_mix(int heads, int d);

// out[d] = Σ_h A_h q_h for the heads' queries q ([heads][d], after RoPE or before: it commutes).
void apply_mix(std::span<const float> mix, const float* q_heads, int heads, int d, RopeStyle style,
               float* out);

// W̃ = Σ_h A_h W_h for the heads' projection rows (each [d][n_embd], row-major): [d][n_embd].
std::vector<float> mix_projection(std::span<const float> mix,
                                  std::span<const std::vector<float>> head_rows, int d,
                                  int64_t n_embd, RopeStyle style);

// Weighted least squares over sampled positions: the score z_j = (Σ_h A_h q_h)·r_j / √d of each
// eligible chunk j should equal y_j = log max(p_j, 0.01/n) up to a constant per position, with
// weight w_j = 1/n + p_j (p normalised over the n eligible chunks), so that both the chunks that
// hold the mass and the many that hold none are placed. solve() adds a ridge toward the mean mix,
// ridge × trace / parameters, and returns the coefficients.
class MixFit {
 public:
  MixFit(int heads, int d, RopeStyle style);
  // mass: [n] dense mass of the eligible chunks (any positive scale); reps: [n][d]; q_heads:
  // [heads][d] after RoPE. kInvalidArgument when the sizes disagree or the mass is not positive.
  Status add(std::span<const double> mass, std::span<const float> reps, const float* q_heads);
  // Positions added so far.
  int64_t positions() const { return positions_; }
  // kFailedPrecondition without positions; kInternal when the system is not positive definite.
  Result<std::vector<float>> solve(double ridge) const;
  // Sums another fit of the same shape into this one (folds of a cross-fit).
  void merge(const MixFit& other);

 private:
  int heads_, d_;
  std::vector<std::array<int, 2>> pairs_;
  int64_t positions_ = 0;
  std::vector<double> m_;  // [P][P], upper triangle accumulated
  std::vector<double> b_;  // [P]
};

}  // namespace cisa::calib
