// cisa/cuda/backend.h — the Hopper (sm_90a) CUDA backend of the CISA attention path.
//
// The same method and data layout as the CPU engine (kv_cache.h, selection.h, attention.h), on
// device memory, for bf16 K/V with f32 accumulation, head_dim 64/128/256, page_size 16. This
// header has no CUDA includes: device memory is passed as raw pointers (shapes beside each one)
// and a stream as `void*` (a cudaStream_t; nullptr is the legacy default stream).
//
// Plan/run split: plan_dense / plan_sparse validate the batch on the host, cut it into query
// groups, size every page list and upload the launch metadata (they may allocate; they
// synchronise unless PlanOptions::upload_stream is set, and then only when a buffer grows).
// run_select and run_attention only enqueue kernels on the stream: no allocation, no host
// synchronisation, so a run step can be captured in a CUDA graph and replayed while
// plan_launch_key stays the same (the plan's metadata is read from device memory).
//
//   cisa::cuda::DeviceLayer layer{.k = d_k, .v = d_v, .reps = d_reps, .num_pages = P,
//                                 .num_kv_heads = 1, .head_dim = 128};
//   cisa::cuda::DeviceBlockTables tables{.pages = d_tables, .offsets = host_offsets};
//   cisa::cuda::Plan plan;
//   CISA_RETURN_IF_ERROR(cisa::cuda::plan_sparse(layer, tables, batch, /*num_q_heads=*/4,
//                                                 {.budget = 4096, .window = 128, .qshare = 32},
//                                                 &plan));
//   CISA_RETURN_IF_ERROR(cisa::cuda::run_select(plan, layer, d_index_q, stream));
//   CISA_RETURN_IF_ERROR(cisa::cuda::run_attention(plan, layer, d_q, 0.0f, d_out, d_lse, stream));
//
// BatchEntry::seq names a row of the block tables (not a PagedKvCache id). Every query position
// must have its K/V written; the partial last page has no representative.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/rep_quant.h"
#include "cisa/core/status.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/cpu/selection.h"
#include "cisa/cuda/reuse_state.h"

namespace cisa::cuda {

// True when a CUDA device of compute capability 9.0 or later is usable; `why` gets the reason
// when it is not (no driver, no device, older device).
bool device_available(std::string* why = nullptr);

// One layer of a paged KV cache in device memory (the layout of kv_cache.h, bf16 only).
struct DeviceLayer {
  const uint16_t* k = nullptr;  // device bf16 [num_pages][num_kv_heads][page_size][head_dim]
  const uint16_t* v = nullptr;  // device bf16 [num_pages][num_kv_heads][page_size][head_dim]
  // device [num_pages][num_kv_heads][rep_width]: bf16 values, or int8 codes (one byte each)
  // when rep_precision is kInt8 (core/rep_quant.h; the value is code · 2^rep_exps[page][head])
  void* reps = nullptr;
  int64_t num_pages = 0;
  int num_kv_heads = 1;
  int head_dim = 128;  // 64, 128 or 256
  int page_size = 16;  // must be 16 (the kernels' page tile)
  RepKind rep = RepKind::kMean;
  // device int8 [num_pages][num_kv_heads] (kInt8 only): e of the representative's scale 2^e,
  // in [−126, 127], or −128 for one with a non-finite value (its scores are NaN). One byte, not
  // an f32 scale: the decode scoring kernels read it beside the codes at random pages; on an H100
  // it tied the f32 scales at 4:1 and scored 4–5 % faster at 32:1 and 32:2 (docs/cuda-notes.md).
  int8_t* rep_exps = nullptr;
  RepPrecision rep_precision = RepPrecision::kNative;  // kNative (bf16) or kInt8; kFp8: CPU only
  int rep_width() const { return cisa::rep_width(rep, head_dim); }
};

// Block tables of all sequences, concatenated: sequence s owns the physical pages
// pages[offsets[s] … offsets[s+1]) (device), in logical order.
struct DeviceBlockTables {
  const int32_t* pages = nullptr;    // device int32 [offsets.back()]
  std::span<const int64_t> offsets;  // host copy of the CSR offsets, size num_seqs + 1
};

// Page lists and launch metadata in device memory, reused across steps (grow-only buffers).
class Plan {
 public:
  Plan();
  ~Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  struct Impl;
  Impl* impl() const { return impl_.get(); }
  // The query groups of the plan (host copy), as PageLists::groups would hold them.
  const std::vector<QueryGroup>& groups() const;
  int64_t total_pages() const;       // entries of all page lists
  int64_t selected_lists() const;    // lists that run scoring and top-k
  int64_t num_rows() const;          // packed query rows of the batch
  int64_t num_unions() const;        // KV-outer unions of small lists (PlanOptions::group_unions)
  int64_t reuse_candidates() const;  // decode lists that may keep an earlier selection
  // What a run of the plan launches, in words, for benchmark reports: the attention mainloop
  // (wgmma or mma.sync, rows a block, unions) and the top-k path. An option that did not apply
  // (wgmma_unions in a plan with 8-warp blocks, say) shows here as the path actually taken.
  std::string kernels() const;

 private:
  std::unique_ptr<Impl> impl_;
};

// The attention mainloop of a plan (A/B measurements; kAuto is the fast path).
enum class AttentionKernel {
  kAuto,     // wgmma where it applies (d = 128, full prefill tiles), mma.sync elsewhere
  kMma,      // every launch on the mma.sync kernel
  kWgmmaV5,  // wgmma tiles on the v4/v5 kernel instead of the warp-specialised one (v6)
};

// Planner switches (for ablations; the defaults are the fast path). `cisa bench layer` sets them
// from its flags (--attention-kernel, --blocks-per-sm, --ws-copy-warps).
struct PlanOptions {
  // Attend lists of at most 16 query rows (4:1 with G = 4) in unions of up to 4 consecutive
  // QShare groups of one sequence and KV group: one block, one warp per group, every page of the
  // union read once (KV-outer). Off: one block per list, pages re-read by every group.
  // plan_sparse only (dense plans have no unions).
  bool group_unions = true;
  // Union tasks at head dim 128 on the warp-specialised wgmma kernel's 64-row tile pairs (a warp
  // per member, the warpgroup's MMAs over every page of the union) instead of mma.sync (v10,
  // docs/cuda-notes.md): 4:1 prefill at G = 4 attends in 3.47 instead of 7.30 ms (H200,
  // 2026-12-05). kAuto only; off keeps union tasks on mma.sync (A/B runs). Tests run both
  // against the CPU engine.
  bool wgmma_unions = true;
  // A batch with a group over 64 query rows (a prefill chunk) and smaller ones (decode rows, small
  // QShare groups) runs two attention launches: the large groups in 128-row tiles, the others in
  // 64-row tiles (with their unions on wgmma where wgmma_unions allows). Off: every task takes
  // 128-row tiles once any group needs them. Off by default: in the one server workload measured
  // (H200, 2026-12-05, docs/cuda-model.md "Mixed tiles") it gained nothing.
  bool mixed_tiles = false;
  AttentionKernel attention_kernel = AttentionKernel::kAuto;
  // Target blocks per SM of the split-KV work decomposition; 0: tile_sizes.cuh's
  // (kBlocksPerSmTarget, kDecodeBlocksPerSm for page-split decode). At most 1024.
  int blocks_per_sm = 0;
  // Producer warps copying K/V in the warp-specialised kernel's 128-row tiles: 0 for
  // tile_sizes.cuh's kWsCopyWarps, or 1.
  int ws_copy_warps = 0;
  // Top-k with a cluster of blocks per list needs at most 64 selecting lists and a longest list
  // of at least this many eligible chunks; -1 for tile_sizes.cuh's kTopkClusterMinScores, 0 for
  // clusters at any length (tests of both paths).
  int topk_cluster_min_scores = -1;
  // Tiles of 512 eligible chunks each block of the decode scoring kernel (streams of at most 8
  // lists) scores, paying its setup once for all of them; 0 for tile_sizes.cuh's
  // kScoreFewTilesPerBlock (2). At most 1024 (A/B runs: `cisa bench layer --score-tiles n`).
  int score_tiles_per_block = 0;
  // Top-k v7 (topk_staged.cu): where top-k would run one block a list (many lists: prefill), the
  // same block reads its list's scores once and keeps the keys' top 16 bits in shared memory,
  // resolving only the keys tied with the threshold's top 16 bits from their full keys; lists of
  // up to 73,728 eligible chunks (longer ones keep the one-block kernel). On by default: prefill
  // top-k 15-25 % faster than the one-block kernel in every geometry of `cisa bench layer` (4:1
  // G = 4: 1.33-1.43 -> 1.09-1.22 ms; H200, 2026-12-05). Off: the one-block kernel (A/B runs).
  bool topk_staged = true;
  // Decode lists (each alone in its score stream: one per sequence and KV group) with mean
  // representatives can be scored and selected by one kernel, a cluster of blocks per list whose
  // keys stay in shared memory (select_fused.cu). 0 (default): off, the score kernel then the
  // top-k kernel, which measured faster in a whole decode step (docs/cuda-model.md: 97 against
  // 63 µs per layer at 2 x 1M, 54 against 56 at 16 x 128K, H200); -1: on, the cluster size chosen
  // per plan; 1, 2, 4, 8 or 16: that cluster size (tests and A/B runs; refused where the GPU
  // cannot run a plan's lists that way). Plans with other lists (prefill groups, Quest
  // representatives) take the two kernels whatever this says.
  int fused_select_cluster = 0;
  // Page-split (decode) plans whose lists split across blocks: the last block of each list's
  // splits merges their partials inside the attention launch instead of a merge launch after it
  // (the same merge arithmetic, so the same bits). Off by default: on an H100 it saved ~2 us of a
  // 4:1 decode launch and cost ~20 us at 32:1, where one block merges 32 rows at the end of the
  // grid (bench/results/decode_fixed_cost_2026-12-07/). Plans without page-split warps take the
  // merge launch whatever this says (`cisa bench layer --fused-merge`; Plan::kernels() names the
  // path taken).
  bool fused_merge = false;
  // The attention launch as a programmatic dependent of the kernel before it (pdl.cuh: its
  // blocks take the SMs that free up and wait there for that kernel's writes). Off: an ordinary
  // launch, whose blocks start only once the kernel before has completed. On by default. The A/B
  // it is for (`cisa bench layer --no-attention-pdl`): prefill steps whose attention runs the
  // paired 64-row wgmma tiles (4:1 at G = 4 and 16) replay as a graph 0.07-0.6 ms slower than
  // their stages' busy sum on the H100 and H200, where every other row replays as fast; waiting
  // attention blocks may hold SMs the kernels before still need (docs/cuda-notes.md).
  bool attention_pdl = true;
  // Page-split (decode) plans: instead of splitting each list into the same number of tasks
  // (16 lists on 264 block slots: 16 splits, 256 blocks), the plan's pages laid end to end are
  // cut into one equal share a block slot, and a share that ends one list and starts the next
  // runs both parts one after the other in its block (two tasks, two partials). Every block
  // slot gets the same work; the same merge arithmetic, other partial boundaries (other bits than
  // the split plan's, the same on every run). Off: on an H100 it measured slower (4:1 attention
  // 190.2 against 187.6 us in-kernel), because the SMs do not stream at one rate (24 of 132 ~20 %
  // faster, docs/cuda.md); see sm_rates (`cisa bench layer --even-shares`; Plan::kernels() names
  // the path taken). With fused_merge, the last task of each split list merges inside the
  // launch. Plans where it does not apply (no page-split warps, unions,
  // batch_invariant) ignore it.
  bool even_shares = false;
  // With even_shares: each SM's relative rate (measure_sm_rates; one value an SM of the device,
  // mean 1). A block then takes the share of the SM it runs on (it claims one of its SM's slots
  // at its start), shares sized by the rates, so SMs that run attention faster get more pages.
  // Empty, or not one positive value an SM: equal shares. Rates from a probe that streamed
  // memory in order measured slower on an H100 (4:1 attention 195.4 against 188.7 us in-kernel):
  // they were flat, while attention runs 24 SMs ~20 % faster (docs/cuda.md); measure_sm_rates
  // now times attention itself. The caller's memory: the plan copies it.
  std::span<const float> sm_rates;
  // Selection reuse across decode steps (SelectionParams::reuse_steps > 1, docs/design.md): the
  // reuse state slot of each batch entry's sequence (ReuseState), one per entry; −1: the entry
  // keeps no state and always selects. Needed by plan_sparse when reuse_steps > 1 (the plan
  // copies it); ignored otherwise.
  std::span<const int32_t> reuse_slots;
  // Batch invariance: every list's attention runs the same arithmetic whatever else the batch
  // holds, so a sequence alone and in a batch gets the same bits. The row tile is 128 rows with
  // one warp per 16 rows (no page-split warps), no unions, and a list splits by its own length
  // only (decode lists: one task per tile_sizes.cuh's kInvariantSplitPages pages; prefill lists:
  // never). Costs speed where the batch-dependent decomposition would fill the GPU better.
  bool batch_invariant = false;
  // Where the plan's launch metadata goes to the device: a cudaStream_t, on which one copy from
  // page-locked staging is enqueued (no host synchronisation; the staging is reused once that
  // copy is done). nullptr: a synchronous copy (the legacy default stream).
  void* upload_stream = nullptr;
};

// Dense plan: one group per entry over every page up to its last query's page, or, with
// sliding_window > 0, the pages within the window (as cisa::plan_dense).
Status plan_dense(const DeviceLayer& layer, const DeviceBlockTables& tables,
                  std::span<const BatchEntry> batch, int num_q_heads, int64_t sliding_window,
                  Plan* plan, const PlanOptions& options = {});

// CISA plan: dense prefix, QShare groups of G, selection from the eligible chunks, window, tail
// and sinks (as cisa::select_pages). The selected part is filled by run_select.
Status plan_sparse(const DeviceLayer& layer, const DeviceBlockTables& tables,
                   std::span<const BatchEntry> batch, int num_q_heads, const SelectionParams& p,
                   Plan* plan, const PlanOptions& options = {});

// A hash of everything run_select and run_attention pass to their launches for this plan (grid
// sizes, kernel choices, device pointers), except the layer's K/V: two plans with the same key
// launch the same kernels with the same arguments, so a CUDA graph recorded for one replays the
// other once the plan's metadata is on the device. Bounds that grow with the sequences (the
// longest eligible range, the longest fixed part of a list) are rounded up before launch, so a
// decode batch keeps its key for many steps.
uint64_t plan_launch_key(const Plan& plan);

// The selection stages, separately launchable for timing; run_select runs all three in order.
enum class SelectStage {
  kSetup,  // write the fixed parts of every page list (dense ranges, sinks, window, tail)
  kScore,  // index query per list (mean or last) and scores of every eligible chunk
  kTopK,   // top-k per list, written as physical pages in ascending logical order; then the
           // union lists of grouped small lists (PlanOptions::group_unions)
};

// Selection reuse state in device memory, owned by the caller (the CUDA model backend keeps one
// for its cache): per (sequence slot, layer slot, KV group) the chunks S of the last fresh
// selection of a decode row and ReuseInfo. Slot index = (seq_slot · num_layer_slots +
// layer_slot) · num_kv_heads + kv. A plan whose decode rows may keep a selection (reuse_steps >
// 1 and PlanOptions::reuse_slots) needs one at run_select; the rule is the core's (plan.h):
// a decode row keeps S iff reuse_allowed, same_selection_sets and the check pass, decided on the
// device inside the step (a captured step graph replays the decision, not its outcome).
// (ReuseInfo and ReuseState: cisa/cuda/reuse_state.h.)
//
// reset_reuse_state forgets the state of one sequence slot (all layers and KV groups), or of all
// (seq_slot < 0), enqueued on `stream`: its rows select afresh. Also zeroes the counters when
// seq_slot < 0.
Status reset_reuse_state(const ReuseState& state, int num_kv_heads, int64_t seq_slot, void* stream);

// index_q: device f32 [rows][num_kv_heads][head_dim] (ignored, may be null, for a dense plan).
// reuse: the reuse state (see ReuseState), needed when the plan has decode rows that may keep
// a selection; ignored otherwise.
Status run_select(const Plan& plan, const DeviceLayer& layer, const float* index_q, void* stream,
                  const ReuseState* reuse = nullptr);
Status run_select_stage(const Plan& plan, const DeviceLayer& layer, const float* index_q,
                        SelectStage stage, void* stream, const ReuseState* reuse = nullptr);

// q:   device bf16 [rows][num_q_heads][head_dim]
// out: device f32  [rows][num_q_heads][head_dim]
// lse: device f32  [rows][num_q_heads] (natural log of the softmax denominator) or nullptr.
// scale 0 means 1/√head_dim. Query head h belongs to KV group h / (num_q_heads / num_kv_heads).
Status run_attention(const Plan& plan, const DeviceLayer& layer, const uint16_t* q, float scale,
                     float* out, float* lse, void* stream);
// The same with f32 queries (8-byte aligned), rounded to bf16 (nearest even) as the kernels load
// them: the results of run_attention on their bf16 copy, without a conversion pass.
Status run_attention(const Plan& plan, const DeviceLayer& layer, const float* q, float scale,
                     float* out, float* lse, void* stream);

// Recomputes the representatives of the listed full pages (all KV heads of this layer):
// mean of the page's keys, or per-channel min then max (quest). pages: device int32 [n].
Status run_update_reps(const DeviceLayer& layer, const int32_t* pages, int64_t n, void* stream);

// Each SM's rate of running the decode attention kernel while every SM does, relative to the
// mean: (*rates)[smid], mean 1. For PlanOptions::sm_rates. A synthetic decode batch (16 rows of
// 4:1 GQA, one KV head, d = 128, pages scattered over a random permutation of the pool) is cut
// into equal shares of `pages_per_block` pages, one a block slot (two an SM), and attended
// `repeats` times after a warm-up with every block timing itself; an SM's rate is the median
// over the launches of its blocks' mean pages per second. Synchronous; allocates the pool's K/V
// for the call (2 · SMs · pages_per_block pages of 8 KB: 571 MB on 132 SMs at the default).
// pages_per_block in [64, 4096], repeats in [1, 1000].
Status measure_sm_rates(std::vector<float>* rates, int64_t pages_per_block = 264, int repeats = 5);

// Fills n device bf16 values with deterministic pseudo-random values (roughly normal, standard
// deviation `scale`), for benchmarks that need gigabytes of non-zero K/V. data: device [n].
Status fill_random_bf16(uint16_t* data, int64_t n, uint64_t seed, float scale, void* stream);

// ---- copies for tests and diagnostics (synchronous) ----
// The plan's page lists after run_select, in the form of cisa::PageLists.
Status download_page_lists(const Plan& plan, PageLists* out);
// K/V pages the attention step reads (after run_select): list pages, except that a union
// reads each page of its members' lists once.
Status count_read_pages(const Plan& plan, int64_t* pages);
// Scores of every selected list: list i's scores (eligible chunks from its first eligible one)
// are scores[offsets[i] … offsets[i+1]); lists without selection are empty.
Status download_scores(const Plan& plan, std::vector<float>* scores, std::vector<int64_t>* offsets);
// Replaces the scores of the plan's selecting lists (download_scores' layout, n = its total)
// with device f32 scores[n], enqueued on `stream`, so that run_select_stage(kTopK) selects from
// given scores (the Python package's topk op). Not for plans with fused selection.
Status upload_scores(const Plan& plan, const float* scores, int64_t n, void* stream);

}  // namespace cisa::cuda
