// cisa/membw.h — measures this machine's memory read bandwidth, the ceiling that memory-bound
// attention (decode) is judged against.
//
//   cisa::ThreadPool pool(0);
//   double gbs = cisa::measure_read_bandwidth(pool, 1 << 30, 5);   // GB/s, best of 5 passes
#pragma once

#include <cstdint>

#include "cisa/thread_pool.h"

namespace cisa {

// Streams `bytes` of memory (larger than the last-level cache) with every pool thread summing its
// slice; returns the best of `passes` in GB/s (10^9 bytes per second).
double measure_read_bandwidth(ThreadPool& pool, int64_t bytes, int passes);

// Reads and writes `bytes` of scratch memory so that later reads start from DRAM, not cache.
void flush_caches(ThreadPool& pool, int64_t bytes = 256ll << 20);

}  // namespace cisa
