// cisa/core/diagnostics.h — selection diagnostics of SPEC §9 (the paper's appendix B.3) and the
// distribution comparisons of SPEC §6, as plain functions over per-chunk attention mass.
//
// The caller computes, from real activations, the dense attention mass of each chunk for one
// (layer, KV group, position): p_j = Σ_{h∈H_g} Σ_{s∈chunk j} α_{h,t,s} (chunk_mass() does this from
// per-token probabilities). Selections are lists of logical chunk indices.
//
//   std::vector<double> mass = cisa::chunk_mass(probs_of_each_head, page_size);
//   double got = cisa::captured_mass(mass, selected_chunks);          // ∈ [0, 1] of total mass
//   double best = cisa::captured_mass(mass, cisa::oracle_topk(mass, 0, n_eligible, k));
//   double keep = cisa::selection_overlap(S_group, S_position);        // |A∩B| / min(|A|, |B|)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cisa {

// Per-chunk mass from per-token attention probabilities of several heads (each span holds one
// head's probabilities over positions 0 … t). Chunk j sums positions jB … jB+B−1 over all heads.
std::vector<double> chunk_mass(std::span<const std::span<const double>> head_probs, int page_size);

// Σ of mass over the listed chunks (duplicates counted once), divided by the total mass.
double captured_mass(std::span<const double> mass, std::span<const int32_t> chunks);

// The k chunks of [first, end) with the largest mass (ties: smaller index), ascending.
std::vector<int32_t> oracle_topk(std::span<const double> mass, int64_t first, int64_t end,
                                 int64_t k);

// |A ∩ B| / min(|A|, |B|); 1 when both are empty.
double selection_overlap(std::span<const int32_t> a, std::span<const int32_t> b);

// QShare retention: |S_P ∩ S_t| / k.
double qshare_retention(std::span<const int32_t> shared, std::span<const int32_t> own, int64_t k);

// KL(p ‖ q) in nats over the same support, after normalising both; terms with p_j = 0 add 0.
// q_j = 0 where p_j > 0 gives +∞.
double kl_divergence(std::span<const double> p, std::span<const double> q);

// softmax of scores (stable, in double).
std::vector<double> softmax(std::span<const double> scores);

// Window against more selection: the mass of the W window pages [window_first, window_end)
// against the mass of the W best eligible chunks of [0, eligible_end) that `selected` left out.
struct WindowTradeoff {
  double window_mass = 0;  // captured by the window pages
  double extra_mass = 0;   // captured by spending the same pages on more selected chunks
};
WindowTradeoff window_tradeoff(std::span<const double> mass, std::span<const int32_t> selected,
                               int64_t eligible_end, int64_t window_first, int64_t window_end);

}  // namespace cisa
