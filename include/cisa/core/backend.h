// cisa/core/backend.h — the one seam between the model runtime and the hardware it runs on.
//
// A Backend owns the memory a model runs in (weights, activations, the paged KV cache) and runs
// the operations of a forward step on it. cisa::Model writes each architecture's layers once, as
// calls on this interface; the CPU backend (src/cpu/cpu_backend.cpp) runs them with the reference
// kernels on host memory, the CUDA backend (src/cuda/model/model_backend*.cpp) enqueues them on a
// stream on device memory. The SPEC rules (query groups, eligible chunks, list layout, dense plans)
// are in the core (plan.h) and both backends call them; a backend only decides where the bytes live
// and which kernels move them.
//
// Pointers passed to operations are in the backend's memory (the CPU's host memory, the device's
// memory for CUDA), allocated with allocate(); host spans are marked as such. Activations are f32,
// rows packed as the batch packs its queries (batch.h). Operations are ordered: each sees the
// results of the ones before it. A CUDA backend may run them asynchronously; download() and
// synchronize() wait for everything before them.
//
// Plan/run split: plan() builds the page lists' fixed parts and launch metadata of one slot for
// the step's batch (host work, may allocate and upload); select() and attend() only launch work,
// so a decode step's run part can be captured in a CUDA graph.
//
//   auto be = *cisa::make_cpu_backend({.threads = 2});
//   CISA_RETURN_IF_ERROR(be->create_cache(kv_config));
//   cisa::BackendMatrix wq = *be->bind_matrix(weight_view);        // at load
//   auto q = *be->allocate(rows * n_head * d * sizeof(float));     // activations
//   CISA_RETURN_IF_ERROR(be->matmul(wq, xn, q->f32(), rows));       // y = W x, per row
//   CISA_RETURN_IF_ERROR(
//       be->plan(cisa::PlanSlot::kGlobal, batch, {.kind = cisa::PlanKind::kDense}));
//   CISA_RETURN_IF_ERROR(be->attend(cisa::PlanSlot::kGlobal, layer, q->f32(), n_head, ap, att));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/page_table.h"
#include "cisa/core/plan.h"
#include "cisa/core/status.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/model/quant.h"

namespace cisa {

class ThreadPool;

enum class BackendKind { kCpu, kCuda };
const char* backend_kind_name(BackendKind k);  // "cpu", "cuda"
Result<BackendKind> parse_backend_kind(const std::string& s);

// Which dimensions RoPE rotates together: NEOX pairs dimension i with i + d/2 (Gemma), NORM
// pairs 2i with 2i + 1 (Llama as stored in GGUF).
enum class RopeStyle { kNeox, kNorm };
enum class Activation { kGeluTanh, kSilu };

// The arithmetic of attention. kLlamaCpp runs attention through attend_llamacpp
// (attention_llamacpp.h): llama.cpp's CPU rounding order with an f16 KV cache, for conformance
// checks against its logits. CPU backend only.
enum class AttentionNumerics { kDefault, kLlamaCpp };

// A matrix bound to a backend for y = W x: n_rows outputs of n_cols inputs. The storage is the
// backend's (the CPU keeps the GGUF blocks and multiplies them quantised; CUDA holds bf16 on the
// device); `id` is the backend's handle, valid for the backend's lifetime.
struct BackendMatrix {
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  int id = -1;
};

// A grow-never buffer in the backend's memory.
class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  virtual void* data() = 0;
  virtual int64_t bytes() const = 0;
  float* f32() { return static_cast<float*>(data()); }
  int32_t* i32() { return static_cast<int32_t*>(data()); }
};

// The page lists a step keeps, each planned once per step and used by every layer of its kind.
enum class PlanSlot { kGlobal, kSliding, kCisa };
enum class PlanKind { kDense, kCisa };
struct PlanSpec {
  PlanKind kind = PlanKind::kDense;
  int64_t sliding_window = 0;  // kDense: 0 for full attention, else t − window < s ≤ t
  SelectionParams selection;   // kCisa
};

struct AttendParams {
  float scale = 0.0f;          // multiplies q·k; 0 means 1/√head_dim
  int64_t sliding_window = 0;  // 0: none
  AttentionNumerics numerics = AttentionNumerics::kDefault;
  // kLlamaCpp only: the queries were multiplied by `scale` before attention (llama.cpp's Gemma
  // graphs), so attention runs with scale 1.
  bool scale_queries = false;
};

struct BackendOptions {
  int threads = 0;  // CPU: worker threads (0: one per hardware thread); CUDA: host-side threads
  int device = 0;   // CUDA device ordinal
  // CUDA: record the device work of a decode step (begin_step with a nonzero key) in a CUDA graph
  // and replay it on later steps of the same key instead of launching each kernel. The CPU
  // backend ignores it.
  bool step_graphs = true;
  // CPU: multiply as the CUDA backend does, for checks against it: every bound matrix (weights,
  // embeddings, index projections) rounded to bf16 once at bind, and every matrix product's input
  // rounded to bf16 before it is multiplied (products and sums in f32). The CUDA backend always
  // multiplies so and ignores it.
  bool bf16_matmul = false;
  // CUDA: batch invariance. A sequence's results are the same bits whatever else its step holds
  // (one GEMM algorithm per matrix for every row count, cuda::GemmOptions::batch_invariant; and
  // attention work split by each list's own length, cuda::PlanOptions::batch_invariant), so
  // greedy tokens in a batch equal those of the sequence alone. Slower: docs/cuda-model.md. The
  // CPU backend has no such mode (its attention splits and 8-bit activations depend on the step)
  // and refuses it.
  bool batch_invariant = false;
  // CUDA: a step with a group over 64 query rows (a prefill chunk) beside smaller ones (decode
  // rows) attends in two launches, each group in the tile it fits (cuda::PlanOptions::mixed_tiles;
  // off by default: no gain measured in a served workload). The CPU backend has no tiles and
  // refuses it.
  bool mixed_tiles = false;
};

// What a backend did with the steps begin_step() bracketed (step_graph_stats()).
struct StepGraphStats {
  bool enabled = false;  // the backend records step graphs (BackendOptions::step_graphs, CUDA)
  int64_t eager = 0;     // bracketed steps whose operations were launched one by one
  int64_t captured = 0;  // steps recorded into a new graph (and run from it)
  int64_t replayed = 0;  // steps run by replaying a graph recorded earlier
  int64_t graphs = 0;    // graphs held now
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // One line for logs and JSON: "cpu (avx512-vnni, 2 threads)", "cuda (NVIDIA H200, sm_90)".
  virtual std::string description() const = 0;

  // ---- memory ----
  virtual Result<std::unique_ptr<BackendBuffer>> allocate(int64_t bytes, const char* what) = 0;
  // Host → backend and backend → host copies; download() waits for every earlier operation.
  virtual Status upload(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual Status download(void* host_dst, const void* src, int64_t bytes) = 0;
  virtual Status synchronize() = 0;
  // Bytes of backend memory free now (host: available RAM; CUDA: cudaMemGetInfo), for admission.
  virtual int64_t free_memory() const = 0;

  // ---- weights (load time) ----
  virtual Result<BackendMatrix> bind_matrix(const WeightView& w) = 0;
  // A rows × cols matrix of pseudo-random values (deterministic in seed, roughly normal with
  // standard deviation `scale`): synthetic weights of a real model's shape, for speed only.
  virtual Result<BackendMatrix> random_matrix(int64_t rows, int64_t cols, uint64_t seed,
                                              float scale) = 0;
  // Matrices of one input width that multiply the same input in the forward pass (q/k/v,
  // gate/up): a backend may store them stacked, so that matmul_many() runs them as one product.
  // The default binds each alone (bind_matrix / random_matrix with seeds first_seed, +1, …:
  // random_matrices gives each matrix the values random_matrix would).
  virtual Result<std::vector<BackendMatrix>> bind_matrices(std::span<const WeightView> ws);
  virtual Result<std::vector<BackendMatrix>> random_matrices(std::span<const int64_t> rows,
                                                             int64_t cols, uint64_t first_seed,
                                                             float scale);
  // A matrix the backend owns from now on: `values` [n_rows][n_cols] f32 (n_rows · n_cols of
  // them), bound as bind_matrix binds an F32 view (CPU: kept, or its bf16-rounded copy under
  // bf16_matmul; CUDA: uploaded as bf16, the host values then freed). Model binds the index
  // projections it builds with it.
  virtual Result<BackendMatrix> bind_owned_matrix(std::vector<float> values, int64_t n_rows,
                                                  int64_t n_cols) = 0;
  // Rows [first_row, first_row + rows) of a bound matrix as the backend multiplies by them (CPU:
  // the stored blocks dequantised, or the bf16-rounded copy under bf16_matmul; CUDA: the bf16
  // values), widened to f32 into host memory: out [rows][m.n_cols]. Model builds matrices from
  // the weights with it (the index projections of CISA layers without calibration).
  virtual Status read_matrix_rows(const BackendMatrix& m, int64_t first_row, int64_t rows,
                                  float* host_out) = 0;
  // A vector (norm gains) copied into backend memory; the pointer lives as long as the backend.
  virtual Result<const float*> bind_vector(std::span<const float> host_values) = 0;
  virtual int64_t weight_bytes() const = 0;

  // ---- operations on f32 rows ----
  // x[r] = table[tokens[r]] · scale; tokens: backend int32 [rows], x: [rows][table.n_cols].
  virtual Status embed(const BackendMatrix& table, const int32_t* tokens, int64_t rows, float scale,
                       float* x) = 0;
  // y[r·ldy + o] = Σ_c W[o][c] · x[r·w.n_cols + c]; ldy 0 means w.n_rows.
  virtual Status matmul(const BackendMatrix& w, const float* x, float* y, int64_t rows,
                        int64_t ldy = 0) = 0;
  // ys[i] = ws[i] x for every matrix (matmul with ldy 0), all of one input width: the products
  // of one input. The default runs one matmul each; CUDA runs matrices bound together by
  // bind_matrices / random_matrices as one GEMM.
  virtual Status matmul_many(std::span<const BackendMatrix> ws, const float* x,
                             std::span<float* const> ys, int64_t rows);
  // y[r] = x[r] / sqrt(mean(x[r]²) + eps) ⊙ w over rows of n (w may be null: no gain; x may be y).
  virtual Status rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                          float eps) = 0;
  // Rotates `heads` head vectors of d values in every row by that row's angles:
  // x: [rows][heads][d], cos/sin: [rows][d/2] (backend memory).
  virtual Status rope(float* x, int64_t rows, int heads, int d, const float* cos, const float* sin,
                      RopeStyle style) = 0;
  // rope() of several tensors at the same rows' angles (q, k and the index queries): tensor i is
  // xs[i]: [rows][heads[i]][d]. The default runs rope() on each; CUDA launches once.
  virtual Status rope_many(std::span<float* const> xs, std::span<const int> heads, int64_t rows,
                           int d, const float* cos, const float* sin, RopeStyle style);
  // out[r][i] = act(gate[r][i]) · up[r][i] over rows of n; out may alias gate or up.
  virtual Status gated_activation(Activation act, const float* gate, const float* up, float* out,
                                  int64_t rows, int64_t n) = 0;
  // The gated MLP's first half: out[r] = act(gate x[r]) ⊙ (up x[r]), gate and up of one input
  // width; up_scratch: [rows][up.n_rows], which the default uses for up's product (matmul_many,
  // then gated_activation into out). CUDA reads both products from one stacked GEMM's output.
  virtual Status gated_matmul(const BackendMatrix& gate, const BackendMatrix& up, Activation act,
                              const float* x, float* out, float* up_scratch, int64_t rows);
  // y[i] += x[i] for i < n.
  virtual Status add(float* y, const float* x, int64_t n) = 0;
  // The residual add and the next RMSNorm: x[r] += o[r], then xn[r] = rms_norm(x[r]) ⊙ w, over
  // rows of n. The default is add() then rms_norm(); CUDA runs one kernel.
  virtual Status add_rms_norm(float* x, const float* o, const float* w, float* xn, int64_t rows,
                              int n, float eps);
  // x[i] = the IEEE half value nearest x[i] (llama.cpp's f16 KV cache numerics).
  virtual Status round_f16(float* x, int64_t n) = 0;
  // out[r][g] = mean over the heads h of KV group g of q[r][h]:
  // q [rows][hq][d], out [rows][hkv][d].
  virtual Status mean_heads(const float* q, int64_t rows, int hq, int hkv, int d, float* out) = 0;
  // n pseudo-random values (deterministic in seed, roughly normal, standard deviation `scale`):
  // synthetic K/V and activations for benchmarks.
  virtual Status fill_random(float* x, int64_t n, uint64_t seed, float scale) = 0;
  // out[i] = x[rows[i]] for rows of `width` values; rows: host span.
  virtual Status gather_rows(const float* x, std::span<const int64_t> rows, int64_t width,
                             float* out) = 0;
  // out[r] = the index of the largest value of row r of x: [rows][n] (ties: the smaller index;
  // NaN never wins; a row of NaN gives 0), cisa::argmax's rule (sampling.h); out: int32 [rows],
  // backend memory. Greedy decoding without moving logits. The default downloads the rows and
  // runs cisa::argmax on the host; the CPU and CUDA backends override it.
  virtual Status argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out);

  // ---- paged KV cache ----
  virtual Status create_cache(const KvCacheConfig& config) = 0;
  virtual const KvCacheConfig& cache_config() const = 0;
  virtual const PageTable& pages() const = 0;
  virtual Result<SeqId> add_sequence() = 0;
  virtual Status release_sequence(SeqId seq) = 0;
  virtual Status reserve(SeqId seq, int64_t n) = 0;
  // Writes the K/V rows of every batch entry after its sequence's tokens of `layer`, and the
  // representatives of the pages this fills. k, v: [rows][num_kv_heads][head_dim].
  virtual Status append_kv(int layer, std::span<const BatchEntry> batch, const float* k,
                           const float* v) = 0;

  // ---- attention ----
  // Plans slot `slot` for this step's batch (every layer of the step that uses the slot shares
  // it; a kCisa plan's selected pages are filled per layer by select()).
  virtual Status plan(PlanSlot slot, std::span<const BatchEntry> batch, const PlanSpec& spec) = 0;
  // The slot's query groups (host), as plan_query_groups / plan_dense cut them.
  virtual const std::vector<QueryGroup>& plan_groups(PlanSlot slot) const = 0;
  // Scores and top-k of a kCisa slot for one layer. index_q: [rows][num_kv_heads][head_dim].
  virtual Status select(PlanSlot slot, int layer, const float* index_q) = 0;
  // Replaces the slot's page lists with host lists made elsewhere (a PageSelector), laid out as
  // select() lays them out. The CPU backend only.
  virtual Status set_page_lists(PlanSlot slot, const PageLists& lists) = 0;
  // A host copy of the slot's page lists as the last select() or set_page_lists() left them, with
  // the logical chunk of every page (a GPU backend waits for its work first). Tests and
  // AttentionOptions::page_list_observer; failed_precondition when the slot has none.
  virtual Status page_lists(PlanSlot slot, PageLists* out) = 0;
  // out[r][h] = softmax attention of q[r][h] over the slot's pages of `layer`.
  // q, out: [rows][num_q_heads][head_dim].
  virtual Status attend(PlanSlot slot, int layer, const float* q, int num_q_heads,
                        const AttendParams& p, float* out) = 0;

  // ---- steps ----
  // Model::forward brackets the device work of each step with begin_step() and end_step(): after
  // the step's uploads, reserve() and plan() calls, before its downloads. `graph_key` is nonzero
  // only when the caller issues the same operations, on the same buffers and row counts, on every
  // step that passes that key (the decode steps of one batch shape); a backend may then record the
  // operations once and, on later steps of the key, replay the recording instead of launching
  // each one (operations still check their arguments and keep the host's bookkeeping). The batch
  // is the step's (append_kv's entries): a backend may prepare per-step metadata from it.
  // end_step(false) closes the bracket after a failed operation without running what it holds.
  virtual Status begin_step(std::span<const BatchEntry> batch, uint64_t graph_key) {
    (void)batch;
    (void)graph_key;
    return Status::Ok();
  }
  virtual Status end_step(bool run = true) {
    (void)run;
    return Status::Ok();
  }
  virtual StepGraphStats step_graph_stats() const { return {}; }
  // What select() did with decode rows under selection reuse (plan.h); zeros where unsupported.
  virtual SelectionReuseStats selection_reuse_stats() const { return {}; }

  // ---- the CPU backend's own objects (calibration taps and page selectors read them) ----
  virtual const PagedKvCache* cpu_cache() const { return nullptr; }
  virtual ThreadPool* cpu_pool() { return nullptr; }
};

using BackendFactory = std::function<Result<std::unique_ptr<Backend>>(const BackendOptions&)>;

// The CPU reference backend (src/cpu/cpu_backend.cpp).
Result<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options);

}  // namespace cisa
