// Top-k per selecting list (SPEC §3) with the spec's total order — larger score first, NaN below
// every number, then the smaller chunk index — fused with writing the selected part of the page
// list (physical page IDs in ascending logical order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"

namespace cisa::cuda::detail {

// A cluster of blocks per list when there are at most kTopkClusterMaxLists lists and the longest
// eligible range of a selecting list is at least cluster_min_scores (max_scores: the plan's bound
// on it); else one block per list. keep: null, or a flag per list (reuse.cuh); flagged lists
// keep their earlier selection and are skipped.
cudaError_t launch_topk(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                        int64_t max_scores, int64_t cluster_min_scores, const float* scores,
                        const int32_t* block_pages, int32_t* pages, int32_t* chunks,
                        const int32_t* keep, cudaStream_t stream);

}  // namespace cisa::cuda::detail
