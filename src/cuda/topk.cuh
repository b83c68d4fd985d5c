// Top-k per selecting list (SPEC §3) with the spec's total order — larger score first, NaN below
// every number, then the smaller chunk index — fused with writing the selected part of the page
// list (physical page IDs in ascending logical order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"
#include "reuse.cuh"

namespace cisa::cuda::detail {

// A cluster of blocks per list when there are at most kTopkClusterMaxLists lists and the longest
// eligible range of a selecting list is at least cluster_min_scores (max_scores: the plan's bound
// on it); else one block per list. keep: null, or a flag per list (reuse.cuh); flagged lists
// keep their earlier selection and are skipped. commit: the reuse commit of the lists that
// selected afresh, made as the selection is written (reuse_commit.cuh; none by default).
cudaError_t launch_topk(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                        int64_t max_scores, int64_t cluster_min_scores, const float* scores,
                        const int32_t* block_pages, int32_t* pages, int32_t* chunks,
                        const int32_t* keep, const TopkCommit& commit, cudaStream_t stream);

// Whether launch_topk runs a cluster of blocks a list (keys in registers) rather than one block a
// list: at most tiles::kTopkClusterMaxLists lists, the longest of at least cluster_min_scores.
bool topk_register_clusters(int64_t num_sel, int64_t max_scores, int64_t cluster_min_scores);

// Prepares the cluster kernel (its shared-memory carveout, at plan time: not a stream operation)
// and returns how many of its clusters the device runs at once (0 if the query fails). More lists
// than that run in waves, each as long as one list's select.
int prepare_topk_clusters();

// v7 (PlanOptions::topk_staged, topk_staged.cu): one block a list, the keys' top 16 bits staged in
// shared memory, the scores read once (lists of at most tiles::kTopkStagedMaxKeys eligible
// chunks: topk_staged_fits). prepare_topk_staged sets the kernel's shared-memory attribute (at
// plan time: not a stream operation, so launches stay graph-capturable); launch_topk_staged
// selects as launch_topk does, cudaErrorInvalidValue where the lists do not fit.
bool topk_staged_fits(int64_t max_scores);
cudaError_t prepare_topk_staged(int64_t max_scores);
cudaError_t launch_topk_staged(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                               int64_t max_scores, const float* scores, const int32_t* block_pages,
                               int32_t* pages, int32_t* chunks, const int32_t* keep,
                               const TopkCommit& commit, cudaStream_t stream);

}  // namespace cisa::cuda::detail
