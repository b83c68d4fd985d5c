// Representative update (SPEC §1): per listed full page and KV head, the mean of the page's 16
// keys (or the per-channel min, then max, for quest), summed in double and rounded to bf16 —
// bit-identical to PagedKvCache::update_rep — or, with int8 representatives, rounded by
// core/rep_quant.h's rule to codes and one scale 2^e, stored as the byte e (the CPU cache holds
// code · 2^e).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cisa::cuda::detail {

// Where the update writes: bf16 values (2 bytes each), or int8 codes and their scale exponents.
struct RepArgsOut {
  uint8_t* data = nullptr;  // [num_pages][num_kv_heads][rep_width]
  int8_t* exps = nullptr;   // int8: [num_pages][num_kv_heads]
  bool int8 = false;
};

// k:     [num_pages][num_kv_heads][16][head_dim] bf16
// pages: [n] physical page IDs
cudaError_t launch_update_reps(const uint16_t* k, const RepArgsOut& reps, const int32_t* pages,
                               int64_t n, int num_kv_heads, int head_dim, bool quest,
                               cudaStream_t stream);

}  // namespace cisa::cuda::detail
