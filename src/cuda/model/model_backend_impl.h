// The CUDA model backend (cisa/cuda/model_backend.h) as a class: CudaBackend implements
// cisa::Backend on one device and one stream. Its parts live in three files:
//   model_backend.cpp            memory, weights, the per-row operations, GEMMs, the factory
//   device_kv_cache.cpp          the paged KV cache: device pools, PageTable, block-table mirror
//   model_backend_attention.cpp  plan / select / attend over the Hopper attention path
//   model_backend_graph.cpp      begin_step / end_step: per-step metadata, step graphs
// Host C++ (C++20); kernels are reached through model_ops.cuh, gemm.h and cuda/backend.h.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/core/page_table.h"
#include "cisa/cuda/backend.h"
#include "gemm.h"

namespace cisa::cuda {

// Status of a CUDA runtime call: memory errors are resource_exhausted, a missing device or
// driver unavailable, anything else internal; clears a non-sticky error so later calls start
// clean.
Status check_cuda(cudaError_t err, const std::string& what);

// Device memory owned by value: freed when destroyed (or replaced).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // cudaMalloc of `bytes` (at least 1): resource_exhausted naming `what`, the bytes needed and
  // the bytes free when the device cannot hold it; nothing else changes.
  static Result<DeviceMemory> allocate(int64_t bytes, const std::string& what);
  // Grow-only: reallocates (contents lost) when smaller than `bytes`, after waiting for `stream`
  // so no queued kernel still reads the old memory.
  Status reserve(int64_t bytes, const std::string& what, cudaStream_t stream);
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// Page-locked host memory (cudaMallocHost) owned by value, grow-only: the staging buffers of
// download(), which the DMA engine writes at full speed and without a driver bounce.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  ~PinnedMemory();
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  // Grows to at least `bytes` (contents lost); the caller makes sure no copy still uses it.
  Status reserve(int64_t bytes, const char* what);
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const BackendOptions& options);
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string description() const override { return description_; }

  // ---- memory (model_backend.cpp) ----
  Result<std::unique_ptr<BackendBuffer>> allocate(int64_t bytes, const char* what) override;
  Status upload(void* dst, const void* host_src, int64_t bytes) override;
  Status download(void* host_dst, const void* src, int64_t bytes) override;
  Status synchronize() override;
  int64_t free_memory() const override;

  // ---- weights (model_backend.cpp) ----
  Result<BackendMatrix> bind_matrix(const WeightView& w) override;
  Result<BackendMatrix> random_matrix(int64_t rows, int64_t cols, uint64_t seed,
                                      float scale) override;
  Result<std::vector<BackendMatrix>> bind_matrices(std::span<const WeightView> ws) override;
  Result<std::vector<BackendMatrix>> random_matrices(std::span<const int64_t> rows, int64_t cols,
                                                     uint64_t first_seed, float scale) override;
  Result<BackendMatrix> bind_owned_matrix(std::vector<float> values, int64_t n_rows,
                                          int64_t n_cols) override;
  Status read_matrix_rows(const BackendMatrix& m, int64_t first_row, int64_t rows,
                          float* host_out) override;
  Result<const float*> bind_vector(std::span<const float> host_values) override;
  int64_t weight_bytes() const override { return weight_bytes_; }

  // ---- operations (model_backend.cpp) ----
  Status embed(const BackendMatrix& table, const int32_t* tokens, int64_t rows, float scale,
               float* x) override;
  Status matmul(const BackendMatrix& w, const float* x, float* y, int64_t rows,
                int64_t ldy) override;
  Status matmul_many(std::span<const BackendMatrix> ws, const float* x, std::span<float* const> ys,
                     int64_t rows) override;
  Status gated_matmul(const BackendMatrix& gate, const BackendMatrix& up, Activation act,
                      const float* x, float* out, float* up_scratch, int64_t rows) override;
  Status add_rms_norm(float* x, const float* o, const float* w, float* xn, int64_t rows, int n,
                      float eps) override;
  Status rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                  float eps) override;
  Status rope(float* x, int64_t rows, int heads, int d, const float* cos, const float* sin,
              RopeStyle style) override;
  Status rope_many(std::span<float* const> xs, std::span<const int> heads, int64_t rows, int d,
                   const float* cos, const float* sin, RopeStyle style) override;
  Status gated_activation(Activation act, const float* gate, const float* up, float* out,
                          int64_t rows, int64_t n) override;
  Status add(float* y, const float* x, int64_t n) override;
  Status round_f16(float* x, int64_t n) override;
  Status mean_heads(const float* q, int64_t rows, int hq, int hkv, int d, float* out) override;
  Status fill_random(float* x, int64_t n, uint64_t seed, float scale) override;
  Status gather_rows(const float* x, std::span<const int64_t> rows, int64_t width,
                     float* out) override;
  Status argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out) override;

  // ---- paged KV cache (device_kv_cache.cpp) ----
  Status create_cache(const KvCacheConfig& config) override;
  const KvCacheConfig& cache_config() const override { return config_; }
  const PageTable& pages() const override { return table_; }
  Result<SeqId> add_sequence() override;
  Status release_sequence(SeqId seq) override;
  Status reserve(SeqId seq, int64_t n) override;
  Status append_kv(int layer, std::span<const BatchEntry> batch, const float* k,
                   const float* v) override;

  // ---- attention (model_backend_attention.cpp) ----
  Status plan(PlanSlot slot, std::span<const BatchEntry> batch, const PlanSpec& spec) override;
  const std::vector<QueryGroup>& plan_groups(PlanSlot slot) const override;
  Status select(PlanSlot slot, int layer, const float* index_q) override;
  Status set_page_lists(PlanSlot slot, const PageLists& lists) override;
  // The slot's lists as the GPU holds them (after select() for a kCisa slot), downloaded after a
  // synchronize(); failed_precondition when the slot is not planned.
  Status page_lists(PlanSlot slot, PageLists* out) override;
  Status attend(PlanSlot slot, int layer, const float* q, int num_q_heads, const AttendParams& p,
                float* out) override;
  std::vector<std::string> gemm_choices() const { return gemm_->describe(); }

  // ---- selection reuse (model_backend_reuse.cpp) ----
  // Counters of the device state (a synchronous download; inside a step bracket the last
  // downloaded values, since a step being recorded cannot wait for the device).
  SelectionReuseStats selection_reuse_stats() const override;

  // ---- steps (model_backend_graph.cpp) ----
  Status begin_step(std::span<const BatchEntry> batch, uint64_t graph_key) override;
  Status end_step(bool run) override;
  StepGraphStats step_graph_stats() const override;
  Status set_step_graphs(bool on);

 private:
  CudaBackend() = default;

  // A matrix bound by bind_matrix / random_matrix: bf16 [n_rows][n_cols] on the device, at
  // `offset` values into its allocation. Matrices bound together (bind_matrices /
  // random_matrices) share one allocation, stacked in order: `stack` is the id of their first
  // matrix, `stack_size` their count, `stack_pos` this one's place (a lone matrix: its own id,
  // 1, 0), so matmul_many can multiply them as one [Σ n_rows][n_cols] matrix.
  struct DeviceMatrix {
    std::shared_ptr<DeviceMemory> mem;
    int64_t offset = 0;
    int64_t n_rows = 0, n_cols = 0;
    int stack = -1, stack_size = 1, stack_pos = 0;
    const uint16_t* data() const { return mem->as<uint16_t>() + offset; }
  };
  Result<const DeviceMatrix*> find_matrix(const BackendMatrix& m, const char* op) const;
  // Checks the shapes of matrices bound together and allocates their stack.
  Result<std::shared_ptr<DeviceMemory>> allocate_stack(std::span<const int64_t> rows, int64_t cols,
                                                       const char* op);
  // The first matrix of ws when ws is one whole stack in order (bind_matrices), else null.
  Result<const DeviceMatrix*> whole_stack(std::span<const BackendMatrix> ws, const char* op) const;
  // One GEMM of a stack's `total` rows into the f32 staging buffer (x converted to bf16 unless the
  // previous operation left it so), then tail(y) launches what reads the product; op and
  // tail_hash identify the operation for step graphs.
  Status stacked_product(const DeviceMatrix& first, int64_t total, const float* x, int64_t rows,
                         uint64_t op, uint64_t tail_hash,
                         const std::function<cudaError_t(const float*)>& tail, const char* what);
  // Records the matrices of a filled stack (rows[i] × cols each, in order) and returns them.
  std::vector<BackendMatrix> add_stack(std::shared_ptr<DeviceMemory> mem,
                                       std::span<const int64_t> rows, int64_t cols);
  // Dequantises a host weight view to bf16 into dst (device, n_rows × n_cols), in chunks.
  Status upload_weights(const WeightView& w, uint16_t* dst);
  // Records that the staging buffer holds xb = bf16(x[0..n)), written by the operation just
  // counted: the next operation, if it is a matmul of x, skips the conversion.
  void note_bf16_copy(const float* x, const uint16_t* xb, int64_t n);
  // Called by an operation that writes only written[i][0..sizes[i]) and not the staging buffer,
  // after its graph_skip: a copy the operation before it left stays valid for the next one.
  void keep_bf16_copy(std::span<float* const> written, std::span<const int64_t> sizes);
  // Whether the previous operation left xb = bf16(x[0..n)) (note_bf16_copy).
  bool holds_bf16_copy(const float* x, const uint16_t* xb, int64_t n) const;
  // rms_norm (o null) and add_rms_norm (x += o first): one kernel, y's bf16 copy noted for the
  // next matmul; op and what name the operation for step graphs and errors.
  Status norm_rows(float* x, const float* o, const float* w, float* y, int64_t rows, int n,
                   float eps, uint64_t op, const char* what);
  // The shared f32 staging buffer of stacked products (matmul_many): n values.
  Result<float*> f32_scratch(int64_t n);
  // The shared bf16 staging buffer (matmul inputs, attention queries, random fills): n values.
  Result<uint16_t*> bf16_scratch(int64_t n);
  Status launched(cudaError_t err, const char* op) const;

  // ---- step graphs and per-step metadata (model_backend_graph.cpp) ----
  // How the operations between begin_step and end_step reach the device.
  enum class StepMode {
    kNone,     // outside a bracket: every operation launches
    kEager,    // in a bracket, launching one by one
    kCapture,  // recorded on the stream into a graph, run at end_step
    kReplay,   // a graph recorded for this key runs at end_step; operations only check and hash
  };
  // While recording or replaying, folds an operation's launch arguments into the step's hash
  // (end_step compares a replay's hash with the recording's); true when the operation must not
  // launch (replay).
  bool graph_skip(uint64_t op, std::initializer_list<uint64_t> args);
  static uint64_t arg(const void* p) { return reinterpret_cast<uint64_t>(p); }
  static uint64_t arg(int64_t v) { return static_cast<uint64_t>(v); }
  static uint64_t arg(float v);
  // Host → device copy through page-locked staging (a ring of kStageSlots buffers, each reused
  // once the copy that last used it is done): no host synchronisation in steady state. Not
  // inside a recorded or replayed step (the graph would read the staging later).
  Status stage_upload(void* dst, const void* src, int64_t bytes, const char* what);
  // Token slots and filled pages of a step's batch as append_kv computes them for a layer whose
  // sequences hold exactly the tokens before each entry (every layer, in a step that appends once
  // per layer).
  Status step_slots(std::span<const BatchEntry> batch, std::vector<int64_t>* slots,
                    std::vector<int32_t>* full_pages) const;

  // ---- KV cache helpers (device_kv_cache.cpp) ----
  Status require_cache(const char* op) const;
  bool layer_has_reps(int layer) const;
  DeviceLayer device_layer(int layer) const;
  // Uploads the block tables of the live sequences (CSR in SeqId order) when the PageTable's
  // version has moved since the last upload; every upload bumps mirror_generation_.
  Status sync_block_tables();
  DeviceBlockTables device_tables() const { return {d_tables_.as<int32_t>(), h_offsets_}; }

  // ---- selection reuse helpers (model_backend_reuse.cpp) ----
  // Grows the state to hold SeqIds below `seqs` and selections of `budget` chunks; a growth
  // moves it and drops every selection (rows then select afresh; the counters stay).
  Status ensure_reuse_state(int64_t seqs, int64_t budget);
  // The state as run_select takes it for `layer` (its slot among the layers with
  // representatives); repeat: ReuseState::repeat.
  ReuseState reuse_state_for(int layer, bool repeat) const;
  // Forgets one sequence's selections (seq >= 0) or every state and counter (seq < 0).
  Status reset_reuse(SeqId seq);

  // ---- attention helpers (model_backend_attention.cpp) ----
  struct Slot {
    bool planned = false;
    PlanSpec spec;
    std::vector<BatchEntry> batch;   // as the caller passed it (PageTable sequence IDs)
    std::vector<BatchEntry> mapped;  // seq = row of the device block tables
    int64_t rows = 0;
    uint64_t mirror_generation = 0;  // block tables the plan's lists index
    int q_heads = 0;                 // the query-head count the plan's work is cut for
    bool q_heads_known = false;      // false: a guess, checked at the first attend
    Plan plan;
    bool selected = false;
    int selected_layer = -1;
    DeviceMemory saved_index_q;  // f32 [rows][num_kv_heads][head_dim], while q_heads is a guess
    bool saved_valid = false;    // saved_index_q holds selected_layer's index queries
    std::vector<int32_t> reuse_slots;  // per batch entry: its SeqId (selection reuse), else empty
  };
  Slot* find_slot(PlanSlot slot);
  const Slot* find_slot(PlanSlot slot) const;
  Status build_plan(Slot& s, int q_heads);
  Status check_plan_current(const Slot& s, const char* op) const;
  // The K/V of the slot's batch are written in `layer`: every query position's (attention), or
  // every one before each entry's last query (selection: validate_selection_batch).
  Status check_written(const Slot& s, int layer, const char* op, bool selection) const;

  // A decode step's top-k runs on side_ (select(): forked after the scores on stream_, joined
  // back before anything that reads the page lists): with Model's early selection it overlaps
  // the layer's q/k/v products, RoPE and the cache append. join_side() makes stream_ wait for
  // what side_ holds; every operation that could read its results calls it first.
  Status fork_side();
  Status join_side();

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t forked_ = nullptr, side_done_ = nullptr;
  bool side_pending_ = false;  // side_ holds work stream_ has not waited for
  std::string description_;
  std::unique_ptr<Gemm> gemm_;

  std::vector<DeviceMatrix> matrices_;
  std::vector<DeviceMemory> vectors_;
  int64_t weight_bytes_ = 0;
  DeviceMemory scratch_bf16_;
  DeviceMemory scratch_f32_;
  DeviceMemory d_gather_rows_;  // int64 [n] row indices of gather_rows
  // download(): two pinned chunks, one filled by the device while the host copies the other out.
  PinnedMemory staging_[2];
  cudaEvent_t staged_[2] = {nullptr, nullptr};

  KvCacheConfig config_;
  bool has_cache_ = false;
  PageTable table_;
  struct LayerPools {
    DeviceMemory k, v;      // bf16 [num_pages][num_kv_heads][16][head_dim]
    DeviceMemory reps;      // [num_pages][num_kv_heads][rep_width] bf16 or int8, rep layers only
    DeviceMemory rep_exps;  // int8 [num_pages][num_kv_heads]: scale exponents, int8 reps only
  };
  std::vector<LayerPools> pools_;
  DeviceMemory d_tables_;           // int32 [h_offsets_.back()]
  std::vector<int32_t> h_tables_;   // host copy of the mirrored block tables
  std::vector<int64_t> h_offsets_;  // CSR offsets, one row per live sequence + 1
  std::vector<int32_t> seq_row_;    // SeqId → row of the mirror, −1 when not live
  bool mirrored_ = false;
  uint64_t mirrored_version_ = 0;
  uint64_t mirror_generation_ = 0;
  std::vector<int64_t> h_slots_;       // append_kv: token slot of every row
  std::vector<int32_t> h_full_pages_;  // append_kv: pages the step filled
  DeviceMemory d_slots_, d_full_pages_;
  // The step's slots and filled pages, uploaded once by begin_step (d_step_: int64 slots, then
  // int32 pages at step_pages_offset_); append_kv uses them when its own match.
  std::vector<int64_t> step_slots_;
  std::vector<int32_t> step_full_pages_;
  DeviceMemory d_step_;
  int64_t step_pages_offset_ = 0;
  bool step_ready_ = false;

  static constexpr int kStageSlots = 4;
  PinnedMemory stage_[kStageSlots];
  int64_t stage_bytes_[kStageSlots] = {};
  cudaEvent_t stage_done_[kStageSlots] = {};
  int stage_next_ = 0;

  bool step_graphs_ = true;       // BackendOptions::step_graphs
  bool batch_invariant_ = false;  // BackendOptions::batch_invariant
  bool mixed_tiles_ = false;      // BackendOptions::mixed_tiles
  StepMode step_mode_ = StepMode::kNone;
  uint64_t step_key_ = 0;     // the bracket's full key (the caller's and the backend's state)
  uint64_t step_hash_ = 0;    // launch arguments of the bracket's operations so far
  uint64_t pending_key_ = 0;  // the last key run eagerly: recorded when it comes again
  struct StepGraph {
    uint64_t key = 0, op_hash = 0, last_use = 0;
    cudaGraphExec_t exec = nullptr;
  };
  std::vector<StepGraph> graphs_;  // at most kMaxStepGraphs, least recently used dropped
  static constexpr size_t kMaxStepGraphs = 8;
  uint64_t graph_clock_ = 0;
  size_t replay_index_ = 0;
  StepGraphStats graph_stats_;
  // Operations so far (graph_skip counts them): matmul reuses the bf16 copy of its input that the
  // previous operation left in the staging buffer (a matmul of the same input, an rms_norm or a
  // gated activation that wrote it; note_bf16_copy); any other operation in between may have
  // changed either.
  uint64_t op_count_ = 0;
  const float* conv_x_ = nullptr;
  const uint16_t* conv_xb_ = nullptr;
  int64_t conv_n_ = 0;
  uint64_t conv_op_ = 0;

  // Selection reuse across decode steps (cuda/backend.h ReuseState): S per (SeqId, layer with
  // representatives, KV group), with the counters; allocated at the first plan with r > 1.
  DeviceMemory reuse_chunks_, reuse_info_, reuse_counters_;
  ReuseState reuse_{};
  std::vector<int32_t> reuse_layer_slot_;  // layer → its slot, −1 without representatives
  mutable SelectionReuseStats reuse_stats_seen_;

  std::array<Slot, 3> slots_;
  int known_q_heads_ = 0;  // learned from the first attend; plans are cut for it afterwards
};

}  // namespace cisa::cuda
