// CudaBackend, part 3: attention over the Hopper path of cuda/backend.h.
//
// plan() builds one cuda::Plan per slot and step: the batch is copied with BatchEntry::seq
// replaced by the sequence's row of the device block tables, planned with plan_dense (full or
// sliding window) or plan_sparse (CISA), and the fixed parts of its page lists are written at
// once (SelectStage::kSetup). A plan depends on the batch and block tables, not on a layer's
// K/V, so every layer of the slot reuses it; select() scores and picks one layer's pages,
// attend() only converts q to bf16 and launches attention.
//
// The attention work of a plan is cut for a query-head count, which Backend::plan does not
// receive: the backend learns it from the first attend() and cuts every later plan for it. Until
// then a plan is cut for one query head per KV head; the first attend() with another count
// re-plans the slot (and re-selects from a copy of the index queries select() kept; decode rows
// under selection reuse repeat what the first selection chose or kept).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "model_backend_impl.h"
#include "model_ops.cuh"

namespace cisa::cuda {
namespace {

const char* slot_name(PlanSlot s) {
  switch (s) {
    case PlanSlot::kGlobal:
      return "global";
    case PlanSlot::kSliding:
      return "sliding";
    case PlanSlot::kCisa:
      return "cisa";
  }
  return "?";
}

}  // namespace

CudaBackend::Slot* CudaBackend::find_slot(PlanSlot slot) {
  const auto i = static_cast<size_t>(slot);
  return i < slots_.size() ? &slots_[i] : nullptr;
}

const CudaBackend::Slot* CudaBackend::find_slot(PlanSlot slot) const {
  const auto i = static_cast<size_t>(slot);
  return i < slots_.size() ? &slots_[i] : nullptr;
}

Status CudaBackend::build_plan(Slot& s, int q_heads) {
  // Inside a recorded or replayed step a plan cannot change (the graph holds its launches).
  if (step_mode_ == StepMode::kCapture || step_mode_ == StepMode::kReplay)
    return internal_error("cuda: a slot would be planned again inside a recorded step");
  // The launch metadata goes up on the stream from page-locked staging: no host wait.
  const PlanOptions plan_options{.mixed_tiles = mixed_tiles_,
                                 .reuse_slots = s.reuse_slots,
                                 .batch_invariant = batch_invariant_,
                                 .upload_stream = stream_};
  if (s.spec.kind == PlanKind::kDense) {
    CISA_RETURN_IF_ERROR(plan_dense(device_layer(0), device_tables(), s.mapped, q_heads,
                                    s.spec.sliding_window, &s.plan, plan_options));
  } else {
    int rep_layer = 0;
    while (rep_layer < config_.num_layers && !layer_has_reps(rep_layer)) ++rep_layer;
    if (rep_layer == config_.num_layers)
      return failed_precondition(
          "cuda plan: a CISA plan needs a layer with representatives (KvCacheConfig::rep_layers "
          "marks none)");
    CISA_RETURN_IF_ERROR(plan_sparse(device_layer(rep_layer), device_tables(), s.mapped, q_heads,
                                     s.spec.selection, &s.plan, plan_options));
  }
  s.q_heads = q_heads;
  // Dense ranges, sinks, window and tail of every list: the same for every layer of the step.
  return run_select_stage(s.plan, device_layer(0), nullptr, SelectStage::kSetup, stream_);
}

Status CudaBackend::check_plan_current(const Slot& s, const char* op) const {
  if (s.mirror_generation != mirror_generation_)
    return failed_precondition(
        std::string("cuda ") + op +
        ": the block tables changed after the slot was planned (a later plan() saw a "
        "reserve or release); plan the slot again");
  return Status::Ok();
}

Status CudaBackend::plan(PlanSlot slot, std::span<const BatchEntry> batch, const PlanSpec& spec) {
  CISA_RETURN_IF_ERROR(require_cache("plan"));
  CISA_RETURN_IF_ERROR(join_side());  // the plan's lists may still be written on side_
  Slot* s = find_slot(slot);
  if (!s) return invalid_argument("cuda plan: unknown slot");
  s->planned = false;
  s->selected = false;
  s->selected_layer = -1;
  s->saved_valid = false;
  if (batch.empty()) return invalid_argument("cuda plan: empty batch");
  if (spec.sliding_window < 0) return invalid_argument("cuda plan: sliding_window must be >= 0");
  if (spec.kind == PlanKind::kCisa) CISA_RETURN_IF_ERROR(validate_selection_params(spec.selection));
  for (size_t e = 0; e < batch.size(); ++e) {
    const BatchEntry& b = batch[e];
    const std::string where = "cuda plan: batch entry " + std::to_string(e) + ": ";
    CISA_RETURN_IF_ERROR(table_.check_sequence(b.seq));
    if (b.first < 0) return invalid_argument(where + "negative first position");
    if (b.count <= 0) return invalid_argument(where + "query count must be positive");
    CISA_ASSIGN_OR_RETURN(const int64_t reserved, table_.reserved(b.seq));
    if (b.first + b.count > reserved)
      return out_of_range(where + "queries up to position " +
                          std::to_string(b.first + b.count - 1) + " but sequence " +
                          std::to_string(b.seq) + " has " + std::to_string(reserved) +
                          " tokens reserved");
  }
  CISA_RETURN_IF_ERROR(sync_block_tables());
  // Selection reuse (docs/design.md): decode rows keep their sequence's selection per layer in
  // the device state, slot = SeqId.
  s->reuse_slots.clear();
  if (spec.kind == PlanKind::kCisa && spec.selection.reuse_steps > 1) {
    SeqId top = 0;
    for (const BatchEntry& b : batch) {
      top = std::max(top, b.seq);
      s->reuse_slots.push_back(static_cast<int32_t>(b.seq));
    }
    CISA_RETURN_IF_ERROR(ensure_reuse_state(int64_t{top} + 1, spec.selection.budget));
  }
  s->spec = spec;
  s->batch.assign(batch.begin(), batch.end());
  s->mapped = s->batch;
  s->rows = 0;
  for (BatchEntry& b : s->mapped) {
    b.seq = seq_row_[static_cast<size_t>(b.seq)];
    s->rows += b.count;
  }
  s->mirror_generation = mirror_generation_;
  s->q_heads_known = known_q_heads_ > 0;
  CISA_RETURN_IF_ERROR(build_plan(*s, s->q_heads_known ? known_q_heads_ : config_.num_kv_heads));
  s->planned = true;
  return Status::Ok();
}

const std::vector<QueryGroup>& CudaBackend::plan_groups(PlanSlot slot) const {
  static const std::vector<QueryGroup> kNone;
  const Slot* s = find_slot(slot);
  return s && s->planned ? s->plan.groups() : kNone;
}

Status CudaBackend::check_written(const Slot& s, int layer, const char* op, bool selection) const {
  // The core's rule (plan.h): attention needs every query's K/V, a selection only the K/V before
  // each entry's last query.
  const Status st = selection ? validate_selection_batch(table_, layer, s.batch)
                              : validate_batch(table_, layer, s.batch);
  if (st.ok()) return st;
  return Status(st.code(), std::string("cuda ") + op + ": " + st.message());
}

Status CudaBackend::select(PlanSlot slot, int layer, const float* index_q) {
  CISA_RETURN_IF_ERROR(join_side());
  Slot* s = find_slot(slot);
  if (!s || !s->planned || s->spec.kind != PlanKind::kCisa)
    return failed_precondition("cuda select: the slot has no CISA plan for this step");
  CISA_RETURN_IF_ERROR(check_written(*s, layer, "select", /*selection=*/true));
  if (!layer_has_reps(layer))
    return failed_precondition("cuda select: layer " + std::to_string(layer) +
                               " keeps no representatives (KvCacheConfig::rep_layers)");
  CISA_RETURN_IF_ERROR(check_plan_current(*s, "select"));
  const bool selects = s->plan.selected_lists() > 0;
  if (selects && !index_q) return invalid_argument("cuda select: null index query pointer");
  // Scores and top-k only: plan() wrote the fixed parts of every list (SelectStage::kSetup),
  // which no layer's selection overwrites.
  // Decode rows that may keep their selection decide on the device (reuse.cuh).
  const bool reusing = s->plan.reuse_candidates() > 0;
  const ReuseState reuse = reuse_state_for(layer, /*repeat=*/false);
  const ReuseState* rs = reusing ? &reuse : nullptr;
  // The representatives' pointers and precision too: a new cache of the other precision may
  // reuse the old pools' addresses, and a bf16 scoring kernel must not replay on int8 codes.
  const DeviceLayer dl = device_layer(layer);
  const bool skip =
      graph_skip(11, {plan_launch_key(s->plan), arg(int64_t{layer}), arg(index_q),
                      arg(reusing ? reuse.info : nullptr), arg(int64_t{reuse.layer_slot}),
                      arg(dl.reps), arg(dl.rep_exps), arg(static_cast<int64_t>(dl.rep_precision))});
  keep_bf16_copy({}, {});  // writes no activations (the early selection's q/k/v product follows)
  if (!skip) {
    CISA_RETURN_IF_ERROR(run_select_stage(s->plan, dl, index_q, SelectStage::kScore, stream_, rs));
    // A decode step's top-k (and the reuse state's update) on the selection stream: what the
    // caller enqueues next, up to the attend() that joins it, runs beside it (side_, above).
    const bool decode = s->rows == static_cast<int64_t>(s->batch.size());
    if (decode && selects) CISA_RETURN_IF_ERROR(fork_side());
    CISA_RETURN_IF_ERROR(run_select_stage(s->plan, dl, index_q, SelectStage::kTopK,
                                          side_pending_ ? side_ : stream_, rs));
  }
  if (selects && !s->q_heads_known) {
    // Kept for the re-plan of the first attend (see the top of this file).
    const int64_t bytes =
        s->rows * config_.num_kv_heads * config_.head_dim * int64_t{sizeof(float)};
    CISA_RETURN_IF_ERROR(s->saved_index_q.reserve(bytes, "saved index queries", stream_));
    CISA_RETURN_IF_ERROR(
        check_cuda(cudaMemcpyAsync(s->saved_index_q.get(), index_q, static_cast<size_t>(bytes),
                                   cudaMemcpyDeviceToDevice, stream_),
                   "cuda select: saving the index queries"));
    s->saved_valid = true;
  }
  s->selected = true;
  s->selected_layer = layer;
  return Status::Ok();
}

Status CudaBackend::set_page_lists(PlanSlot slot, const PageLists& lists) {
  return unimplemented(
      std::string("cuda set_page_lists (slot ") + slot_name(slot) +
      "): host page lists from a PageSelector are not supported on the CUDA backend; use "
      "select(), or the CPU backend");
}

Status CudaBackend::attend(PlanSlot slot, int layer, const float* q, int num_q_heads,
                           const AttendParams& p, float* out) {
  CISA_RETURN_IF_ERROR(join_side());  // the selection's top-k (select())
  Slot* s = find_slot(slot);
  if (!s || !s->planned)
    return failed_precondition("cuda attend: the slot is not planned for this step");
  if (p.numerics == AttentionNumerics::kLlamaCpp)
    return unimplemented(
        "cuda attend: AttentionNumerics::kLlamaCpp (llama.cpp's f16 rounding order) runs on the "
        "CPU backend only");
  CISA_RETURN_IF_ERROR(check_written(*s, layer, "attend", /*selection=*/false));
  CISA_RETURN_IF_ERROR(check_plan_current(*s, "attend"));
  const int hkv = config_.num_kv_heads;
  if (num_q_heads <= 0 || num_q_heads % hkv != 0)
    return invalid_argument("cuda attend: " + std::to_string(num_q_heads) +
                            " query heads are not a positive multiple of " + std::to_string(hkv) +
                            " KV heads");
  if (!q || !out) return invalid_argument("cuda attend: null query or output pointer");
  // The window is part of the plan (its page lists and the kernels' mask).
  const int64_t window = s->spec.kind == PlanKind::kDense ? s->spec.sliding_window : 0;
  if (p.sliding_window != window)
    return invalid_argument("cuda attend: sliding_window " + std::to_string(p.sliding_window) +
                            " differs from the slot's planned window " + std::to_string(window));
  const bool cisa = s->spec.kind == PlanKind::kCisa;
  if (cisa && s->selected_layer != layer)
    return failed_precondition("cuda attend: no page lists selected for layer " +
                               std::to_string(layer) + " (call select() for it first)");
  if (num_q_heads != s->q_heads) {
    if (cisa && s->plan.selected_lists() > 0 && !s->saved_valid)
      return failed_precondition("cuda attend: the query-head count changed from " +
                                 std::to_string(s->q_heads) + " to " + std::to_string(num_q_heads) +
                                 " after select(); plan the slot again");
    CISA_RETURN_IF_ERROR(build_plan(*s, num_q_heads));
    // The selection again, for the new plan's lists: decode rows under reuse take what this step
    // already chose or kept (ReuseState::repeat), without touching the state a second time.
    const ReuseState repeat = reuse_state_for(s->selected_layer, /*repeat=*/true);
    if (cisa && s->plan.selected_lists() > 0)
      CISA_RETURN_IF_ERROR(run_select(s->plan, device_layer(s->selected_layer),
                                      s->saved_index_q.as<float>(), stream_,
                                      s->plan.reuse_candidates() > 0 ? &repeat : nullptr));
  }
  s->q_heads_known = true;
  known_q_heads_ = num_q_heads;
  const int64_t n = s->rows * num_q_heads * config_.head_dim;
  // The kernels round f32 queries to bf16 as they load them (no conversion launch), where they
  // are 8-byte aligned (any buffer of the model's); others go through the staging buffer.
  const bool aligned = reinterpret_cast<uintptr_t>(q) % 8 == 0;
  uint16_t* qb = nullptr;
  if (!aligned) {
    CISA_ASSIGN_OR_RETURN(qb, bf16_scratch(n));
  }
  if (graph_skip(12, {plan_launch_key(s->plan), arg(int64_t{layer}), arg(q), arg(qb), arg(out),
                      arg(p.scale), arg(n)}))
    return Status::Ok();
  if (aligned)
    return run_attention(s->plan, device_layer(layer), q, p.scale, out, nullptr, stream_);
  CISA_RETURN_IF_ERROR(
      launched(detail::launch_f32_to_bf16(q, qb, n, stream_), "attend: queries to bf16"));
  return run_attention(s->plan, device_layer(layer), qb, p.scale, out, nullptr, stream_);
}

Status CudaBackend::page_lists(PlanSlot slot, PageLists* out) {
  if (!out) return invalid_argument("cuda page_lists: null output");
  const Slot* s = find_slot(slot);
  if (!s || !s->planned) return failed_precondition("cuda page_lists: the slot is not planned");
  CISA_RETURN_IF_ERROR(synchronize());
  return cuda::download_page_lists(s->plan, out);
}

}  // namespace cisa::cuda
