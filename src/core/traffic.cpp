#include "cisa/traffic.h"

#include <string>

namespace cisa {

Status validate_traffic_params(const TrafficParams& p) {
  if (p.context <= 0) return invalid_argument("context must be positive (got " + std::to_string(p.context) + ")");
  if (p.budget <= 0) return invalid_argument("budget k must be positive (got " + std::to_string(p.budget) + ")");
  if (p.window < 0) return invalid_argument("window W must be >= 0 (got " + std::to_string(p.window) + ")");
  if (p.qshare <= 0) return invalid_argument("QShare G must be >= 1 (got " + std::to_string(p.qshare) + ")");
  if (p.page <= 0) return invalid_argument("page size B must be positive (got " + std::to_string(p.page) + ")");
  if (p.head_dim <= 0) return invalid_argument("head_dim must be positive");
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
  const double tokens = static_cast<double>(p.budget * p.page) +
                        (with_window_tail ? static_cast<double>(p.window * p.page) + tail : 0.0);
  return 2.0 * d * tokens + static_cast<double>(eligible) * d / static_cast<double>(qshare);
}

double nominal_compression(const TrafficParams& p) {
  return static_cast<double>(p.context) / static_cast<double>(p.budget * p.page);
}

double ceiling_ratio(const TrafficParams& p, int64_t qshare) {
  const double rho = 1.0 / nominal_compression(p);
  return 1.0 / (rho + 1.0 / (2.0 * static_cast<double>(p.page * qshare)));
}

double prefill_ceiling_ratio(const TrafficParams& p, int64_t qshare) {
  const double rho = 1.0 / nominal_compression(p);
  return 1.0 / (rho * (2.0 - rho) + (1.0 - rho * rho) / (2.0 * static_cast<double>(p.page * qshare)));
}

TrafficReport attention_traffic(const TrafficParams& p) {
  TrafficReport r;
  const int64_t N = p.context;
  auto point = [&](int64_t t, int64_t g) {
    return TrafficPoint{dense_elements(t, p), cisa_elements(t, p, g, true), cisa_elements(t, p, g, false)};
  };
  r.end = point(N - 1, p.qshare);
  r.decode = point(N, 1);
  for (int64_t t = 0; t < N; ++t) {
    const TrafficPoint x = point(t, p.qshare);
    r.prefill.dense += x.dense;
    r.prefill.cisa += x.cisa;
    r.prefill.cisa_no_window += x.cisa_no_window;
  }
  r.nominal = nominal_compression(p);
  r.ceiling_end = ceiling_ratio(p, p.qshare);
  r.ceiling_decode = ceiling_ratio(p, 1);
  r.ceiling_prefill = prefill_ceiling_ratio(p, p.qshare);
  return r;
}

}  // namespace cisa
