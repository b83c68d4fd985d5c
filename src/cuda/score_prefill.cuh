// Prefill scoring kernels (score_prefill.cu), launched by score.cu's launch_score for streams of
// many lists with mean representatives at d = 64 or 128; the contract is launch_score's
// (score.cuh): scores at each list's score_begin, lists whose keep flag is set skipped.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"

namespace cisa::cuda::detail {

// grid and kernel from max_span and head_dim (64 or 128; the caller checks); qsplit: the index
// queries' three bf16 terms (launch_index_queries).
void launch_score_prefill(const ScoreStream* streams, int64_t num_streams, int32_t max_span,
                          const ListDesc* lists, const int32_t* block_pages, const RepArgs& reps,
                          const float* qbar, const uint16_t* qsplit, int num_kv_heads, int head_dim,
                          float inv_sqrt_d, float* scores, const int32_t* keep,
                          cudaStream_t stream);

}  // namespace cisa::cuda::detail
