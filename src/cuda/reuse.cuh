// Selection reuse across decode steps on the device (the rule: core/plan.h and docs/design.md;
// the state: cuda/backend.h ReuseState). Two kernels around scoring and top-k of one layer:
//
//   reuse_decide (the check, the index queries, the decision) → scores (kept lists skipped) →
//   top-k (kept lists skipped; it commits fresh selections) → [reuse_commit, `mass` only] →
//   unions
//
// reuse_decide (kCheckParts blocks per list, each a slice of the check's chunks; the list's last
// block merges them in order and decides) writes keep[list] for every selecting list (0 for
// lists that are not reuse candidates). A candidate keeps S iff the parameters S was chosen
// under equal the plan's, its row directly follows S's last use, S is younger than r steps and the
// new-chunks check passes: the chunks N that became eligible since S was chosen are scored with
// S under the row's index query, exactly as the decode score kernel scores them (same lanes,
// same order of operations, so a score here equals the score kernel's bit for bit), and the
// check fails iff some chunk of N outranks the lowest-ranked chunk of S. The check `mass` also
// scores the row's sample of E_{a0} (core/plan.h) and fails iff u1 > u0 + slack; the sums are
// fp64 with a running maximum carried through the blocks' reductions, so they need no second
// pass over the representatives. A kept list gets S's pages written into its selected part
// here, and its last use moved to the row.
// The fresh selection of every candidate that did not keep S is stored as its state by the top-k
// kernel as it writes it (TopkCommit), or under `mass` by reuse_commit after top-k, with its u0
// from the list's scores (one more read of them, spread over blocks).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cisa/cuda/reuse_state.h"
#include "plan_types.h"

namespace cisa::cuda::detail {

// core/plan.h's kReuseMassStride (backend.cpp asserts that they are equal).
inline constexpr int kReuseMassStrideDevice = 16;

// The plan's side of a reuse launch.
struct ReuseParams {
  int64_t budget, window, sink_pages, reuse_steps;
  int32_t check_new_chunks;  // ReuseCheck::kNewChunks or kMass
  int32_t check_mass;        // ReuseCheck::kMass
  double mass_slack;         // SelectionParams::reuse_mass_slack (check_mass only)
};

// The commit folded into a top-k launch (reuse_commit.cuh): st.chunks null for none (no reuse,
// or the check `mass`, whose commit is launch_reuse_commit after top-k).
struct TopkCommit {
  ReuseState st{};
  ReuseParams rp{};
  int32_t num_kv_heads = 0;
};

// Bytes of the partials buffer (the plan's d_reuse_partials) for num_sel selecting lists: the
// check and the commit's sums each spread a list over a fixed number of blocks, whose partial
// results the deciding (committing) block merges in order.
size_t reuse_partial_bytes(int64_t num_sel);

// One launch: the check (scoring S, N and under `mass` the sample, spread over blocks) and the
// decision, made by each list's last block to finish (tickets: a uint32 per selecting list,
// zero before the first launch and left zero by every launch). It also writes every selecting
// list's index query (qbar, qsplit: launch_index_queries' outputs), so with reuse the index-query
// launch is left out.
cudaError_t launch_reuse_decide(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                const int32_t* block_pages, const RepArgs& reps, bool quest,
                                const float* index_q, float* qbar, uint16_t* qsplit,
                                int num_kv_heads, int head_dim, const ReuseParams& rp,
                                const ReuseState& st, void* partials, uint32_t* tickets,
                                int32_t* keep, int32_t* pages, int32_t* chunks,
                                cudaStream_t stream);

// The commit under the check `mass` (the top-k kernels commit under the others): the sums of u0
// over the list's scores (the plan's score array), then S and ReuseInfo.
cudaError_t launch_reuse_commit(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                int num_kv_heads, const ReuseParams& rp, const ReuseState& st,
                                const int32_t* keep, const int32_t* chunks, const float* scores,
                                void* partials, cudaStream_t stream);

}  // namespace cisa::cuda::detail
