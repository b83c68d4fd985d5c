#include "cisa/core/membw.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

namespace cisa {

namespace {

float sum_slice(const float* p, int64_t n) {
  float acc[16] = {};
  for (int64_t i = 0; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += p[i + l];
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

}  // namespace

double measure_read_bandwidth(ThreadPool& pool, int64_t bytes, int passes) {
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);  // touched: pages are resident
  const int threads = pool.num_threads();
  std::vector<float> sink(static_cast<size_t>(threads) * 16, 0.0f);
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(threads, [&](int64_t t, int) {
      const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
      sink[static_cast<size_t>(t) * 16] += sum_slice(buf.data() + lo, hi - lo);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

CacheFlusher::CacheFlusher(int64_t bytes) : buf_(static_cast<size_t>(bytes), 1) {}

void CacheFlusher::flush(ThreadPool& pool) {
  // Reads (not writes) the buffer: the caches end up full of clean lines of our own, as they
  // would be after other layers' work, without dirty lines whose write-back would be charged to
  // the next timed run.
  const auto bytes = static_cast<int64_t>(buf_.size());
  const int threads = pool.num_threads();
  std::vector<int64_t> sums(static_cast<size_t>(threads) * 8, 0);
  pool.parallel_for(threads, [&](int64_t t, int) {
    const int64_t lo = bytes * t / threads, hi = bytes * (t + 1) / threads;
    int64_t acc = 0;
    for (int64_t i = lo; i < hi; i += 64) acc += buf_[static_cast<size_t>(i)];
    sums[static_cast<size_t>(t) * 8] = acc;
  });
  for (int64_t v : sums) pass_ += static_cast<uint64_t>(v);
}

}  // namespace cisa
