// server/metrics.h — the numbers `GET /metrics` serves, in Prometheus' text format: gauges the
// scheduler publishes after every step, counters and latency histograms updated as tokens leave.
// Thread-safe: the scheduler writes, HTTP threads read.
//
//   cisa::server::Metrics m;
//   m.observe_ttft(0.120);                       // seconds, at a request's first token
//   m.observe_itl(0.031);                        // seconds between two tokens of one request
//   m.set_gauges({.running = 3, .waiting = 1, .kv_pages_used = 96, .kv_pages_free = 160});
//   std::string text = m.render();               // "# TYPE cisa_requests_running gauge\n..."
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace cisa::server {

// What the scheduler knows after a step.
struct SchedulerGauges {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_used = 0, kv_pages_free = 0;
  // Model::stats(): global-layer K/V pages read and the dense count for the same rows (equal
  // under dense attention; CISA reads a share of them).
  int64_t global_pages_read = 0, global_pages_dense = 0;
};

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // "name_bucket{le="…"} n" lines, then name_sum and name_count.
  void render(const std::string& name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // one per bound, plus +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

enum class RequestOutcome { kStop, kLength, kCancelled, kError, kRejected };

class Metrics {
 public:
  Metrics();
  void set_gauges(const SchedulerGauges& g);
  SchedulerGauges gauges() const;
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  void add_prompt_tokens(int64_t n);
  void add_generated_tokens(int64_t n);
  void count_request(RequestOutcome o);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  SchedulerGauges g_;
  Histogram ttft_, itl_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  std::array<int64_t, 5> outcomes_{};
};

}  // namespace cisa::server
