// cisa/cpu/selection.h — CISA page selection on the CPU (SPEC §3, §4): scores against the
// representative cache, deterministic top-k, and the full selection step that fills page lists
// with sinks, selected chunks, window and current-page tail. The rules themselves (parameters,
// eligible chunks, query groups, list layout) are the core's, in plan.h.
//
//   cisa::SelectionParams p{.budget = 256, .window = 32, .qshare = 16};
//   cisa::PageLists lists;
//   CISA_RETURN_IF_ERROR(cisa::select_pages(*cache, layer, batch, index_q, p, &pool, &lists));
//   // index_q: [rows][num_kv_heads][head_dim] f32, the index query of every query position
//   //          (after the model's q-norm and RoPE), packed like the batch's queries.
//
// For a group P = {a … b}: eligible E_a = {j : j < c(a) − W} minus the sink pages. If |E_a| ≤ k
// the group attends to every page up to c(b) (dense path, no scoring). Otherwise it attends to
// sinks ∪ top-k(E_a) ∪ {c(a) − W … c(b)}. A block whose early positions are dense and later ones
// sparse is split: its dense prefix is one group, the sparse suffix is cut into groups of G from
// its first position.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/plan.h"
#include "cisa/core/status.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/kv_cache.h"

namespace cisa {

// Scores of chunks [first_chunk, first_chunk + n) of one sequence for one KV group:
// s_j = q·r_j/√d (mean representative) or Σ_i max(q_i·min_i, q_i·max_i)/√d (quest).
// Chunks must be full pages of a representative layer. q: [head_dim] f32.
void score_chunks(const PagedKvCache& cache, int layer, std::span<const int32_t> block_table,
                  int kv_head, const float* q, int64_t first_chunk, int64_t n, float* scores);

// Indices (offsets into `scores`) of the k largest scores, larger score first, ties to the smaller
// index; NaN ranks below every number. Returned in ascending index order. k ≥ n returns all.
// `scratch` (2n entries: rank keys and candidates) is reused across calls to avoid allocation.
void select_topk(std::span<const float> scores, int64_t k, std::vector<int32_t>* out,
                 std::vector<int32_t>* scratch);

// Selection reuse state (plan.h's rule, docs/design.md): per sequence, CISA layer and KV group,
// the chunks of the last fresh decode selection. One per backend; forget a sequence when it is
// released (its SeqId may be handed out again).
struct ReusedSelection {
  std::vector<int32_t> chunks;  // S: absolute chunk indices, ascending (k of them)
  int64_t selected_at = -1;     // position a0 of the decode row whose top-k chose S
  int64_t last_used = -1;       // position of the last decode row whose list held S
  SelectionParams params;       // the parameters S was chosen under
  double unselected_mass = 0;   // kMass: u0, the softmax mass outside S at a0 (plan.h); 0
                                // when S was chosen under another check
};
class SelectionReuse {
 public:
  // The states of (seq, layer), one per KV group, made empty on first use. The span stays valid
  // until release() of seq or clear().
  std::span<ReusedSelection> states(SeqId seq, int layer, int num_kv_heads);
  void release(SeqId seq);
  void clear();
  SelectionReuseStats stats;

 private:
  std::unordered_map<uint64_t, std::vector<ReusedSelection>> map_;  // key: seq << 32 | layer
};

// True when a newly eligible chunk outranks the lowest-ranked reused chunk under top-k's ranking
// (larger score first, ties to the smaller chunk index, NaN lowest): kNewChunks' failure. Every
// newly eligible chunk has a larger index than every reused one, so it must score strictly higher.
bool new_chunk_outranks(std::span<const float> reused_scores, std::span<const float> new_scores);

// Σ e^{s − shift} over scores (non-finite scores weigh nothing): the sums of plan.h's kMass check,
// all taken with one shift (the largest finite score of the check) so that they compare.
double exp_score_sum(std::span<const float> scores, float shift);
// The largest finite score, −inf when there is none.
float max_finite_score(std::span<const float> scores);

// Per-thread scratch of select_pages (index query, scores, top-k). Reused across calls, so a
// steady decode loop allocates nothing; optional.
class SelectionWorkspace {
 public:
  struct Thread {
    std::vector<float> qbar, scores;
    std::vector<int32_t> top, tmp;
  };
  std::vector<Thread> threads;
  // Decode (fewer lists than threads): index queries and scores of every list, scored in slices.
  std::vector<float> list_qbar, list_scores;
  std::vector<int64_t> score_offsets;
  // Selection reuse: per list, its state (null: not a reuse candidate) and what it did.
  std::vector<ReusedSelection*> reuse_state;
  std::vector<uint8_t> reuse_action;
};

// The full selection step: query groups, index queries (mean or last over the group), scores,
// top-k, and page lists with window, tail and sinks. Uses `pool` for (group, KV group) tasks.
// With `reuse` and p.reuse_steps > 1, decode rows (entries of one position) keep or replace the
// selection held in `reuse` by plan.h's reuse rule; without, or with r = 1, every list selects.
Status select_pages(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                    const float* index_q, const SelectionParams& p, ThreadPool* pool,
                    PageLists* out, SelectionWorkspace* ws = nullptr,
                    SelectionReuse* reuse = nullptr);

}  // namespace cisa
