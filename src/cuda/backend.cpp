// Host side of the CUDA backend: validation, query groups, page-list sizes and launch metadata
// (plan; the attention work decomposition is plan_attention.cpp), and the launch sequences of the
// run step.
#include <algorithm>
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

Status DeviceBuffer::reserve(size_t bytes, const char* what) {
  if (bytes <= bytes_) return Status::Ok();
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  const size_t rounded = (bytes + bytes / 8 + 255) / 256 * 256;
  CISA_RETURN_IF_ERROR(cuda_status(cudaMalloc(&ptr_, rounded), what));
  bytes_ = rounded;
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

namespace {

constexpr int kB = tiles::kPageSize;
// Rounding of ListDesc-derived launch bounds (finish_plan): one assembly block's entries, and the
// scoring kernels' widest block of chunks.
constexpr int64_t kFixedQuantum = int64_t{tiles::kAssembleThreads} * tiles::kAssembleItems;
constexpr int32_t kSpanQuantum = tiles::kScoreFewChunks;

Status validate_layer(const DeviceLayer& layer) {
  if (!layer.k || !layer.v) return invalid_argument("cuda: the layer's K or V pointer is null");
  if (layer.page_size != kB)
    return unimplemented("cuda: page_size " + std::to_string(layer.page_size) +
                         " is not supported (the kernels need 16)");
  if (layer.head_dim != 64 && layer.head_dim != 128 && layer.head_dim != 256)
    return unimplemented("cuda: head_dim " + std::to_string(layer.head_dim) +
                         " is not supported (64, 128 or 256)");
  if (layer.rep == RepKind::kMoment)
    return unimplemented(
        "cuda: moment representatives (mean and variance) are implemented on the CPU backend only");
  if (layer.num_kv_heads <= 0) return invalid_argument("cuda: num_kv_heads must be positive");
  if (layer.num_pages <= 0 || layer.num_pages > std::numeric_limits<int32_t>::max())
    return invalid_argument("cuda: num_pages must be in [1, 2^31)");
  return Status::Ok();
}

Status validate_batch_tables(const DeviceBlockTables& tables, std::span<const BatchEntry> batch,
                             int hq, int hkv) {
  if (!tables.pages) return invalid_argument("cuda: the block tables' device pointer is null");
  if (tables.offsets.empty()) return invalid_argument("cuda: block table offsets are empty");
  if (hq <= 0 || hq % hkv != 0)
    return invalid_argument("cuda: query head count " + std::to_string(hq) +
                            " is not a positive multiple of the " + std::to_string(hkv) +
                            " KV heads");
  const auto num_seqs = static_cast<int64_t>(tables.offsets.size()) - 1;
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto& b = batch[e];
    const std::string where = "cuda: batch entry " + std::to_string(e) + ": ";
    if (b.seq < 0 || b.seq >= num_seqs)
      return not_found(where + "block table " + std::to_string(b.seq) + " does not exist (" +
                       std::to_string(num_seqs) + " tables)");
    if (b.first < 0) return invalid_argument(where + "negative first position");
    if (b.count <= 0) return invalid_argument(where + "query count must be positive");
    const int64_t pages =
        tables.offsets[static_cast<size_t>(b.seq) + 1] - tables.offsets[static_cast<size_t>(b.seq)];
    if (pages < 0) return invalid_argument(where + "block table offsets are not ascending");
    if (b.first + b.count > pages * kB)
      return out_of_range(where + "queries up to position " +
                          std::to_string(b.first + b.count - 1) + " but its block table holds " +
                          std::to_string(pages) + " pages");
    if (b.first + b.count >= (int64_t{1} << 30))
      return out_of_range(where + "positions must stay below 2^30");
  }
  return Status::Ok();
}

// The metadata arena's layout: each array at a 256-byte aligned offset.
size_t align_meta(size_t off) {
  return (off + 255) / 256 * 256;
}

template <class T>
size_t meta_bytes(const std::vector<T>& v) {
  return std::max<size_t>(1, v.size()) * sizeof(T);
}

// Writes the launch metadata arrays into the device arena with one copy (see Plan::Impl).
Status upload_metadata(Plan::Impl& P) {
  const size_t o_lists = 0;
  const size_t o_sel = align_meta(o_lists + meta_bytes(P.lists));
  const size_t o_streams = align_meta(o_sel + meta_bytes(P.sel));
  const size_t o_tasks = align_meta(o_streams + meta_bytes(P.streams));
  const size_t o_merges = align_meta(o_tasks + meta_bytes(P.tasks));
  const size_t o_unions = align_meta(o_merges + meta_bytes(P.merges));
  const size_t total = o_unions + meta_bytes(P.unions);
  CISA_RETURN_IF_ERROR(P.d_meta.reserve(total, "cuda plan: launch metadata"));
  uint8_t* const base = P.d_meta.as<uint8_t>();
  P.d_lists = reinterpret_cast<ListDesc*>(base + o_lists);
  P.d_sel = reinterpret_cast<int32_t*>(base + o_sel);
  P.d_streams = reinterpret_cast<ScoreStream*>(base + o_streams);
  P.d_tasks = reinterpret_cast<AttnTask*>(base + o_tasks);
  P.d_merges = reinterpret_cast<MergeTask*>(base + o_merges);
  P.d_unions = reinterpret_cast<detail::UnionDesc*>(base + o_unions);
  auto stream = static_cast<cudaStream_t>(P.options.upload_stream);
  if (stream) {
    // The previous plan's copy out of the staging must be done before it is overwritten (it
    // was enqueued a step ago, so this does not wait in practice).
    if (P.meta_copied)
      CISA_RETURN_IF_ERROR(
          cuda_status(cudaEventSynchronize(P.meta_copied), "cuda plan: metadata staging"));
    else
      CISA_RETURN_IF_ERROR(
          cuda_status(cudaEventCreateWithFlags(&P.meta_copied, cudaEventDisableTiming),
                      "cuda plan: metadata event"));
    CISA_RETURN_IF_ERROR(P.h_meta.reserve(total, "cuda plan: metadata staging"));
  }
  std::vector<uint8_t> sync_staging;
  if (!stream) sync_staging.resize(total);
  uint8_t* const h = stream ? P.h_meta.get() : sync_staging.data();
  const auto put = [&](size_t off, const auto& v) {
    if (!v.empty()) std::memcpy(h + off, v.data(), v.size() * sizeof(v[0]));
  };
  put(o_lists, P.lists);
  put(o_sel, P.sel);
  put(o_streams, P.streams);
  put(o_tasks, P.tasks);
  put(o_merges, P.merges);
  put(o_unions, P.unions);
  if (!stream)
    return cuda_status(cudaMemcpy(base, h, total, cudaMemcpyHostToDevice),
                       "cuda plan: launch metadata");
  CISA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(base, h, total, cudaMemcpyHostToDevice, stream),
                                   "cuda plan: launch metadata"));
  return cuda_status(cudaEventRecord(P.meta_copied, stream), "cuda plan: metadata event");
}

// Whether scoring and top-k run fused (select_fused.cuh), and in clusters of what size: lists
// that are each alone in their stream, with mean representatives.
Status plan_fused_select(Plan::Impl& P) {
  P.fused_cluster = 0;
  const int want = P.options.fused_select_cluster;
  const bool applies =
      !P.quest && !P.streams.empty() && P.max_stream_lists == 1 && P.streams.size() == P.sel.size();
  if (want == 0 || !applies) return Status::Ok();
  if (P.reuse_candidates > 0) {
    if (want < 0) return Status::Ok();  // auto: the two kernels, which skip kept lists
    return unimplemented(
        "cuda: PlanOptions::fused_select_cluster with selection reuse (reuse_steps > 1) is not "
        "supported; use 0 or -1");
  }
  const int64_t lists = static_cast<int64_t>(P.streams.size());
  if (want < 0) {
    P.fused_cluster =
        detail::fused_select_cluster(lists, P.max_score_span, P.head_dim, device_sms());
    return Status::Ok();
  }
  // A forced size: one list on `want` SMs asks for a cluster of exactly `want`, and comes back
  // smaller where that does not fit.
  if (detail::fused_select_cluster(1, P.max_score_span, P.head_dim, want) < want)
    return invalid_argument("cuda: PlanOptions::fused_select_cluster = " + std::to_string(want) +
                            " cannot run this plan (head_dim " + std::to_string(P.head_dim) +
                            ", longest eligible range " + std::to_string(P.max_score_span) +
                            " chunks)");
  P.fused_cluster = want;
  return Status::Ok();
}

// Sizes the lists (already described in P.lists), score streams, attention work; uploads.
Status finish_plan(Plan::Impl& P) {
  int64_t out = 0, score = 0;
  P.sel.clear();
  P.max_fixed = 0;
  for (size_t i = 0; i < P.lists.size(); ++i) {
    auto& d = P.lists[i];
    d.out_begin = out;
    P.max_fixed =
        std::max<int64_t>(P.max_fixed, (d.pre_end - d.pre_begin) + (d.post_end - d.post_begin));
    out += (d.pre_end - d.pre_begin) + d.k + (d.post_end - d.post_begin);
    d.score_begin = score;
    if (d.k > 0) {
      score += d.elig_end - d.elig_begin;
      P.sel.push_back(static_cast<int32_t>(i));
    }
  }
  P.total_pages = out;
  P.score_total = score;
  // Score streams: the selecting lists of one (entry, KV group) are consecutive groups.
  P.streams.clear();
  P.max_score_span = 0;
  P.max_stream_lists = 0;
  const int H = P.num_kv_heads;
  for (size_t gi = 0; gi < P.groups.size();) {
    size_t gj = gi;
    while (gj < P.groups.size() && P.groups[gj].entry == P.groups[gi].entry) ++gj;
    size_t s0 = gi;
    while (s0 < gj && P.lists[s0 * static_cast<size_t>(H)].k == 0) ++s0;
    if (s0 < gj) {
      for (int g = 0; g < H; ++g) {
        const auto& first = P.lists[s0 * static_cast<size_t>(H) + static_cast<size_t>(g)];
        const auto& last = P.lists[(gj - 1) * static_cast<size_t>(H) + static_cast<size_t>(g)];
        ScoreStream s{first.table_begin,
                      static_cast<int32_t>(s0 * static_cast<size_t>(H) + static_cast<size_t>(g)),
                      static_cast<int32_t>(gj - s0),
                      H,
                      g,
                      first.elig_begin,
                      last.elig_end};
        P.streams.push_back(s);
        P.max_stream_lists = std::max(P.max_stream_lists, s.num_lists);
        P.max_score_span = std::max<int32_t>(P.max_score_span, s.elig_end_max - s.elig_begin);
      }
    }
    gi = gj;
  }
  // Launch bounds that grow with the sequences, rounded up (the kernels check each list's and
  // stream's own range): the assembly grid is unchanged by this, the scoring grid gains at most
  // one block of early exits, and a decode batch keeps its launch arguments for many steps.
  P.max_fixed = (P.max_fixed + kFixedQuantum - 1) / kFixedQuantum * kFixedQuantum;
  P.max_score_span = (P.max_score_span + kSpanQuantum - 1) / kSpanQuantum * kSpanQuantum;
  CISA_RETURN_IF_ERROR(plan_fused_select(P));
  CISA_RETURN_IF_ERROR(plan_attention(P));
  CISA_RETURN_IF_ERROR(upload_metadata(P));
  const size_t ucap = static_cast<size_t>(std::max<int64_t>(1, P.union_capacity)) * sizeof(int32_t);
  CISA_RETURN_IF_ERROR(P.d_upages.reserve(ucap, "cuda plan: union pages"));
  CISA_RETURN_IF_ERROR(P.d_uchunks.reserve(ucap, "cuda plan: union chunks"));
  CISA_RETURN_IF_ERROR(P.d_umask.reserve(ucap, "cuda plan: union masks"));
  CISA_RETURN_IF_ERROR(P.d_ucounts.reserve(std::max<size_t>(1, P.unions.size()) * sizeof(int32_t),
                                           "cuda plan: union sizes"));
  CISA_RETURN_IF_ERROR(
      P.d_pages.reserve(std::max<int64_t>(1, out) * sizeof(int32_t), "cuda plan: page lists"));
  CISA_RETURN_IF_ERROR(
      P.d_chunks.reserve(std::max<int64_t>(1, out) * sizeof(int32_t), "cuda plan: chunk lists"));
  CISA_RETURN_IF_ERROR(
      P.d_scores.reserve(std::max<int64_t>(1, score) * sizeof(float), "cuda plan: scores"));
  CISA_RETURN_IF_ERROR(P.d_keep.reserve(std::max<size_t>(1, P.lists.size()) * sizeof(int32_t),
                                        "cuda plan: reuse flags"));
  CISA_RETURN_IF_ERROR(
      P.d_qbar.reserve(std::max<size_t>(1, P.lists.size()) * P.head_dim * sizeof(float),
                       "cuda plan: index queries"));
  CISA_RETURN_IF_ERROR(
      P.d_qsplit.reserve(std::max<size_t>(1, P.lists.size()) * 3 * P.head_dim * sizeof(uint16_t),
                         "cuda plan: index queries as bf16 terms"));
  CISA_RETURN_IF_ERROR(
      P.d_partial_out.reserve(std::max<int64_t>(1, P.partial_rows) * P.head_dim * sizeof(float),
                              "cuda plan: split-KV partials"));
  CISA_RETURN_IF_ERROR(P.d_partial_lse.reserve(std::max<int64_t>(1, P.partial_rows) * sizeof(float),
                                               "cuda plan: split-KV partial lse"));
  return Status::Ok();
}

Status start_plan(const DeviceLayer& layer, const DeviceBlockTables& tables,
                  std::span<const BatchEntry> batch, int hq, const PlanOptions& options,
                  Plan* plan) {
  if (!plan) return invalid_argument("cuda: null plan");
  if (options.topk_cluster_min_scores < -1)
    return invalid_argument("cuda: PlanOptions::topk_cluster_min_scores must be >= -1 (got " +
                            std::to_string(options.topk_cluster_min_scores) + ")");
  if (const int c = options.fused_select_cluster; c < -1 || c > 16 || (c > 0 && (c & (c - 1)) != 0))
    return invalid_argument(
        "cuda: PlanOptions::fused_select_cluster must be -1 (auto), 0 (off) or 1, 2, 4, 8, 16 "
        "(got " +
        std::to_string(c) + ")");
  if (options.blocks_per_sm < 0 || options.blocks_per_sm > 1024)
    return invalid_argument("cuda: PlanOptions::blocks_per_sm must be in [0, 1024] (got " +
                            std::to_string(options.blocks_per_sm) + ")");
  if (options.ws_copy_warps != 0 && options.ws_copy_warps != 1)
    return invalid_argument("cuda: PlanOptions::ws_copy_warps must be 0 (default) or 1 (got " +
                            std::to_string(options.ws_copy_warps) + ")");
  CISA_RETURN_IF_ERROR(validate_layer(layer));
  CISA_RETURN_IF_ERROR(validate_batch_tables(tables, batch, hq, layer.num_kv_heads));
  auto& P = *plan->impl();
  P.options = options;
  P.options.reuse_slots = {};  // the caller's memory: plan_sparse reads it, the plan keeps none
  P.params = {};
  P.reuse_candidates = 0;
  P.max_reuse_seq = -1;
  P.num_q_heads = hq;
  P.num_kv_heads = layer.num_kv_heads;
  P.head_dim = layer.head_dim;
  P.quest = layer.rep == RepKind::kQuest;
  P.block_pages = tables.pages;
  P.groups.clear();
  P.lists.clear();
  P.num_rows = 0;
  for (const auto& b : batch) P.num_rows += b.count;
  return Status::Ok();
}

ListDesc make_list(const DeviceBlockTables& tables, std::span<const BatchEntry> batch,
                   const QueryGroup& g, int kv) {
  ListDesc d{};
  d.table_begin = tables.offsets[static_cast<size_t>(batch[static_cast<size_t>(g.entry)].seq)];
  d.q_row = g.row;
  d.first_pos = static_cast<int32_t>(g.first);
  d.last_pos = static_cast<int32_t>(g.last);
  d.kv = kv;
  d.reuse_seq = -1;
  return d;
}

}  // namespace

Status plan_dense(const DeviceLayer& layer, const DeviceBlockTables& tables,
                  std::span<const BatchEntry> batch, int num_q_heads, int64_t sliding_window,
                  Plan* plan, const PlanOptions& options) {
  CISA_RETURN_IF_ERROR(start_plan(layer, tables, batch, num_q_heads, options, plan));
  if (sliding_window < 0) return invalid_argument("cuda: sliding_window must be >= 0");
  auto& P = *plan->impl();
  P.group_unions = false;
  int64_t row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto& b = batch[e];
    const ChunkRange r = dense_chunk_range(b, kB, sliding_window);
    P.groups.push_back({static_cast<int32_t>(e), b.first, b.first + b.count - 1, row, true});
    row += b.count;
    for (int g = 0; g < layer.num_kv_heads; ++g) {
      ListDesc d = make_list(tables, batch, P.groups.back(), g);
      d.pre_begin = static_cast<int32_t>(r.begin);
      d.pre_end = static_cast<int32_t>(r.end);
      d.window = static_cast<int32_t>(sliding_window);
      P.lists.push_back(d);
    }
  }
  return finish_plan(P);
}

Status plan_sparse(const DeviceLayer& layer, const DeviceBlockTables& tables,
                   std::span<const BatchEntry> batch, int num_q_heads, const SelectionParams& p,
                   Plan* plan, const PlanOptions& options) {
  CISA_RETURN_IF_ERROR(validate_selection_params(p));
  const bool reusing = p.reuse_steps > 1;
  if (reusing && options.reuse_slots.size() != batch.size())
    return invalid_argument(
        "cuda plan_sparse: selection reuse (reuse_steps > 1) needs "
        "PlanOptions::reuse_slots, one per batch entry (got " +
        std::to_string(options.reuse_slots.size()) + " for " + std::to_string(batch.size()) +
        " entries)");
  if (reusing) {
    for (const int32_t slot : options.reuse_slots)
      if (slot < -1)
        return invalid_argument("cuda plan_sparse: a reuse slot must be >= -1 (got " +
                                std::to_string(slot) + ")");
    if (Status s = validate_reuse_rows(batch, p, options.reuse_slots); !s.ok())
      return invalid_argument("cuda plan_sparse: " + s.message());
  }
  CISA_RETURN_IF_ERROR(start_plan(layer, tables, batch, num_q_heads, options, plan));
  if (!layer.reps) return invalid_argument("cuda: the layer has no representative pointer");
  auto& P = *plan->impl();
  P.group_unions = options.group_unions;
  P.params = p;
  // Query groups and list layout are the core's (plan.h).
  PageLists cut;
  CISA_RETURN_IF_ERROR(plan_query_groups(kB, batch, p, &cut));
  P.groups = std::move(cut.groups);
  for (const auto& grp : P.groups) {
    const ListLayout l = list_layout(grp, kB, p);
    for (int g = 0; g < layer.num_kv_heads; ++g) {
      ListDesc d = make_list(tables, batch, grp, g);
      d.pre_begin = static_cast<int32_t>(l.fixed_begin);
      d.pre_end = static_cast<int32_t>(l.fixed_end);
      if (!grp.dense) {
        d.elig_begin = static_cast<int32_t>(l.eligible_begin);
        d.elig_end = static_cast<int32_t>(l.eligible_end);
        d.k = static_cast<int32_t>(l.selected);
        d.post_begin = static_cast<int32_t>(l.tail_begin);
        d.post_end = static_cast<int32_t>(l.tail_end);
        const int64_t last_row = grp.row + (grp.last - grp.first);
        d.qbar_row0 =
            static_cast<int32_t>(p.qshare_query == QShareQuery::kMean ? grp.row : last_row);
        d.qbar_row1 = static_cast<int32_t>(last_row);
        // A decode row (an entry of one position) may keep an earlier selection (plan.h).
        const BatchEntry& e = batch[static_cast<size_t>(grp.entry)];
        if (reusing && e.count == 1 && d.k > 0) {
          d.reuse_seq = options.reuse_slots[static_cast<size_t>(grp.entry)];
          if (d.reuse_seq >= 0) {
            ++P.reuse_candidates;
            P.max_reuse_seq = std::max(P.max_reuse_seq, d.reuse_seq);
          }
        }
      }
      P.lists.push_back(d);
    }
  }
  return finish_plan(P);
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

detail::ReuseParams reuse_params(const Plan::Impl& P) {
  return {P.params.budget, P.params.window, P.params.sink_pages, P.params.reuse_steps,
          P.params.reuse_check == ReuseCheck::kNewChunks ? 1 : 0};
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
    case SelectStage::kScore:
      if (P.sel.empty()) return Status::Ok();
      if (!index_q)
        return invalid_argument("cuda: null index query pointer for a plan that selects");
      if (!layer.reps) return invalid_argument("cuda: the layer has no representative pointer");
      if (reuse)  // index queries, and which decode lists keep their selection (pages written)
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_reuse_decide(P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()),
                                        P.block_pages, layer.reps, P.quest, index_q,
                                        P.d_qbar.as<float>(), P.d_qsplit.as<uint16_t>(),
                                        P.num_kv_heads, P.head_dim, reuse_params(P), *reuse, keep,
                                        P.d_pages.as<int32_t>(), P.d_chunks.as<int32_t>(), s),
            "cuda: selection reuse decision"));
      else
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_index_queries(P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()),
                                         index_q, P.num_kv_heads, P.head_dim, P.d_qbar.as<float>(),
                                         P.d_qsplit.as<uint16_t>(), s),
            "cuda: index queries"));
      if (P.fused_cluster > 0)  // scores and the selected part of every list (kTopK: unions only)
        return cuda_status(
            detail::launch_select_fused(P.d_streams, static_cast<int64_t>(P.streams.size()),
                                        P.fused_cluster, P.max_score_span, P.d_lists, P.block_pages,
                                        layer.reps, P.d_qbar.as<float>(), P.num_kv_heads,
                                        P.head_dim, P.d_scores.as<float>(), P.d_pages.as<int32_t>(),
                                        P.d_chunks.as<int32_t>(), s),
            "cuda: fused scoring and top-k");
      return cuda_status(detail::launch_score(P.d_streams, static_cast<int64_t>(P.streams.size()),
                                              P.max_score_span, P.max_stream_lists, P.d_lists,
                                              P.block_pages, layer.reps, P.d_qbar.as<float>(),
                                              P.d_qsplit.as<uint16_t>(), P.num_kv_heads, P.head_dim,
                                              P.quest, P.d_scores.as<float>(), keep, s),
                         "cuda: scoring");
    case SelectStage::kTopK:
      if (P.sel.empty()) return Status::Ok();
      if (P.fused_cluster == 0)
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_topk(
                P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()), P.max_score_span,
                P.options.topk_cluster_min_scores < 0 ? tiles::kTopkClusterMinScores
                                                      : P.options.topk_cluster_min_scores,
                P.d_scores.as<float>(), P.block_pages, P.d_pages.as<int32_t>(),
                P.d_chunks.as<int32_t>(), keep, s),
            "cuda: top-k"));
      if (reuse)  // fresh selections of decode rows become their sequences' state
        CISA_RETURN_IF_ERROR(cuda_status(
            detail::launch_reuse_commit(P.d_lists, P.d_sel, static_cast<int64_t>(P.sel.size()),
                                        P.num_kv_heads, reuse_params(P), *reuse, keep,
                                        P.d_chunks.as<int32_t>(), s),
            "cuda: selection reuse state"));
      return cuda_status(
          detail::launch_build_unions(
              P.d_unions, static_cast<int64_t>(P.unions.size()), P.union_smem, P.d_lists,
              P.d_chunks.as<int32_t>(), P.block_pages, P.d_upages.as<int32_t>(),
              P.d_uchunks.as<int32_t>(), P.d_umask.as<int32_t>(), P.d_ucounts.as<int32_t>(), s),
          "cuda: union lists");
  }
  return invalid_argument("cuda: unknown selection stage");
}

Status run_select(const Plan& plan, const DeviceLayer& layer, const float* index_q, void* stream,
                  const ReuseState* reuse) {
  CISA_RETURN_IF_ERROR(run_select_stage(plan, layer, index_q, SelectStage::kSetup, stream, reuse));
  CISA_RETURN_IF_ERROR(run_select_stage(plan, layer, index_q, SelectStage::kScore, stream, reuse));
  return run_select_stage(plan, layer, index_q, SelectStage::kTopK, stream, reuse);
}

Status run_attention(const Plan& plan, const DeviceLayer& layer, const uint16_t* q, float scale,
                     float* out, float* lse, void* stream) {
  const auto& P = *plan.impl();
  if (!q || !out) return invalid_argument("cuda: null query or output pointer");
  if (layer.num_kv_heads != P.num_kv_heads || layer.head_dim != P.head_dim || !layer.k || !layer.v)
    return invalid_argument("cuda: the layer does not have the shape the plan was built for");
  detail::AttentionArgs a{};
  a.k = layer.k;
  a.v = layer.v;
  a.q = q;
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
  a.num_kv_heads = P.num_kv_heads;
  a.num_q_heads = P.num_q_heads;
  a.head_dim = P.head_dim;
  a.window = P.lists.empty() ? 0 : P.lists[0].window;
  a.scale = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(P.head_dim));
  auto s = static_cast<cudaStream_t>(stream);
  const auto n_tasks = static_cast<int64_t>(P.tasks.size());
  // The wgmma kernel folds the scale into its exponent, which needs it positive.
  CISA_RETURN_IF_ERROR(cuda_status(
      P.wgmma && a.scale > 0.0f
          ? detail::launch_attention_wgmma(a, n_tasks, P.warps,
                                           P.options.attention_kernel == AttentionKernel::kWgmmaV5,
                                           P.options.ws_copy_warps, s)
          : detail::launch_attention(a, n_tasks, P.warps, P.page_warps, !P.unions.empty(), s),
      "cuda: attention"));
  return cuda_status(
      detail::launch_merge(a, static_cast<int64_t>(P.merges.size()), P.merge_max_rows, s),
      "cuda: split-KV merge");
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
                          int64_t{P.wgmma},
                          static_cast<int64_t>(P.options.attention_kernel),
                          int64_t{P.options.ws_copy_warps},
                          int64_t{P.options.topk_cluster_min_scores},
                          int64_t{P.fused_cluster},
                          rp.budget,
                          rp.window,
                          rp.sink_pages,
                          rp.reuse_steps,
                          int64_t{rp.check_new_chunks},
                          int64_t{P.lists.empty() ? 0 : P.lists[0].window}})
    mix(static_cast<uint64_t>(v));
  for (const void* p : std::initializer_list<const void*>{
           static_cast<const void*>(P.block_pages), P.d_meta.as<void>(), P.d_pages.as<void>(),
           P.d_chunks.as<void>(), P.d_scores.as<void>(), P.d_qbar.as<void>(), P.d_qsplit.as<void>(),
           P.d_partial_out.as<void>(), P.d_partial_lse.as<void>(), P.d_upages.as<void>(),
           P.d_uchunks.as<void>(), P.d_umask.as<void>(), P.d_ucounts.as<void>(),
           P.d_keep.as<void>()})
    ptr(p);
  return h;
}

Status run_update_reps(const DeviceLayer& layer, const int32_t* pages, int64_t n, void* stream) {
  CISA_RETURN_IF_ERROR(validate_layer(layer));
  if (!layer.reps) return invalid_argument("cuda: the layer has no representative pointer");
  if (n < 0 || n > std::numeric_limits<int32_t>::max())
    return invalid_argument("cuda: page count out of range");
  if (n > 0 && !pages) return invalid_argument("cuda: null page pointer");
  return cuda_status(
      detail::launch_update_reps(layer.k, layer.reps, pages, n, layer.num_kv_heads, layer.head_dim,
                                 layer.rep == RepKind::kQuest, static_cast<cudaStream_t>(stream)),
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
