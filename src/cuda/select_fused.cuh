// Fused decode selection (SPEC §3): scoring and top-k of lists that are alone in their score
// stream (decode: one list per sequence and KV group) in one kernel. A cluster of C blocks per
// list; each block scores its slice of the eligible chunks into shared memory (and the score
// array, for download_scores), then the C blocks run topk_radix.cuh's select on those keys.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"

namespace cisa::cuda::detail {

// The cluster size for num_lists such lists whose longest eligible range is at most max_span
// chunks, with mean representatives of head_dim channels on a GPU of `sms` SMs: the largest
// power of two up to 16 that keeps num_lists · C blocks within one wave and whose slice keys fit
// the block's shared memory, where such a cluster can be resident; 0 where the fused path does
// not apply (another head_dim, a slice too long, or no cluster of that shape fits).
int fused_select_cluster(int64_t num_lists, int64_t max_span, int head_dim, int sms);

// Dynamic shared memory of one block: its slice's keys.
size_t fused_select_smem(int64_t max_span, int cluster);

// Scores (scores[L.score_begin + i]) and selects (the selected part of pages/chunks) every
// stream's one list; cluster from fused_select_cluster, which must have been called for these
// shapes first (it sets the kernel's shared-memory and cluster-size attributes).
cudaError_t launch_select_fused(const ScoreStream* streams, int64_t num_streams, int cluster,
                                int64_t max_span, const ListDesc* lists, const int32_t* block_pages,
                                const RepArgs& reps, const float* qbar, int num_kv_heads,
                                int head_dim, float* scores, int32_t* pages, int32_t* chunks,
                                cudaStream_t stream);

}  // namespace cisa::cuda::detail
