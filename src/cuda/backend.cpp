// Host side of the CUDA backend: device buffers, the plan's accessors, and the launch sequences of
// the run step (selection stages, attention, representatives, the reuse state, downloads). Planning
// is plan_build.cpp, the attention work decomposition plan_attention.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "attention.cuh"
#include "attention_wgmma.cuh"
#include "cisa/core/plan.h"
#include "cisa/cuda/backend.h"
#include "page_lists.cuh"
#include "plan_impl.h"
#include "random_fill.cuh"
#include "reps.cuh"
#include "reuse.cuh"
#include "score.cuh"
#include "select_fused.cuh"
#include "tile_sizes.cuh"
#include "topk.cuh"
#include "unions.cuh"

namespace cisa::cuda {

using detail::AttnTask;
using detail::ListDesc;
using detail::MergeTask;
using detail::ScoreStream;

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  const std::string m =
      std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return resource_exhausted(m);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return unavailable(m);
  return internal_error(m);
}

Status DeviceBuffer::reserve(size_t bytes, const char* what, bool zero) {
  if (bytes <= bytes_) return Status::Ok();
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  const size_t rounded = (bytes + bytes / 8 + 255) / 256 * 256;
  CISA_RETURN_IF_ERROR(cuda_status(cudaMalloc(&ptr_, rounded), what));
  bytes_ = rounded;
  if (zero) CISA_RETURN_IF_ERROR(cuda_status(cudaMemset(ptr_, 0, rounded), what));
  return Status::Ok();
}

Status PinnedBuffer::reserve(size_t bytes, const char* what) {
  if (bytes <= bytes_) return Status::Ok();
  if (ptr_) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  const size_t rounded = (bytes + bytes / 8 + 4095) / 4096 * 4096;
  CISA_RETURN_IF_ERROR(cuda_status(cudaMallocHost(&ptr_, rounded), what));
  bytes_ = rounded;
  return Status::Ok();
}

Plan::Impl::~Impl() {
  if (meta_copied) {
    cudaEventSynchronize(meta_copied);  // the staging must outlive its copy
    cudaEventDestroy(meta_copied);
  }
}

bool device_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    if (why) *why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      major < 9) {
    if (why)
      *why =
          "the CUDA device is older than compute capability 9.0 (the kernels are built for sm_90a)";
    return false;
  }
  return true;
}

Plan::Plan() : impl_(std::make_unique<Impl>()) {}
Plan::~Plan() = default;
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;
const std::vector<QueryGroup>& Plan::groups() const {
  return impl_->groups;
}
int64_t Plan::total_pages() const {
  return impl_->total_pages;
}
int64_t Plan::selected_lists() const {
  return static_cast<int64_t>(impl_->sel.size());
}
int64_t Plan::num_rows() const {
  return impl_->num_rows;
}
int64_t Plan::num_unions() const {
  return static_cast<int64_t>(impl_->unions.size());
}
int64_t Plan::reuse_candidates() const {
  return impl_->reuse_candidates;
}
std::string Plan::kernels() const {
  const Impl& P = *impl_;
  std::string s = "attention ";
  const bool v5 = P.options.attention_kernel == AttentionKernel::kWgmmaV5;
  const auto mainloop = [&](bool wgmma, int warps) -> std::string {
    const bool ws = !v5 && (warps == 8 ? tiles::kWgmmaWarpSpecialized : tiles::kWsPairedTiles);
    return std::string(wgmma ? (ws ? "wgmma (warp-specialised" : "wgmma (v4/v5") : "mma.sync (") +
           ", " + std::to_string(16 * warps) + "-row tiles";
  };
  if (P.big_tasks > 0)
    s += mainloop(P.wgmma_big, 8) + ", " + std::to_string(P.big_tasks) + " tasks) then ";
  s += mainloop(P.wgmma, P.warps);
  if (P.page_warps > 1) s += ", pages split over " + std::to_string(P.page_warps) + " warps";
  if (P.fused_merge) s += ", split merge in the last split block";
  if (P.tasks_per_block > 1 || P.sm_claims)
    s += std::string(", even shares") + (P.sm_claims ? " by SM rate" : "") + " (" +
         std::to_string(P.tasks_per_block) + " tasks a block)";
  if (!P.unions.empty()) s += ", " + std::to_string(P.unions.size()) + " unions";
  s += ")";
  if (P.sel.empty()) return s + "; no selection";
  s += "; top-k ";
  if (P.fused_cluster > 0)
    s += "fused with scoring, clusters of " + std::to_string(P.fused_cluster);
  else if (P.topk_staged)
    s += "one block a list, keys staged in shared memory";
  else if (P.topk_clusters > 0)
    s += "in registers, clusters of " + std::to_string(tiles::kTopkCluster) + " (" +
         std::to_string(P.topk_clusters) + " at once)";
  else
    s += "one block a list";
  return s;
}

namespace {

// The reuse state a run of the plan uses, checked against the plan; null when no list of the
// plan may keep a selection.
Result<const ReuseState*> reuse_for(const Plan::Impl& P, const ReuseState* reuse) {
  if (P.reuse_candidates == 0) return static_cast<const ReuseState*>(nullptr);
  if (!reuse)
    return invalid_argument(
        "cuda: the plan's decode rows may keep their selection (reuse_steps > 1) but no "
        "ReuseState was given to run_select");
  if (!reuse->chunks || !reuse->info || !reuse->stats)
    return invalid_argument("cuda: a ReuseState pointer is null");
  if (P.max_reuse_seq >= reuse->num_seq_slots)
    return out_of_range("cuda: reuse slot " + std::to_string(P.max_reuse_seq) +
                        " is outside the ReuseState's " + std::to_string(reuse->num_seq_slots) +
                        " sequence slots");
  if (reuse->layer_slot < 0 || reuse->layer_slot >= reuse->num_layer_slots)
    return out_of_range("cuda: ReuseState::layer_slot " + std::to_string(reuse->layer_slot) +
                        " outside [0, " + std::to_string(reuse->num_layer_slots) + ")");
  if (reuse->k_stride < P.params.budget)
    return invalid_argument("cuda: the ReuseState holds " + std::to_string(reuse->k_stride) +
                            " chunks per selection, the plan's budget is " +
                            std::to_string(P.params.budget));
  return reuse;
}

static_assert(detail::kReuseMassStrideDevice == kReuseMassStride);

detail::ReuseParams reuse_params(const Plan::Impl& P) {
  const ReuseCheck c = P.params.reuse_check;
  return {P.params.budget,
          P.params.window,
          P.params.sink_pages,
          P.params.reuse_steps,
          c == ReuseCheck::kNewChunks || c == ReuseCheck::kMass ? 1 : 0,
          c == ReuseCheck::kMass ? 1 : 0,
          c == ReuseCheck::kMass ? P.params.reuse_mass_slack : 0.0};
}

}  // namespace

Status reset_reuse_state(const ReuseState& state, int num_kv_heads, int64_t seq_slot,
                         void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (!state.info || !state.stats) return invalid_argument("cuda: a ReuseState pointer is null");
  if (seq_slot >= state.num_seq_slots)
    return out_of_range("cuda: reuse slot " + std::to_string(seq_slot) + " outside the state's " +
                        std::to_string(state.num_seq_slots));
  const int64_t per_seq = int64_t{state.num_layer_slots} * num_kv_heads;
  const int64_t first = seq_slot < 0 ? 0 : seq_slot * per_seq;
  const int64_t count = seq_slot < 0 ? state.num_seq_slots * per_seq : per_seq;
  // All bits set: selected_at = −1, no state.
  CISA_RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(state.info + first, 0xff, static_cast<size_t>(count) * sizeof(ReuseInfo), s),
      "cuda: resetting the reuse state"));
  if (seq_slot >= 0) return Status::Ok();
  return cuda_status(cudaMemsetAsync(state.stats, 0, 4 * sizeof(int64_t), s),
                     "cuda: resetting the reuse counters");
}

Status run_select_stage(const Plan& plan, const DeviceLayer& layer, const float* index_q,
                        SelectStage stage, void* stream, const ReuseState* reuse_in) {
  const auto& P = *plan.impl();
  auto s = static_cast<cudaStream_t>(stream);
  if (layer.num_kv_heads != P.num_kv_heads || layer.head_dim != P.head_dim)
    return invalid_argument("cuda: the layer does not have the shape the plan was built for");
  const ReuseState* reuse = nullptr;
  if (stage != SelectStage::kSetup && !P.sel.empty()) {
    CISA_ASSIGN_OR_RETURN(reuse, reuse_for(P, reuse_in));
  }
  int32_t* const keep = reuse ? P.d_keep.as<int32_t>() : nullptr;
  switch (stage) {
    case SelectStage::kSetup:
      return cuda_status(detail::launch_assemble_lists(
                             P.d_lists, static_cast<int64_t>(P.lists.size()), P.max_fixed,
                             P.block_pages, P.d_pages.as<int32_t>(), P.d_chunks.as<int32_t>(), s),
                         "cuda: page-list assembly");
    case SelectStage::kScore: {
      if (P.sel.empty()) return Status::Ok();
      const float* own_index_q = nullptr;  // set where the scoring kernel computes q̄ itself
      if (!index_q)
        return invalid_argument("cuda: null index query pointer for a plan that selects");
      if (!layer.reps) return invalid_argument("cuda: the layer has no representative pointer");
      if (reuse)  // index queries, and which decode lists keep their selection (pages written)
        CISA_RETURN_IF_ERROR(
            cuda_status(detail::launch_reuse_decide(
                            P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()), P.block_pages,
                            rep_args(layer), P.quest, index_q, P.d_qbar.as<float>(),
                            P.d_qsplit.as<uint16_t>(), P.num_kv_heads, P.head_dim, reuse_params(P),
                            *reuse, P.d_reuse_partials.as<void>(), P.d_reuse_tickets.as<uint32_t>(),
                            keep, P.d_pages.as<int32_t>(), P.d_chunks.as<int32_t>(), s),
                        "cuda: selection reuse decision"));
      else if (P.fused_cluster > 0 ||
               !detail::score_takes_index_queries(P.max_stream_lists, index_q))
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_index_queries(P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()),
                                         index_q, P.num_kv_heads, P.head_dim, P.d_qbar.as<float>(),
                                         P.d_qsplit.as<uint16_t>(), s),
            "cuda: index queries"));
      else  // the few-list scoring kernel computes q̄ from index_q itself (one launch fewer)
        own_index_q = index_q;
      if (P.fused_cluster > 0)  // scores and the selected part of every list (kTopK: unions only)
        return cuda_status(
            detail::launch_select_fused(P.d_streams, static_cast<int64_t>(P.streams.size()),
                                        P.fused_cluster, P.max_score_span, P.d_lists, P.block_pages,
                                        rep_args(layer), P.d_qbar.as<float>(), P.num_kv_heads,
                                        P.head_dim, P.d_scores.as<float>(), P.d_pages.as<int32_t>(),
                                        P.d_chunks.as<int32_t>(), s),
            "cuda: fused scoring and top-k");
      return cuda_status(
          detail::launch_score(P.d_streams, static_cast<int64_t>(P.streams.size()),
                               P.max_score_span, P.max_stream_lists, P.d_lists, P.block_pages,
                               rep_args(layer), P.d_qbar.as<float>(), P.d_qsplit.as<uint16_t>(),
                               own_index_q, P.num_kv_heads, P.head_dim, P.quest, P.score_tiles,
                               P.d_scores.as<float>(), keep, s),
          "cuda: scoring");
    }
    case SelectStage::kTopK: {
      if (P.sel.empty()) return Status::Ok();
      // Fresh selections of decode rows become their sequences' state: stored by the top-k
      // kernel as it writes them, or under `mass` (u0 from the scores) by a commit after it.
      const detail::ReuseParams rp = reuse ? reuse_params(P) : detail::ReuseParams{};
      const bool commit_after = reuse && rp.check_mass;
      if (reuse && P.fused_cluster > 0)  // plan_fused_select refuses this
        return internal_error("cuda: fused selection cannot commit reused selections");
      detail::TopkCommit commit;
      if (reuse && !commit_after) commit = {.st = *reuse, .rp = rp, .num_kv_heads = P.num_kv_heads};
      if (P.topk_staged)
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_topk_staged(P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()),
                                       P.max_score_span, P.d_scores.as<float>(), P.block_pages,
                                       P.d_pages.as<int32_t>(), P.d_chunks.as<int32_t>(), keep,
                                       commit, s),
            "cuda: top-k (staged)"));
      else if (P.fused_cluster == 0)
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_topk(P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()),
                                P.max_score_span, topk_cluster_min_scores(P.options),
                                P.d_scores.as<float>(), P.block_pages, P.d_pages.as<int32_t>(),
                                P.d_chunks.as<int32_t>(), keep, commit, s),
            "cuda: top-k"));
      if (commit_after)
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_reuse_commit(P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()),
                                        P.num_kv_heads, rp, *reuse, keep, P.d_chunks.as<int32_t>(),
                                        P.d_scores.as<float>(), P.d_reuse_partials.as<void>(), s),
            "cuda: selection reuse state"));
      return cuda_status(
          detail::launch_build_unions(
              P.d_unions, static_cast<int64_t>(P.unions.size()), P.union_smem, P.d_lists,
              P.d_chunks.as<int32_t>(), P.block_pages, P.d_upages.as<int32_t>(),
              P.d_uchunks.as<int32_t>(), P.d_umask.as<int32_t>(), P.d_ucounts.as<int32_t>(), s),
          "cuda: union lists");
    }
  }
  return invalid_argument("cuda: unknown selection stage");
}

Status run_select(const Plan& plan, const DeviceLayer& layer, const float* index_q, void* stream,
                  const ReuseState* reuse) {
  CISA_RETURN_IF_ERROR(run_select_stage(plan, layer, index_q, SelectStage::kSetup, stream, reuse));
  CISA_RETURN_IF_ERROR(run_select_stage(plan, layer, index_q, SelectStage::kScore, stream, reuse));
  return run_select_stage(plan, layer, index_q, SelectStage::kTopK, stream, reuse);
}

namespace {

// run_attention on bf16 queries (q) or f32 ones (q_f32, rounded by the kernels as they load them).
Status attend_queries(const Plan& plan, const DeviceLayer& layer, const uint16_t* q,
                      const float* q_f32, float scale, float* out, float* lse, void* stream,
                      int64_t* block_clock = nullptr) {
  const auto& P = *plan.impl();
  if ((!q && !q_f32) || !out) return invalid_argument("cuda: null query or output pointer");
  if (q_f32 && reinterpret_cast<uintptr_t>(q_f32) % 8 != 0)
    return invalid_argument("cuda: f32 queries must be 8-byte aligned");
  if (layer.num_kv_heads != P.num_kv_heads || layer.head_dim != P.head_dim || !layer.k || !layer.v)
    return invalid_argument("cuda: the layer does not have the shape the plan was built for");
  detail::AttentionArgs a{};
  a.k = layer.k;
  a.v = layer.v;
  a.q = q;
  a.q_f32 = q_f32;
  a.lists = P.d_lists;
  a.tasks = P.d_tasks;
  a.merges = P.d_merges;
  a.pages = P.d_pages.as<int32_t>();
  a.chunks = P.d_chunks.as<int32_t>();
  a.upages = P.d_upages.as<int32_t>();
  a.uchunks = P.d_uchunks.as<int32_t>();
  a.umask = P.d_umask.as<int32_t>();
  a.ucounts = P.d_ucounts.as<int32_t>();
  a.out = out;
  a.lse = lse;
  a.partial_out = P.d_partial_out.as<float>();
  a.partial_lse = P.d_partial_lse.as<float>();
  a.merge_tickets = P.fused_merge ? P.d_merge_tickets.as<uint32_t>() : nullptr;
  a.tasks_per_block = P.tasks_per_block;
  a.sm_claims = P.sm_claims ? P.d_sm_claims.as<uint32_t>() : nullptr;
  a.num_sms = P.sm_claims ? static_cast<int>(P.sm_rates.size()) : 0;  // the plan's SMs
  a.slots_per_sm = P.slots_per_sm;
  a.block_clock = block_clock;
  a.num_kv_heads = P.num_kv_heads;
  a.num_q_heads = P.num_q_heads;
  a.head_dim = P.head_dim;
  a.window = P.lists.empty() ? 0 : P.lists[0].window;
  a.scale = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(P.head_dim));
  auto s = static_cast<cudaStream_t>(stream);
  const bool v5 = P.options.attention_kernel == AttentionKernel::kWgmmaV5;
  // A mixed plan's 128-row tasks first (PlanOptions::mixed_tiles), from the start of the array.
  // The wgmma kernel folds the scale into its exponent, which needs it positive.
  const bool pdl = P.options.attention_pdl;
  if (P.big_tasks > 0)
    CISA_RETURN_IF_ERROR(
        cuda_status(P.wgmma_big && a.scale > 0.0f
                        ? detail::launch_attention_wgmma(a, P.big_tasks, 8, v5,
                                                         P.options.ws_copy_warps, false, pdl, s)
                        : detail::launch_attention(a, P.big_tasks, 8, 1, false, pdl, s),
                    "cuda: attention (128-row tiles)"));
  a.tasks = P.d_tasks + P.big_tasks;
  const auto n_tasks = static_cast<int64_t>(P.tasks.size()) - P.big_tasks;
  CISA_RETURN_IF_ERROR(cuda_status(
      P.wgmma && a.scale > 0.0f
          ? detail::launch_attention_wgmma(a, n_tasks, P.warps, v5, P.options.ws_copy_warps,
                                           !P.unions.empty(), pdl, s)
          : detail::launch_attention(a, n_tasks / P.tasks_per_block, P.warps, P.page_warps,
                                     !P.unions.empty(), pdl, s),
      "cuda: attention"));
  if (P.fused_merge) return Status::Ok();  // merged by each merge task's last split block
  return cuda_status(
      detail::launch_merge(a, static_cast<int64_t>(P.merges.size()), P.merge_max_rows, s),
      "cuda: split-KV merge");
}

}  // namespace

Status run_attention(const Plan& plan, const DeviceLayer& layer, const uint16_t* q, float scale,
                     float* out, float* lse, void* stream) {
  return attend_queries(plan, layer, q, nullptr, scale, out, lse, stream);
}

Status run_attention(const Plan& plan, const DeviceLayer& layer, const float* q, float scale,
                     float* out, float* lse, void* stream) {
  return attend_queries(plan, layer, nullptr, q, scale, out, lse, stream);
}

Status run_attention_clocked(const Plan& plan, const DeviceLayer& layer, const uint16_t* q,
                             float* out, int64_t* block_clock, void* stream) {
  const auto& P = *plan.impl();
  if (!block_clock) return invalid_argument("cuda: null block clock");
  if (P.wgmma || P.big_tasks > 0 || P.sm_claims || P.page_warps == 1)
    return invalid_argument(
        "cuda: a clocked attention run needs one page-split mma.sync launch with a block per "
        "slot (no wgmma, mixed tiles or SM claims)");
  return attend_queries(plan, layer, q, nullptr, 0.0f, out, nullptr, stream, block_clock);
}

uint64_t plan_launch_key(const Plan& plan) {
  const auto& P = *plan.impl();
  uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
  const auto ptr = [&mix](const void* p) { mix(reinterpret_cast<uint64_t>(p)); };
  // The reuse kernels' plan-side arguments (zeros when no list may keep a selection).
  const detail::ReuseParams rp = P.reuse_candidates > 0 ? reuse_params(P) : detail::ReuseParams{};
  for (const int64_t v : {int64_t{P.num_q_heads},
                          int64_t{P.num_kv_heads},
                          int64_t{P.head_dim},
                          int64_t{P.quest},
                          P.num_rows,
                          static_cast<int64_t>(P.lists.size()),
                          static_cast<int64_t>(P.sel.size()),
                          static_cast<int64_t>(P.streams.size()),
                          int64_t{P.max_score_span},
                          int64_t{P.max_stream_lists},
                          P.max_fixed,
                          static_cast<int64_t>(P.unions.size()),
                          static_cast<int64_t>(P.union_smem),
                          static_cast<int64_t>(P.tasks.size()),
                          static_cast<int64_t>(P.merges.size()),
                          int64_t{P.merge_max_rows},
                          int64_t{P.warps},
                          int64_t{P.page_warps},
                          int64_t{P.tasks_per_block},
                          int64_t{P.sm_claims},
                          int64_t{P.slots_per_sm},
                          int64_t{P.wgmma},
                          P.big_tasks,
                          int64_t{P.wgmma_big},
                          static_cast<int64_t>(P.options.attention_kernel),
                          int64_t{P.options.ws_copy_warps},
                          int64_t{P.options.topk_cluster_min_scores},
                          int64_t{P.score_tiles},
                          int64_t{P.fused_cluster},
                          int64_t{P.topk_staged},
                          int64_t{P.fused_merge},
                          int64_t{P.options.attention_pdl},
                          rp.budget,
                          rp.window,
                          rp.sink_pages,
                          rp.reuse_steps,
                          int64_t{rp.check_new_chunks},
                          int64_t{rp.check_mass},
                          std::bit_cast<int64_t>(rp.mass_slack),
                          int64_t{P.lists.empty() ? 0 : P.lists[0].window}})
    mix(static_cast<uint64_t>(v));
  for (const void* p : std::initializer_list<const void*>{
           static_cast<const void*>(P.block_pages), P.d_meta.as<void>(), P.d_pages.as<void>(),
           P.d_chunks.as<void>(), P.d_scores.as<void>(), P.d_qbar.as<void>(), P.d_qsplit.as<void>(),
           P.d_partial_out.as<void>(), P.d_partial_lse.as<void>(), P.d_upages.as<void>(),
           P.d_uchunks.as<void>(), P.d_umask.as<void>(), P.d_ucounts.as<void>(),
           P.d_keep.as<void>(), P.d_reuse_partials.as<void>(), P.d_reuse_tickets.as<void>(),
           P.d_merge_tickets.as<void>(), P.d_sm_claims.as<void>()})
    ptr(p);
  return h;
}

Status run_update_reps(const DeviceLayer& layer, const int32_t* pages, int64_t n, void* stream) {
  CISA_RETURN_IF_ERROR(validate_layer(layer));
  if (!layer.reps) return invalid_argument("cuda: the layer has no representative pointer");
  if (n < 0 || n > std::numeric_limits<int32_t>::max())
    return invalid_argument("cuda: page count out of range");
  if (n > 0 && !pages) return invalid_argument("cuda: null page pointer");
  return cuda_status(detail::launch_update_reps(
                         layer.k,
                         detail::RepArgsOut{static_cast<uint8_t*>(layer.reps), layer.rep_exps,
                                            layer.rep_precision == RepPrecision::kInt8},
                         pages, n, layer.num_kv_heads, layer.head_dim, layer.rep == RepKind::kQuest,
                         static_cast<cudaStream_t>(stream)),
                     "cuda: representative update");
}

Status fill_random_bf16(uint16_t* data, int64_t n, uint64_t seed, float scale, void* stream) {
  if (n > 0 && !data) return invalid_argument("cuda: null fill pointer");
  return cuda_status(
      detail::launch_fill_random_bf16(data, n, seed, scale, static_cast<cudaStream_t>(stream)),
      "cuda: random fill");
}

Status download_page_lists(const Plan& plan, PageLists* out) {
  const auto& P = *plan.impl();
  if (!out) return invalid_argument("cuda: null output");
  out->clear();
  out->num_kv_heads = P.num_kv_heads;
  out->groups = P.groups;
  out->pages.resize(static_cast<size_t>(P.total_pages));
  out->chunks.resize(static_cast<size_t>(P.total_pages));
  if (P.total_pages > 0) {
    CISA_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(out->pages.data(), P.d_pages.as<void>(),
                               out->pages.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                    "cuda: page-list download"));
    CISA_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(out->chunks.data(), P.d_chunks.as<void>(),
                               out->chunks.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                    "cuda: chunk-list download"));
  }
  out->offsets.push_back(0);
  for (const auto& d : P.lists) {
    out->offsets.push_back(out->offsets.back() + (d.pre_end - d.pre_begin) + d.k +
                           (d.post_end - d.post_begin));
    out->num_selected.push_back(d.k);
  }
  return Status::Ok();
}

Status count_read_pages(const Plan& plan, int64_t* pages) {
  const auto& P = *plan.impl();
  if (!pages) return invalid_argument("cuda: null output");
  int64_t n = 0;
  for (const auto& t : P.tasks)
    if (t.members == 0) n += t.page1 - t.page0;
  if (!P.unions.empty()) {
    std::vector<int32_t> counts(P.unions.size());
    CISA_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(counts.data(), P.d_ucounts.as<void>(),
                               counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                    "cuda: union size download"));
    for (int32_t c : counts) n += c;
  }
  *pages = n;
  return Status::Ok();
}

Status download_scores(const Plan& plan, std::vector<float>* scores,
                       std::vector<int64_t>* offsets) {
  const auto& P = *plan.impl();
  if (!scores || !offsets) return invalid_argument("cuda: null output");
  scores->resize(static_cast<size_t>(P.score_total));
  if (P.score_total > 0)
    CISA_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(scores->data(), P.d_scores.as<void>(),
                               scores->size() * sizeof(float), cudaMemcpyDeviceToHost),
                    "cuda: score download"));
  offsets->assign(1, 0);
  for (const auto& d : P.lists)
    offsets->push_back(offsets->back() + (d.k > 0 ? d.elig_end - d.elig_begin : 0));
  return Status::Ok();
}

Status upload_scores(const Plan& plan, const float* scores, int64_t n, void* stream) {
  const auto& P = *plan.impl();
  if (n != P.score_total)
    return invalid_argument("cuda: upload_scores got " + std::to_string(n) +
                            " scores but the plan's lists hold " + std::to_string(P.score_total));
  if (P.fused_cluster > 0)
    return invalid_argument("cuda: upload_scores needs a plan without fused selection");
  if (n == 0) return Status::Ok();
  if (!scores) return invalid_argument("cuda: null scores");
  return cuda_status(
      cudaMemcpyAsync(P.d_scores.as<void>(), scores, static_cast<size_t>(n) * sizeof(float),
                      cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
      "cuda: score upload");
}

}  // namespace cisa::cuda
