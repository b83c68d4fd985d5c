// Scoring (SPEC §3): the index query of each selecting list (mean of its group's index queries,
// or the last one) and s_j = q̄·r_j/√d (quest: Σ_i max(q̄_i·min_i, q̄_i·max_i)/√d) for every
// eligible chunk. Streams each (entry, KV group)'s representatives once for all of its lists.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"

namespace cisa::cuda::detail {

// index_q: [rows][num_kv_heads][head_dim] f32; qbar: [num_lists][head_dim] f32 and qsplit:
// [num_lists][3][head_dim] bf16, the exact terms lo, mid, hi with qbar = hi + mid + lo (both
// written for the lists in sel_lists [num_sel]).
cudaError_t launch_index_queries(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                 const float* index_q, int num_kv_heads, int head_dim, float* qbar,
                                 uint16_t* qsplit, cudaStream_t stream);

// reps: the representatives (plan_types.h RepArgs); scores: written at each list's score_begin.
// keep: null, or a flag per list (reuse.cuh): a stream whose first list has a non-zero flag is
// a decode list keeping its earlier selection and is not scored (such a stream has one list).
// index_q: null (the kernels read qbar / qsplit, written by launch_index_queries or the reuse
// decision), or the packed index queries of launch_index_queries, from which the few-list
// kernel computes each list's q̄ itself (bit for bit the same), saving that launch; only where
// score_takes_index_queries says so (≤ kScoreFewLists lists per stream, 16-byte aligned).
// tiles_per_block: the few-list kernel's tiles of kScoreFewChunks chunks per block (≥ 1; the plan's
// score_tiles_per_block).
bool score_takes_index_queries(int32_t max_lists, const float* index_q);
cudaError_t launch_score(const ScoreStream* streams, int64_t num_streams, int32_t max_span,
                         int32_t max_lists, const ListDesc* lists, const int32_t* block_pages,
                         const RepArgs& reps, const float* qbar, const uint16_t* qsplit,
                         const float* index_q, int num_kv_heads, int head_dim, bool quest,
                         int tiles_per_block, float* scores, const int32_t* keep,
                         cudaStream_t stream);

}  // namespace cisa::cuda::detail
