// Representative update (SPEC §1): per listed full page and KV head, the mean of the page's 16
// keys (or the per-channel min, then max, for quest), summed in double and rounded to bf16 —
// bit-identical to PagedKvCache::update_rep.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cisa::cuda::detail {

// k:    [num_pages][num_kv_heads][16][head_dim] bf16
// reps: [num_pages][num_kv_heads][rep_width] bf16 (written)
// pages: [n] physical page IDs
cudaError_t launch_update_reps(const uint16_t* k, uint16_t* reps, const int32_t* pages, int64_t n,
                               int num_kv_heads, int head_dim, bool quest, cudaStream_t stream);

}  // namespace cisa::cuda::detail
