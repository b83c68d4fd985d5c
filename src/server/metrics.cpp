// Prometheus text exposition of the server's counters (metrics.h).
#include "server/metrics.h"

#include <cstdio>

namespace cisa::server {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void metric(std::string* out, const char* name, const char* type, const char* help, double v) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
          name + " " + number(v) + "\n";
}

// Latency buckets from 1 ms to 60 s.
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string* out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    *out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics() : ttft_(latency_bounds()), itl_(latency_bounds()) {}

void Metrics::set_gauges(const SchedulerGauges& g) {
  std::lock_guard<std::mutex> lk(mu_);
  g_ = g;
}
SchedulerGauges Metrics::gauges() const {
  std::lock_guard<std::mutex> lk(mu_);
  return g_;
}
void Metrics::observe_ttft(double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  ttft_.observe(seconds);
}
void Metrics::observe_itl(double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(seconds);
}
void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  prompt_tokens_ += n;
}
void Metrics::add_generated_tokens(int64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  generated_tokens_ += n;
}
void Metrics::count_request(RequestOutcome o) {
  std::lock_guard<std::mutex> lk(mu_);
  ++outcomes_[static_cast<size_t>(o)];
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out;
  metric(&out, "cisa_requests_running", "gauge", "Requests holding a KV sequence.",
         double(g_.running));
  metric(&out, "cisa_requests_waiting", "gauge", "Requests queued for a KV sequence.",
         double(g_.waiting));
  metric(&out, "cisa_kv_pages_used", "gauge", "KV cache pages in use.", double(g_.kv_pages_used));
  metric(&out, "cisa_kv_pages_free", "gauge", "KV cache pages free.", double(g_.kv_pages_free));
  metric(&out, "cisa_prompt_tokens_total", "counter", "Prompt tokens admitted.",
         double(prompt_tokens_));
  metric(&out, "cisa_generation_tokens_total", "counter", "Tokens generated.",
         double(generated_tokens_));
  out +=
      "# HELP cisa_requests_total Requests ended, by outcome.\n"
      "# TYPE cisa_requests_total counter\n";
  const char* const names[] = {"stop", "length", "cancelled", "error", "rejected"};
  for (size_t i = 0; i < outcomes_.size(); ++i)
    out += std::string("cisa_requests_total{outcome=\"") + names[i] + "\"} " +
           std::to_string(outcomes_[i]) + "\n";
  metric(&out, "cisa_global_pages_read_total", "counter",
         "K/V pages read by global-layer attention (SPEC 8 traffic model).",
         double(g_.global_pages_read));
  metric(&out, "cisa_global_pages_dense_total", "counter",
         "K/V pages dense attention would read for the same rows.", double(g_.global_pages_dense));
  metric(&out, "cisa_attention_read_fraction", "gauge",
         "Global-layer pages read as a share of dense (1 under dense attention).",
         g_.global_pages_dense > 0 ? double(g_.global_pages_read) / double(g_.global_pages_dense)
                                   : 1.0);
  out +=
      "# HELP cisa_time_to_first_token_seconds From arrival to the first token.\n"
      "# TYPE cisa_time_to_first_token_seconds histogram\n";
  ttft_.render("cisa_time_to_first_token_seconds", &out);
  out +=
      "# HELP cisa_inter_token_latency_seconds Between two tokens of one request.\n"
      "# TYPE cisa_inter_token_latency_seconds histogram\n";
  itl_.render("cisa_inter_token_latency_seconds", &out);
  return out;
}

}  // namespace cisa::server
