#include "cisa/core/traffic.h"

#include <algorithm>
#include <string>

namespace cisa {

namespace {

Status check_range(const char* what, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return Status::Ok();
  return invalid_argument(std::string(what) + " must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "] (got " + std::to_string(v) + ")");
}

// Σ_{t<n} floor(t/B) and Σ_{t<n} (t mod B + 1), exactly as the per-position sums, in closed form.
double sum_page_index(int64_t n, int64_t B) {
  const double q = static_cast<double>(n / B), r = static_cast<double>(n % B);
  return static_cast<double>(B) * q * (q - 1) / 2 + q * r;
}
double sum_tail(int64_t n, int64_t B) {
  const double q = static_cast<double>(n / B), r = static_cast<double>(n % B);
  const double b = static_cast<double>(B);
  return q * b * (b + 1) / 2 + r * (r + 1) / 2;
}

}  // namespace

Status validate_traffic_params(const TrafficParams& p) {
  CISA_RETURN_IF_ERROR(check_range("context N", p.context, 1, kMaxTrafficContext));
  CISA_RETURN_IF_ERROR(check_range("budget k", p.budget, 1, kMaxTrafficPages));
  CISA_RETURN_IF_ERROR(check_range("window W", p.window, 0, kMaxTrafficPages));
  CISA_RETURN_IF_ERROR(check_range("QShare G", p.qshare, 1, kMaxTrafficPages));
  CISA_RETURN_IF_ERROR(check_range("page size B", p.page, 1, kMaxTrafficPageSize));
  CISA_RETURN_IF_ERROR(check_range("head_dim d", p.head_dim, 1, kMaxTrafficHeadDim));
  return Status::Ok();
}

double dense_elements(int64_t t, const TrafficParams& p) {
  // Position t attends to tokens 0 … t.
  return 2.0 * static_cast<double>(t + 1) * static_cast<double>(p.head_dim);
}

double cisa_elements(int64_t t, const TrafficParams& p, int64_t qshare, bool with_window_tail) {
  const int64_t eligible = t / p.page - p.window;
  if (eligible <= p.budget) return dense_elements(t, p);
  const double d = static_cast<double>(p.head_dim);
  const double tail = static_cast<double>(t % p.page + 1);
  const double B = static_cast<double>(p.page);
  const double tokens = static_cast<double>(p.budget) * B +
                        (with_window_tail ? static_cast<double>(p.window) * B + tail : 0.0);
  return 2.0 * d * tokens + static_cast<double>(eligible) * d / static_cast<double>(qshare);
}

double nominal_compression(const TrafficParams& p) {
  return static_cast<double>(p.context) /
         (static_cast<double>(p.budget) * static_cast<double>(p.page));
}

// With kB ≥ N (ρ ≥ 1) every position has |E_t| ≤ k and reads as dense: the ratio is 1, where the
// closed forms (derived for ρ < 1) would go below 1 or negative.
double ceiling_ratio(const TrafficParams& p, int64_t qshare) {
  const double rho = 1.0 / nominal_compression(p);
  if (rho >= 1.0) return 1.0;
  return 1.0 / (rho + 1.0 / (2.0 * static_cast<double>(p.page) * static_cast<double>(qshare)));
}

double prefill_ceiling_ratio(const TrafficParams& p, int64_t qshare) {
  const double rho = 1.0 / nominal_compression(p);
  if (rho >= 1.0) return 1.0;
  return 1.0 / (rho * (2.0 - rho) + (1.0 - rho * rho) / (2.0 * static_cast<double>(p.page) *
                                                         static_cast<double>(qshare)));
}

TrafficReport attention_traffic(const TrafficParams& p) {
  TrafficReport r;
  const int64_t N = p.context;
  auto point = [&](int64_t t, int64_t g) {
    return TrafficPoint{dense_elements(t, p), cisa_elements(t, p, g, true),
                        cisa_elements(t, p, g, false)};
  };
  r.end = point(N - 1, p.qshare);
  r.decode = point(N, 1);
  // Σ over t = 0 … N−1 of point(t, G), in closed form (so N = 2^40 takes no longer than 2^10):
  // positions before t0 = (k + W + 1)·B have |E_t| ≤ k and read as dense; from t0 on each reads
  // 2d·kB (+ 2d·(WB + τ) with window and tail) plus (c(t) − W)·d/G representatives.
  const double d = static_cast<double>(p.head_dim), B = static_cast<double>(p.page);
  const int64_t t0 = std::min(N, (p.budget + p.window + 1) * p.page);
  const double n_sparse = static_cast<double>(N - t0);
  const double dense_head = d * static_cast<double>(t0) * static_cast<double>(t0 + 1);
  const double reps = (sum_page_index(N, p.page) - sum_page_index(t0, p.page) -
                       static_cast<double>(p.window) * n_sparse) *
                      d / static_cast<double>(p.qshare);
  const double selected = 2 * d * static_cast<double>(p.budget) * B * n_sparse;
  const double window_tail =
      2 * d *
      (static_cast<double>(p.window) * B * n_sparse + sum_tail(N, p.page) - sum_tail(t0, p.page));
  r.prefill.dense = d * static_cast<double>(N) * static_cast<double>(N + 1);
  r.prefill.cisa = dense_head + selected + window_tail + reps;
  r.prefill.cisa_no_window = dense_head + selected + reps;
  r.nominal = nominal_compression(p);
  r.ceiling_end = ceiling_ratio(p, p.qshare);
  r.ceiling_decode = ceiling_ratio(p, 1);
  r.ceiling_prefill = prefill_ceiling_ratio(p, p.qshare);
  return r;
}

}  // namespace cisa
