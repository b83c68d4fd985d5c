// CudaBackend, part 5: the device state of selection reuse across decode steps (the rule is
// core/plan.h's, the kernels src/cuda/reuse.cu; docs/design.md "Selection reuse across decode
// steps"). State slots are SeqIds (a PageTable id stays with its sequence while the rows of the
// block-table mirror move), layers are numbered among those with representatives.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <string>

#include "model_backend_impl.h"

namespace cisa::cuda {

Status CudaBackend::ensure_reuse_state(int64_t seqs, int64_t budget) {
  if (reuse_layer_slot_.empty()) {
    reuse_layer_slot_.assign(static_cast<size_t>(config_.num_layers), -1);
    int32_t n = 0;
    for (int l = 0; l < config_.num_layers; ++l)
      if (layer_has_reps(l)) reuse_layer_slot_[static_cast<size_t>(l)] = n++;
    reuse_.num_layer_slots = n;
  }
  if (!reuse_counters_.get()) {
    CISA_RETURN_IF_ERROR(
        reuse_counters_.reserve(4 * sizeof(int64_t), "selection reuse counters", stream_));
    CISA_RETURN_IF_ERROR(
        check_cuda(cudaMemsetAsync(reuse_counters_.get(), 0, 4 * sizeof(int64_t), stream_),
                   "selection reuse counters"));
    reuse_.stats = reuse_counters_.as<int64_t>();
  }
  if (seqs <= reuse_.num_seq_slots && budget <= reuse_.k_stride) return Status::Ok();
  // Room for a few more sequences and the larger budget, so growth is rare.
  const int64_t n_seq = std::max<int64_t>(reuse_.num_seq_slots, (seqs + 7) / 8 * 8);
  const int64_t k = std::max<int64_t>(reuse_.k_stride, budget);
  if (k > std::numeric_limits<int32_t>::max())
    return invalid_argument("cuda selection reuse: budget " + std::to_string(k) + " too large");
  const int64_t slots = n_seq * reuse_.num_layer_slots * config_.num_kv_heads;
  DeviceMemory info, chunks;
  CISA_ASSIGN_OR_RETURN(
      info, DeviceMemory::allocate(slots * int64_t{sizeof(ReuseInfo)}, "selection reuse state"));
  CISA_ASSIGN_OR_RETURN(chunks, DeviceMemory::allocate(slots * k * int64_t{sizeof(int32_t)},
                                                       "selection reuse chunks"));
  CISA_RETURN_IF_ERROR(synchronize());  // nothing queued still reads the old state
  reuse_info_ = std::move(info);
  reuse_chunks_ = std::move(chunks);
  reuse_.info = reuse_info_.as<ReuseInfo>();
  reuse_.chunks = reuse_chunks_.as<int32_t>();
  reuse_.num_seq_slots = n_seq;
  reuse_.k_stride = static_cast<int32_t>(k);
  // Every selection dropped: selected_at = −1.
  return check_cuda(
      cudaMemsetAsync(reuse_.info, 0xff, static_cast<size_t>(slots) * sizeof(ReuseInfo), stream_),
      "selection reuse state");
}

ReuseState CudaBackend::reuse_state_for(int layer, bool repeat) const {
  ReuseState st = reuse_;
  st.layer_slot = layer >= 0 && static_cast<size_t>(layer) < reuse_layer_slot_.size()
                      ? reuse_layer_slot_[static_cast<size_t>(layer)]
                      : -1;
  st.repeat = repeat;
  return st;
}

Status CudaBackend::reset_reuse(SeqId seq) {
  CISA_RETURN_IF_ERROR(join_side());  // the state's last update may be on the selection stream
  if (seq < 0) {
    reuse_info_ = DeviceMemory();
    reuse_chunks_ = DeviceMemory();
    reuse_counters_ = DeviceMemory();
    reuse_ = ReuseState{};
    reuse_layer_slot_.clear();
    reuse_stats_seen_ = {};
    return Status::Ok();
  }
  if (!reuse_.info || seq >= reuse_.num_seq_slots) return Status::Ok();  // never held a state
  return reset_reuse_state(reuse_, config_.num_kv_heads, seq, stream_);
}

SelectionReuseStats CudaBackend::selection_reuse_stats() const {
  if (!reuse_.stats || step_mode_ != StepMode::kNone) return reuse_stats_seen_;
  int64_t n[4] = {};
  // The counters' last update may still be on the selection stream (select(), side_).
  if (cudaStreamSynchronize(side_) != cudaSuccess ||
      cudaMemcpyAsync(n, reuse_.stats, sizeof(n), cudaMemcpyDeviceToHost, stream_) != cudaSuccess ||
      cudaStreamSynchronize(stream_) != cudaSuccess) {
    cudaGetLastError();
    return reuse_stats_seen_;
  }
  reuse_stats_seen_ = {.selected = n[0], .reused = n[1], .checked = n[2], .reselected = n[3]};
  return reuse_stats_seen_;
}

}  // namespace cisa::cuda
