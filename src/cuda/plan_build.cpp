// Host side of the CUDA backend, planning: validation of the layer and the batch, query groups
// and list layout from the core (plan.h), list descriptors, launch bounds and the metadata upload
// (plan_dense, plan_sparse). The attention work decomposition is plan_attention.cpp; the run
// step's launch sequences are backend.cpp.
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

// The device's exponent bytes (plan_types.h) cover every exponent the core's rule gives.
static_assert(detail::kRepExpMin == kMinRepScaleExp, "the scale exponent floors must agree");

int topk_cluster_min_scores(const PlanOptions& options) {
  return options.topk_cluster_min_scores < 0 ? tiles::kTopkClusterMinScores
                                             : options.topk_cluster_min_scores;
}

Status validate_layer(const DeviceLayer& layer) {
  if (!layer.k || !layer.v) return invalid_argument("cuda: the layer's K or V pointer is null");
  if (layer.page_size != tiles::kPageSize)
    return unimplemented("cuda: page_size " + std::to_string(layer.page_size) +
                         " is not supported (the kernels need 16)");
  if (layer.head_dim != 64 && layer.head_dim != 128 && layer.head_dim != 256)
    return unimplemented("cuda: head_dim " + std::to_string(layer.head_dim) +
                         " is not supported (64, 128 or 256)");
  if (layer.rep == RepKind::kMoment)
    return unimplemented(
        "cuda: moment representatives (mean and variance) are implemented on the CPU backend only");
  if (layer.rep_precision == RepPrecision::kFp8)
    return unimplemented(
        "cuda: fp8 representatives are implemented on the CPU backend only (use int8: the same "
        "quality in docs/eval/results.md, and a cheaper conversion in the scoring kernels)");
  if (layer.rep_precision == RepPrecision::kInt8 && layer.reps && !layer.rep_exps)
    return invalid_argument("cuda: int8 representatives need the rep_exps pointer");
  if (layer.num_kv_heads <= 0) return invalid_argument("cuda: num_kv_heads must be positive");
  if (layer.num_pages <= 0 || layer.num_pages > std::numeric_limits<int32_t>::max())
    return invalid_argument("cuda: num_pages must be in [1, 2^31)");
  return Status::Ok();
}

namespace {

constexpr int kB = tiles::kPageSize;
// Rounding of ListDesc-derived launch bounds (finish_plan): one assembly block's entries, and the
// scoring kernels' widest block of chunks.
constexpr int64_t kFixedQuantum = int64_t{tiles::kAssembleThreads} * tiles::kAssembleItems;
constexpr int32_t kSpanQuantum = tiles::kScoreFewChunks;

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

// Whether top-k runs v7 (topk_staged.cu: one block a list, keys staged in shared memory), which
// applies where launch_topk would run one block per list and the lists fit its shared memory.
Status plan_topk_staged(Plan::Impl& P) {
  P.topk_staged = false;
  if (!P.options.topk_staged || P.fused_cluster > 0 || P.sel.empty() ||
      !detail::topk_staged_fits(P.max_score_span) ||
      detail::topk_register_clusters(static_cast<int64_t>(P.sel.size()), P.max_score_span,
                                     topk_cluster_min_scores(P.options)))
    return Status::Ok();
  P.topk_staged = true;
  return cuda_status(detail::prepare_topk_staged(P.max_score_span),
                     "cuda plan: top-k shared memory (staged)");
}

// Whether top-k runs register clusters (topk.cu), and how many of them the device runs at once.
Status plan_topk_clusters(Plan::Impl& P) {
  P.topk_clusters = 0;
  if (P.fused_cluster > 0 || P.topk_staged || P.sel.empty() ||
      !detail::topk_register_clusters(static_cast<int64_t>(P.sel.size()), P.max_score_span,
                                      topk_cluster_min_scores(P.options)))
    return Status::Ok();
  P.topk_clusters = detail::prepare_topk_clusters();
  if (P.topk_clusters < 1)
    return internal_error("cuda plan: the top-k cluster kernel cannot run on this device");
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
  P.score_tiles = P.options.score_tiles_per_block > 0 ? P.options.score_tiles_per_block
                                                      : tiles::kScoreFewTilesPerBlock;
  CISA_RETURN_IF_ERROR(plan_fused_select(P));
  CISA_RETURN_IF_ERROR(plan_topk_staged(P));
  CISA_RETURN_IF_ERROR(plan_topk_clusters(P));
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
      P.d_reuse_partials.reserve(detail::reuse_partial_bytes(static_cast<int64_t>(P.lists.size())),
                                 "cuda plan: reuse check partials"));
  CISA_RETURN_IF_ERROR(
      P.d_reuse_tickets.reserve(std::max<size_t>(1, P.lists.size()) * sizeof(uint32_t),
                                "cuda plan: reuse check tickets", /*zero=*/true));
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
  if (P.sm_claims)
    CISA_RETURN_IF_ERROR(P.d_sm_claims.reserve((P.sm_rates.size() + 1) * sizeof(uint32_t),
                                               "cuda plan: SM slot claims", /*zero=*/true));
  if (P.fused_merge)
    CISA_RETURN_IF_ERROR(P.d_merge_tickets.reserve(
        P.merges.size() * sizeof(uint32_t), "cuda plan: split-KV merge tickets", /*zero=*/true));
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
  if (options.score_tiles_per_block < 0 || options.score_tiles_per_block > 1024)
    return invalid_argument("cuda: PlanOptions::score_tiles_per_block must be in [0, 1024] (got " +
                            std::to_string(options.score_tiles_per_block) + ")");
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
  P.sm_rates.assign(options.sm_rates.begin(), options.sm_rates.end());
  P.options.sm_rates = {};  // the caller's memory: the plan keeps its copy
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

}  // namespace cisa::cuda
