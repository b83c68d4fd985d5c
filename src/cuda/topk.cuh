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

// Whether launch_topk runs a cluster of blocks a list (keys in registers) rather than one block a
// list: at most tiles::kTopkClusterMaxLists lists, the longest of at least cluster_min_scores.
bool topk_register_clusters(int64_t num_sel, int64_t max_scores, int64_t cluster_min_scores);

// v6 (PlanOptions::topk_smem_cluster): a cluster of `cluster` blocks per list (1, 2, 4 or 8), each
// staging its slice of the list's keys in shared memory and selecting from there. The planner's
// cluster size for lists of at most max_scores eligible chunks: the smallest whose slice is at
// most tiles::kTopkSmemSliceKeys, 0 when even 8 blocks would hold more (the path does not apply).
int topk_smem_cluster(int64_t max_scores);
// Whether `cluster` blocks can hold a slice of such lists (a power of two up to 8, a slice of at
// most tiles::kTopkSmemMaxSliceKeys).
bool topk_smem_fits(int64_t max_scores, int cluster);
// Opts the kernel of that cluster size into slices up to tiles::kTopkSmemMaxSliceKeys (a function
// attribute, set by the planner: not a stream operation, so launches stay graph-capturable).
cudaError_t prepare_topk_smem(int cluster);
// The lists selected as launch_topk does, on the shared-memory path (prepare_topk_smem(cluster)
// first); cudaErrorInvalidValue when topk_smem_fits(max_scores, cluster) does not hold.
cudaError_t launch_topk_smem(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                             int64_t max_scores, int cluster, const float* scores,
                             const int32_t* block_pages, int32_t* pages, int32_t* chunks,
                             const int32_t* keep, cudaStream_t stream);

}  // namespace cisa::cuda::detail
