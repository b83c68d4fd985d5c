// CudaBackend, part 4: the step bracket (Backend::begin_step / end_step).
//
// begin_step uploads the step's per-row metadata once (append_kv's token slots and the pages the
// step fills, through page-locked staging, no host synchronisation), so the layers' append_kv
// calls launch without uploading. With BackendOptions::step_graphs and a nonzero key from the
// caller, the bracket's operations are also recorded in a CUDA graph and replayed:
//
//   key first seen      run eagerly (every lazy allocation and GEMM algorithm choice happens)
//   key seen again      stream capture of the operations, instantiate, launch the graph
//   key with a graph    replay: operations check their arguments and keep the host bookkeeping
//                       (PageTable::mark_written, slot state) but do not launch; end_step
//                       launches the graph
//
// The full key folds the caller's key (its buffers and row counts) with what the backend's
// launches depend on: each planned slot's cuda::plan_launch_key, the block-table and step
// metadata buffers, the number of filled pages, the bf16 staging buffer and the query-head count.
// Kernels read everything else that changes from step to step (page lists, task descriptors,
// token slots, positions, RoPE tables, tokens) from device buffers that keep their addresses.
// As a check on the key, recording and replay hash every operation's launch arguments; a replay
// whose hash differs from its recording's fails the step (internal) and drops the graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "model_backend_impl.h"

namespace cisa::cuda {
namespace {

constexpr int kPageSize = 16;

uint64_t mix(uint64_t h, uint64_t v) {
  return (h ^ v) * 0x100000001b3ull;
}

}  // namespace

uint64_t CudaBackend::arg(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

bool CudaBackend::graph_skip(uint64_t op, std::initializer_list<uint64_t> args) {
  ++op_count_;
  if (step_mode_ != StepMode::kCapture && step_mode_ != StepMode::kReplay) return false;
  step_hash_ = mix(step_hash_, op);
  for (uint64_t a : args) step_hash_ = mix(step_hash_, a);
  return step_mode_ == StepMode::kReplay;
}

Status CudaBackend::stage_upload(void* dst, const void* src, int64_t bytes, const char* what) {
  if (bytes <= 0) return Status::Ok();
  if (step_mode_ == StepMode::kCapture || step_mode_ == StepMode::kReplay)
    return internal_error(std::string("cuda ") + what +
                          ": an upload inside a recorded step (the step graph would read the "
                          "staging later)");
  const int i = stage_next_;
  stage_next_ = (stage_next_ + 1) % kStageSlots;
  if (!stage_done_[i])
    CISA_RETURN_IF_ERROR(
        check_cuda(cudaEventCreateWithFlags(&stage_done_[i], cudaEventDisableTiming),
                   std::string("cuda ") + what + ": staging event"));
  else
    CISA_RETURN_IF_ERROR(check_cuda(cudaEventSynchronize(stage_done_[i]),
                                    std::string("cuda ") + what + ": staging"));
  if (bytes > stage_bytes_[i]) {
    const int64_t grown = std::max<int64_t>(bytes + bytes / 4, int64_t{64} << 10);
    CISA_RETURN_IF_ERROR(stage_[i].reserve(grown, "cuda: page-locked upload staging"));
    stage_bytes_[i] = grown;
  }
  std::memcpy(stage_[i].get(), src, static_cast<size_t>(bytes));
  CISA_RETURN_IF_ERROR(check_cuda(cudaMemcpyAsync(dst, stage_[i].get(), static_cast<size_t>(bytes),
                                                  cudaMemcpyHostToDevice, stream_),
                                  std::string("cuda ") + what));
  return check_cuda(cudaEventRecord(stage_done_[i], stream_),
                    std::string("cuda ") + what + ": staging event");
}

Status CudaBackend::step_slots(std::span<const BatchEntry> batch, std::vector<int64_t>* slots,
                               std::vector<int32_t>* full_pages) const {
  slots->clear();
  full_pages->clear();
  for (const BatchEntry& b : batch) {
    CISA_ASSIGN_OR_RETURN(std::span<const int32_t> pages, table_.block_table(b.seq));
    for (int64_t i = 0; i < b.count; ++i) {
      const int64_t pos = b.first + i;
      if (pos < 0 || pos / kPageSize >= static_cast<int64_t>(pages.size()))
        return out_of_range("cuda begin_step: position " + std::to_string(pos) + " of sequence " +
                            std::to_string(b.seq) + " has no page reserved");
      const int32_t page = pages[static_cast<size_t>(pos / kPageSize)];
      slots->push_back(int64_t{page} * kPageSize + pos % kPageSize);
      if (pos % kPageSize == kPageSize - 1) full_pages->push_back(page);
    }
  }
  return Status::Ok();
}

Status CudaBackend::begin_step(std::span<const BatchEntry> batch, uint64_t graph_key) {
  if (step_mode_ != StepMode::kNone)
    return failed_precondition("cuda begin_step: the previous step's bracket is still open");
  step_ready_ = false;
  CISA_RETURN_IF_ERROR(require_cache("begin_step"));
  // The step's token slots and filled pages, one upload (a batch whose positions are not
  // reserved yet is left to append_kv, which reports it).
  if (step_slots(batch, &step_slots_, &step_full_pages_).ok() && !step_slots_.empty()) {
    const auto ns = static_cast<int64_t>(step_slots_.size());
    const auto nf = static_cast<int64_t>(step_full_pages_.size());
    step_pages_offset_ = ns * 8;
    const int64_t bytes = step_pages_offset_ + nf * 4;
    if (bytes > d_step_.bytes())
      CISA_RETURN_IF_ERROR(d_step_.reserve(bytes + bytes / 4, "step metadata", stream_));
    std::vector<uint8_t> host(static_cast<size_t>(bytes));
    std::memcpy(host.data(), step_slots_.data(), static_cast<size_t>(ns * 8));
    if (nf > 0)
      std::memcpy(host.data() + step_pages_offset_, step_full_pages_.data(),
                  static_cast<size_t>(nf * 4));
    CISA_RETURN_IF_ERROR(stage_upload(d_step_.get(), host.data(), bytes, "begin_step metadata"));
    step_ready_ = true;
  }
  step_mode_ = StepMode::kEager;
  if (!step_graphs_ || graph_key == 0 || known_q_heads_ == 0 || !step_ready_) {
    ++graph_stats_.eager;
    return Status::Ok();
  }
  uint64_t key = mix(0x84222325cbf29ce4ull, graph_key);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    const bool live = s.planned && s.mirror_generation == mirror_generation_;
    key = mix(key, live ? plan_launch_key(s.plan) ^ (i + 1) : i);
    key = mix(key, live ? static_cast<uint64_t>(s.q_heads) : 0);
  }
  for (const uint64_t v :
       {arg(d_tables_.get()), arg(d_step_.get()), arg(step_pages_offset_),
        static_cast<uint64_t>(step_full_pages_.size()), static_cast<uint64_t>(step_slots_.size()),
        arg(scratch_bf16_.get()), static_cast<uint64_t>(known_q_heads_), arg(reuse_.info),
        arg(reuse_.chunks), static_cast<uint64_t>(reuse_.k_stride),
        static_cast<uint64_t>(reuse_.num_seq_slots)})
    key = mix(key, v);
  step_key_ = key;
  step_hash_ = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < graphs_.size(); ++i) {
    if (graphs_[i].key != key) continue;
    replay_index_ = i;
    step_mode_ = StepMode::kReplay;
    return Status::Ok();
  }
  if (key != pending_key_) {  // first sight: eager, so every lazy choice is made outside capture
    pending_key_ = key;
    ++graph_stats_.eager;
    return Status::Ok();
  }
  const Status began = check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                                  "cuda: step capture");
  if (!began.ok()) {
    step_mode_ = StepMode::kNone;
    return began;
  }
  step_mode_ = StepMode::kCapture;
  return Status::Ok();
}

Status CudaBackend::end_step(bool run) {
  const StepMode mode = step_mode_;
  step_mode_ = StepMode::kNone;
  step_ready_ = false;
  if (mode == StepMode::kNone)
    return failed_precondition("cuda end_step: no step is open (begin_step)");
  if (mode == StepMode::kEager) return join_side();
  if (mode == StepMode::kReplay) {
    if (!run) return Status::Ok();
    StepGraph& g = graphs_[replay_index_];
    if (g.op_hash != step_hash_) {
      cudaGraphExecDestroy(g.exec);
      graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(replay_index_));
      graph_stats_.graphs = static_cast<int64_t>(graphs_.size());
      return internal_error(
          "cuda end_step: the step's operations differ from the ones its graph recorded under "
          "the same key (nothing of this step ran on the device)");
    }
    g.last_use = ++graph_clock_;
    ++graph_stats_.replayed;
    return check_cuda(cudaGraphLaunch(g.exec, stream_), "cuda: step graph replay");
  }
  // Capture. The selection stream's work joins the capture's origin before it ends.
  const Status joined = join_side();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (!run) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return Status::Ok();
  }
  CISA_RETURN_IF_ERROR(joined);
  CISA_RETURN_IF_ERROR(check_cuda(ended, "cuda: step capture"));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CISA_RETURN_IF_ERROR(check_cuda(made, "cuda: step graph instantiation"));
  if (graphs_.size() >= kMaxStepGraphs) {
    auto oldest = std::min_element(
        graphs_.begin(), graphs_.end(),
        [](const StepGraph& a, const StepGraph& b) { return a.last_use < b.last_use; });
    cudaGraphExecDestroy(oldest->exec);
    graphs_.erase(oldest);
  }
  graphs_.push_back(
      {.key = step_key_, .op_hash = step_hash_, .last_use = ++graph_clock_, .exec = exec});
  graph_stats_.graphs = static_cast<int64_t>(graphs_.size());
  ++graph_stats_.captured;
  pending_key_ = 0;
  return check_cuda(cudaGraphLaunch(exec, stream_), "cuda: step graph launch");
}

Status CudaBackend::set_step_graphs(bool on) {
  if (step_mode_ != StepMode::kNone)
    return failed_precondition("cuda set_step_graphs: inside a step (begin_step .. end_step)");
  step_graphs_ = on;
  if (!on) {
    for (StepGraph& g : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    pending_key_ = 0;
  }
  return Status::Ok();
}

StepGraphStats CudaBackend::step_graph_stats() const {
  StepGraphStats s = graph_stats_;
  s.enabled = step_graphs_;
  s.graphs = static_cast<int64_t>(graphs_.size());
  return s;
}

}  // namespace cisa::cuda
