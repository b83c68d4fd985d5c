// Paged attention over page lists (SPEC §5), dense and sparse alike: each thread block takes a
// tile of 16·WARPS query rows of one list (rows = the group's positions × the KV group's h_g
// heads, so one read of a page serves all of them) over a range of the list's pages, read in
// place from the paged pool with cp.async (no gather), Q·Kᵀ and P·V on the tensor cores
// (mma.m16n8k16 bf16, f32 accumulation), online softmax in f32. Lists split across blocks
// (decode) write partials that the merge kernel combines by log-sum-exp. Union tasks (v3) give
// each warp one small list of a union and read the union's pages once for all of them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"

namespace cisa::cuda::detail {

struct AttentionArgs {
  const uint16_t* k;        // [num_pages][num_kv_heads][16][head_dim] bf16
  const uint16_t* v;        // same
  const uint16_t* q;        // [rows][num_q_heads][head_dim] bf16, or null with q_f32
  const float* q_f32;       // the same in f32 (8-byte aligned), rounded to bf16 on load; or null
  const ListDesc* lists;    // [num_lists]
  const AttnTask* tasks;    // [num_tasks]
  const MergeTask* merges;  // [num_merges]
  const int32_t* pages;     // page lists: physical IDs
  const int32_t* chunks;    // page lists: logical chunk indices
  const int32_t* upages;    // union lists (union tasks): physical IDs
  const int32_t* uchunks;   // union lists: logical chunk indices
  const int32_t* umask;     // union lists: bit w = member w chose the page
  const int32_t* ucounts;   // [num_unions] entries of each union list
  float* out;               // [rows][num_q_heads][head_dim] f32
  float* lse;               // [rows][num_q_heads] f32 or nullptr
  float* partial_out;       // [partial rows][head_dim] f32
  float* partial_lse;       // [partial rows] f32
  // PlanOptions::fused_merge: one ticket per MergeTask (zero between launches), and the last
  // split block of each merge task merges its partials (no merge launch); null: launch_merge.
  uint32_t* merge_tickets;
  // Tasks a block runs, one after the other: block b takes tasks [b · n, b · n + n); a task
  // with rows = 0 is an unused slot (PlanOptions::even_shares). 1 (or 0): task b on block b.
  int tasks_per_block;
  // PlanOptions::sm_rates: num_sms + 1 counters (zero between launches); a block claims one of
  // the slots_per_sm slots of the SM it runs on (another SM's free slot when those are taken)
  // and runs that slot's tasks; the last block zeroes the counters. Null: slot blockIdx.x.
  uint32_t* sm_claims;
  int num_sms, slots_per_sm;
  // measure_sm_rates: [blocks][3] per launch, each block's SM, start and end (%globaltimer, ns),
  // written by the page-split instantiation of even shares (SH), which a launch with a clock
  // takes; null in every other launch.
  int64_t* block_clock;
  int num_kv_heads, num_q_heads, head_dim;
  int32_t window;  // sliding window in tokens, 0: none
  float scale;     // multiplies q·k
};

// warps: 4 or 8 (row tile 64 or 128). page_warps (1, 2 or 4; > 1 only with 4 warps, d ≤ 128 and
// no union tasks): groups of warps that split each tile's pages, for lists of ≤ 64/page_warps rows.
// unions: the tasks include union tasks (selects the kernel instantiation that handles them).
// With a.merge_tickets (page_warps > 1 only) the split merge runs inside this launch. pdl: a
// programmatic dependent of the previous kernel (pdl.cuh), else an ordinary launch
// (PlanOptions::attention_pdl).
cudaError_t launch_attention(const AttentionArgs& a, int64_t num_tasks, int warps, int page_warps,
                             bool unions, bool pdl, cudaStream_t stream);
// max_rows: the most rows of any merge task (the grid has one warp per row of the largest).
cudaError_t launch_merge(const AttentionArgs& a, int64_t num_merges, int max_rows,
                         cudaStream_t stream);

}  // namespace cisa::cuda::detail
