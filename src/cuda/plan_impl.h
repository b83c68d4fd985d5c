// The host side of a cuda::Plan: launch metadata on the host and grow-only device buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/status.h"
#include "cisa/cuda/backend.h"
#include "plan_types.h"

namespace cisa::cuda {

// Device memory that only grows (so a plan rebuilt every step stops allocating after warm-up);
// a growth takes an eighth more than asked, so buffers that grow a little every step (lists of
// sequences in decode) keep their addresses for many steps (a captured step graph names them).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Grows to at least `bytes` (contents lost on growth; zeroed there when `zero` is set).
  Status reserve(size_t bytes, const char* what, bool zero = false);
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory that only grows (staging of the plan's metadata).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  Status reserve(size_t bytes, const char* what);
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

Status cuda_status(cudaError_t err, const char* what);

// The layer's pointers and shape as the kernels need them (plan_build.cpp).
Status validate_layer(const DeviceLayer& layer);
// The layer's representatives as the scoring kernels take them.
inline detail::RepArgs rep_args(const DeviceLayer& layer) {
  return detail::RepArgs{static_cast<const uint8_t*>(layer.reps), layer.rep_exps,
                         layer.rep_precision == RepPrecision::kInt8};
}

struct Plan::Impl {
  // Shape the plan was built for.
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool quest = false;
  const int32_t* block_pages = nullptr;  // device
  int64_t num_rows = 0;

  std::vector<QueryGroup> groups;
  std::vector<detail::ListDesc> lists;
  std::vector<int32_t> sel;  // lists that select
  std::vector<detail::ScoreStream> streams;
  int32_t max_score_span = 0, max_stream_lists = 0;  // largest eligible range of a stream
  int32_t score_tiles = 1;   // PlanOptions::score_tiles_per_block resolved (score.cuh)
  int fused_cluster = 0;     // > 0: scoring and top-k by select_fused.cu, clusters of this size
  bool topk_staged = false;  // top-k by topk_staged.cu (v7), one block a list
  int topk_clusters = 0;     // > 0: top-k by register clusters (topk.cu), this many at once
  PlanOptions options;       // the switches the plan was built with (run_attention reads them too)
  SelectionParams params;    // plan_sparse's parameters (reuse reads budget, window, sinks, r)
  int64_t reuse_candidates = 0;  // lists with reuse_seq >= 0
  int32_t max_reuse_seq = -1;    // largest reuse_seq of a list
  bool group_unions = true;
  std::vector<detail::UnionDesc> unions;
  int64_t union_capacity = 0;
  size_t union_smem = 0;
  std::vector<detail::AttnTask> tasks;
  std::vector<detail::MergeTask> merges;
  int warps = 4;
  int page_warps = 1;  // warps splitting a tile's pages (attention.cuh)
  bool wgmma = false;  // attention on the wgmma kernel (attention_wgmma.cuh)
  // PlanOptions::mixed_tiles: tasks [0, big_tasks) are 128-row tiles of the groups over 64 rows,
  // launched first with 8 warps (on wgmma iff wgmma_big); warps, page_warps and wgmma describe
  // the launch of the others. 0 in every other plan: one launch.
  int64_t big_tasks = 0;
  bool wgmma_big = false;
  // PlanOptions::fused_merge taken: one launch of page-split tasks (mma.sync) with merges, which
  // the last split block of each merge task runs (d_merge_tickets); no merge launch.
  bool fused_merge = false;
  // PlanOptions::even_shares taken: block b runs tasks [b · S, b · S + S), S = tasks_per_block
  // (a slot with rows = 0 is unused); 1 in every other plan (task b on block b).
  int tasks_per_block = 1;
  // PlanOptions::sm_rates taken (even shares sized by SM): block b runs the tasks of the slot it
  // claims (d_sm_claims: a counter an SM and a done counter, zero between launches), slots
  // [smid · slots_per_sm, … + slots_per_sm) for the SM it runs on; else slot b.
  bool sm_claims = false;
  int slots_per_sm = 0;
  std::vector<float> sm_rates;  // PlanOptions::sm_rates, copied
  int64_t total_pages = 0, score_total = 0, partial_rows = 0;
  int merge_max_rows = 0;  // rows of the largest merge task (merge grid)
  int64_t max_fixed = 0;   // most fixed entries (dense range / sinks + window + tail) of a list

  // Launch metadata: one device arena (lists, selecting lists, score streams, attention tasks,
  // merge tasks, union descriptors at 256-byte aligned offsets), written by one copy per plan:
  // from pinned staging on PlanOptions::upload_stream, or synchronously when that is null.
  DeviceBuffer d_meta;
  PinnedBuffer h_meta;
  cudaEvent_t meta_copied = nullptr;  // recorded after the async copy; h_meta is reused after it
  detail::ListDesc* d_lists = nullptr;
  int32_t* d_sel = nullptr;
  detail::ScoreStream* d_streams = nullptr;
  detail::AttnTask* d_tasks = nullptr;
  detail::MergeTask* d_merges = nullptr;
  detail::UnionDesc* d_unions = nullptr;
  ~Impl();
  DeviceBuffer d_pages, d_chunks, d_scores, d_qbar, d_qsplit, d_partial_out, d_partial_lse;
  DeviceBuffer d_upages, d_uchunks, d_umask, d_ucounts;
  DeviceBuffer d_keep;  // int32 per list: 1 when a decode list keeps its selection (reuse.cuh)
  DeviceBuffer d_reuse_partials;  // the reuse check's and commit's per-block partials (reuse.cuh)
  DeviceBuffer d_reuse_tickets;   // uint32 per list, zero between launches (launch_reuse_decide)
  DeviceBuffer d_merge_tickets;   // uint32 per merge task, zero between launches (fused_merge)
  DeviceBuffer d_sm_claims;       // uint32 per SM + 1, zero between launches (sm_claims)
};

// The current device's SM count (132 where it cannot be read).
int device_sms();

// PlanOptions::topk_cluster_min_scores resolved (-1: tiles::kTopkClusterMinScores).
int topk_cluster_min_scores(const PlanOptions& options);

// run_attention (bf16 queries, default scale, no LSE) with every block of its attention launch
// writing its SM and its start and end times (%globaltimer, ns) to block_clock[3 · block …]
// (measure_sm_rates). Plans of one page-split mma.sync launch whose block b runs slot b: no
// wgmma, no mixed tiles, no SM claims.
Status run_attention_clocked(const Plan& plan, const DeviceLayer& layer, const uint16_t* q,
                             float* out, int64_t* block_clock, void* stream);

// Attention's work decomposition for the plan's groups and lists (plan_attention.cpp): fills
// P.warps, P.page_warps, P.wgmma, P.unions, P.tasks, P.merges and the partial-row counts.
Status plan_attention(Plan::Impl& P);

}  // namespace cisa::cuda
