// cisa/core/traffic.h — the attention-traffic model of SPEC §8: elements of K, V and
// representatives read per query position, per KV group, per layer, dense against CISA.
//
//   dense(t) = 2·t·d
//   cisa(t)  = 2·d·(k·B + W·B + τ) + |E_t|·d / G      (τ ≤ B: tokens of the current page)
//   ceiling without window and tail, ρ = kB/t:     R = 1 / (ρ + 1/(2BG))
//   whole prefill of N tokens, ρ = kB/N:           R_full ≈ 1 / (ρ(2−ρ) + (1−ρ²)/(2BG))
//
//   cisa::TrafficParams p{.context = 1 << 20, .budget = 4096, .window = 0, .qshare = 4};
//   cisa::TrafficReport r = cisa::attention_traffic(p);   // r.end.ratio, r.prefill.ratio, …
#pragma once

#include <cstdint>

#include "cisa/core/plan.h"
#include "cisa/core/status.h"

namespace cisa {

struct TrafficParams {
  int64_t context = 0;  // N: tokens in the sequence (positions 0 … N−1)
  int64_t budget = 0;   // k
  int64_t window = 0;   // W pages
  int64_t qshare = 1;   // G for prefill (decode is always G = 1)
  int64_t page = 16;    // B
  int64_t head_dim = 128;
};

// Bounds of the model's inputs: within them every count is exact in int64 and no ratio overflows.
inline constexpr int64_t kMaxTrafficContext = int64_t{1} << 40;   // tokens
inline constexpr int64_t kMaxTrafficPages = kMaxSelectionPages;   // k, W, G (plan.h)
inline constexpr int64_t kMaxTrafficPageSize = int64_t{1} << 20;  // B
inline constexpr int64_t kMaxTrafficHeadDim = int64_t{1} << 16;   // d

// Errors name the parameter, its accepted range and the value given.
Status validate_traffic_params(const TrafficParams& p);

// Elements read by one query at position t (0-based), per KV group and layer.
double dense_elements(int64_t t, const TrafficParams& p);
// CISA with the model's window and tail; with_window_tail = false drops W·B and τ (the ceiling's
// assumption). Falls back to dense(t) when |E_t| ≤ k.
double cisa_elements(int64_t t, const TrafficParams& p, int64_t qshare, bool with_window_tail);

// Closed forms of SPEC §8; both ceilings are 1 when kB ≥ N (every position reads as dense).
double nominal_compression(const TrafficParams& p);            // N / (kB)
double ceiling_ratio(const TrafficParams& p, int64_t qshare);  // 1 / (ρ + 1/(2BG)), ρ = kB/N
double prefill_ceiling_ratio(const TrafficParams& p, int64_t qshare);  // R_full

struct TrafficPoint {
  double dense = 0;           // elements
  double cisa = 0;            // with window and tail
  double cisa_no_window = 0;  // without window and tail
  double ratio() const { return dense / cisa; }
  double ratio_no_window() const { return dense / cisa_no_window; }
};

struct TrafficReport {
  TrafficPoint end;      // the last prefill position (t = N−1), with QShare G
  TrafficPoint prefill;  // summed over every position of a prefill of N tokens, with QShare G
  TrafficPoint decode;   // one decode step at t = N (G = 1)
  double nominal = 0, ceiling_end = 0, ceiling_decode = 0, ceiling_prefill = 0;
};

// O(1) in N (the whole-prefill sums are closed forms). p must pass validate_traffic_params.
TrafficReport attention_traffic(const TrafficParams& p);

}  // namespace cisa
