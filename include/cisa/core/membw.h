// cisa/core/membw.h — measures this machine's memory read bandwidth, the ceiling that memory-bound
// attention (decode) is judged against.
//
//   cisa::ThreadPool pool(0);
//   double gbs = cisa::measure_read_bandwidth(pool, 1 << 30, 5);   // GB/s, best of 5 passes
#pragma once

#include <cstdint>
#include <vector>

#include "cisa/core/thread_pool.h"

namespace cisa {

// Streams `bytes` of memory (larger than the last-level cache) with every pool thread summing its
// slice; returns the best of `passes` in GB/s (10^9 bytes per second).
double measure_read_bandwidth(ThreadPool& pool, int64_t bytes, int passes);

// Evicts the caches before a timed run by writing `bytes` of its own scratch memory, allocated
// once (so no page faults land in the measurement loop).
class CacheFlusher {
 public:
  explicit CacheFlusher(int64_t bytes = 256ll << 20);
  void flush(ThreadPool& pool);

 private:
  std::vector<char> buf_;
  uint64_t pass_ = 0;
};

}  // namespace cisa
