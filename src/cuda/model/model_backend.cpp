// CudaBackend, part 1: device memory, the per-row operations, GEMMs and the factory (weights:
// model_backend_weights.cpp).
// Every operation enqueues on the backend's stream (model_ops.cuh kernels, cuBLASLt through
// Gemm); only download(), synchronize() and load-time binds wait for the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cisa/core/bf16.h"
#include "cisa/cuda/model_backend.h"
#include "cisa/model/quant.h"
#include "model_backend_impl.h"
#include "model_ops.cuh"

namespace cisa::cuda {

Status check_cuda(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  const std::string m = what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  cudaGetLastError();  // a non-sticky error must not fail the next call
  if (err == cudaErrorMemoryAllocation) return resource_exhausted(m);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return unavailable(m);
  return internal_error(m);
}

namespace {

std::string describe_bytes(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return std::string(buf) + " (" + std::to_string(bytes) + " bytes)";
}

int64_t device_free_bytes() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(free_b);
}

// A BackendBuffer over device memory; freed with it (independently of the backend's lifetime).
class CudaBuffer final : public BackendBuffer {
 public:
  CudaBuffer(DeviceMemory mem, int64_t bytes) : mem_(std::move(mem)), bytes_(bytes) {}
  void* data() override { return mem_.get(); }
  int64_t bytes() const override { return bytes_; }

 private:
  DeviceMemory mem_;
  int64_t bytes_;
};

// Values of fill_random converted per chunk (bf16 staging of 32 MiB at most).
constexpr int64_t kFillChunk = int64_t{1} << 24;
// download(): copies of at least this many bytes are staged through pinned chunks of kPinnedChunk.
constexpr int64_t kPinnedDownloadMin = int64_t{256} << 10;
constexpr int64_t kPinnedChunk = int64_t{4} << 20;

// The device fill hashes seed · kSeedMul + i (as the CPU backend's random_value does); a chunk
// starting at element i0 continues the same sequence with seed' = seed + i0 · kSeedMul⁻¹ (mod
// 2^64), so fill_random's values are the CPU backend's, rounded to bf16, at any size.
constexpr uint64_t kSeedMul = 0x100000001b3ull;
constexpr uint64_t inverse_mod_2_64(uint64_t a) {  // a odd; Newton: each step doubles the bits
  uint64_t x = a;                                  // correct to 3 bits (a·a ≡ 1 mod 8)
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}
static_assert(kSeedMul * inverse_mod_2_64(kSeedMul) == 1);
uint64_t chunk_seed(uint64_t seed, int64_t i0) {
  return seed + static_cast<uint64_t>(i0) * inverse_mod_2_64(kSeedMul);
}

}  // namespace

// ---- DeviceMemory ----

DeviceMemory::~DeviceMemory() {
  if (ptr_) cudaFree(ptr_);
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Result<DeviceMemory> DeviceMemory::allocate(int64_t bytes, const std::string& what) {
  if (bytes < 0)
    return invalid_argument("cuda: " + what + ": negative size " + std::to_string(bytes));
  const int64_t rounded = (std::max<int64_t>(bytes, 1) + 255) / 256 * 256;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(rounded));
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return resource_exhausted("cuda: " + what + " needs " + describe_bytes(rounded) +
                              " of device memory; " + describe_bytes(device_free_bytes()) +
                              " free");
  }
  CISA_RETURN_IF_ERROR(check_cuda(err, "cuda: allocating " + what));
  DeviceMemory m;
  m.ptr_ = p;
  m.bytes_ = rounded;
  return m;
}

Status DeviceMemory::reserve(int64_t bytes, const std::string& what, cudaStream_t stream) {
  if (bytes <= bytes_) return Status::Ok();
  CISA_RETURN_IF_ERROR(check_cuda(cudaStreamSynchronize(stream), "cuda: " + what));
  auto fresh = allocate(bytes, what);
  if (!fresh.ok() && ptr_) {  // the old buffer may be what is in the way
    *this = DeviceMemory();
    fresh = allocate(bytes, what);
  }
  if (!fresh.ok()) return fresh.status();
  *this = std::move(*fresh);
  return Status::Ok();
}

// ---- PinnedMemory ----

PinnedMemory::~PinnedMemory() {
  if (ptr_) cudaFreeHost(ptr_);
}

Status PinnedMemory::reserve(int64_t bytes, const char* what) {
  if (bytes <= bytes_) return Status::Ok();
  if (ptr_) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  CISA_RETURN_IF_ERROR(check_cuda(cudaMallocHost(&ptr_, static_cast<size_t>(bytes)), what));
  bytes_ = bytes;
  return Status::Ok();
}

// ---- factory ----

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const BackendOptions& options) {
  std::string why;
  if (!device_available(&why))
    return unavailable("cuda model backend: no usable device (" + why + ")");
  int count = 0;
  CISA_RETURN_IF_ERROR(check_cuda(cudaGetDeviceCount(&count), "cuda: counting devices"));
  if (options.device < 0 || options.device >= count)
    return invalid_argument("cuda: device " + std::to_string(options.device) + " does not exist (" +
                            std::to_string(count) + " devices)");
  cudaDeviceProp prop{};
  CISA_RETURN_IF_ERROR(
      check_cuda(cudaGetDeviceProperties(&prop, options.device), "cuda: device properties"));
  if (prop.major < 9)
    return unavailable("cuda: device " + std::to_string(options.device) + " (" + prop.name +
                       ") is older than compute capability 9.0");
  CISA_RETURN_IF_ERROR(check_cuda(cudaSetDevice(options.device), "cuda: selecting the device"));
  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->device_ = options.device;
  be->step_graphs_ = options.step_graphs;
  // A blocking stream: it stays ordered with the legacy default stream on which the attention
  // planner (cuda/backend.h) uploads its metadata.
  CISA_RETURN_IF_ERROR(check_cuda(cudaStreamCreate(&be->stream_), "cuda: creating the stream"));
  CISA_RETURN_IF_ERROR(
      check_cuda(cudaStreamCreate(&be->side_), "cuda: creating the selection stream"));
  CISA_RETURN_IF_ERROR(
      check_cuda(cudaEventCreateWithFlags(&be->forked_, cudaEventDisableTiming), "cuda: event"));
  CISA_RETURN_IF_ERROR(
      check_cuda(cudaEventCreateWithFlags(&be->side_done_, cudaEventDisableTiming), "cuda: event"));
  be->description_ = std::string("cuda (") + prop.name + ", sm_" + std::to_string(prop.major) +
                     std::to_string(prop.minor) + ")";
  be->batch_invariant_ = options.batch_invariant;
  be->mixed_tiles_ = options.mixed_tiles;
  CISA_ASSIGN_OR_RETURN(be->gemm_, Gemm::create({.batch_invariant = options.batch_invariant}));
  return be;
}

CudaBackend::~CudaBackend() {
  if (side_) {
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
  }
  for (cudaEvent_t e : {forked_, side_done_})
    if (e) cudaEventDestroy(e);
  if (stream_) {
    cudaStreamSynchronize(stream_);  // nothing queued may outlive the memory freed below
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t& e : staged_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t& e : stage_done_)
    if (e) cudaEventDestroy(e);
  for (StepGraph& g : graphs_) cudaGraphExecDestroy(g.exec);
}

Result<std::unique_ptr<Backend>> make_model_backend(const BackendOptions& options) {
  CISA_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be, CudaBackend::create(options));
  return std::unique_ptr<Backend>(std::move(be));
}

Status set_step_graphs(Backend& backend, bool on) {
  auto* be = dynamic_cast<CudaBackend*>(&backend);
  if (!be)
    return invalid_argument("set_step_graphs: not a CUDA model backend (" + backend.description() +
                            ")");
  return be->set_step_graphs(on);
}

Result<std::vector<std::string>> gemm_choices(const Backend& backend) {
  const auto* be = dynamic_cast<const CudaBackend*>(&backend);
  if (!be)
    return invalid_argument("gemm_choices: not a CUDA model backend (" + backend.description() +
                            ")");
  return be->gemm_choices();
}

// ---- memory ----

Result<std::unique_ptr<BackendBuffer>> CudaBackend::allocate(int64_t bytes, const char* what) {
  CISA_ASSIGN_OR_RETURN(DeviceMemory mem, DeviceMemory::allocate(bytes, what ? what : "buffer"));
  return std::unique_ptr<BackendBuffer>(new CudaBuffer(std::move(mem), bytes));
}

Status CudaBackend::upload(void* dst, const void* host_src, int64_t bytes) {
  if (bytes < 0) return invalid_argument("cuda upload: negative size");
  if (bytes == 0) return Status::Ok();
  if (!dst || !host_src) return invalid_argument("cuda upload: null pointer");
  CISA_RETURN_IF_ERROR(join_side());
  ++op_count_;  // may overwrite an input matmul converted
  // From pageable memory the copy returns once the source is staged: the caller may reuse it.
  return check_cuda(
      cudaMemcpyAsync(dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
      "cuda upload");
}

Status CudaBackend::download(void* host_dst, const void* src, int64_t bytes) {
  if (bytes < 0) return invalid_argument("cuda download: negative size");
  if (bytes == 0) return synchronize();
  if (!host_dst || !src) return invalid_argument("cuda download: null pointer");
  CISA_RETURN_IF_ERROR(join_side());
  if (bytes < kPinnedDownloadMin) {
    CISA_RETURN_IF_ERROR(check_cuda(
        cudaMemcpyAsync(host_dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
        "cuda download"));
    return synchronize();
  }
  // Large copies (logits) go through two pinned chunks: the device fills chunk i + 1 while the host
  // copies chunk i out to the (pageable) destination.
  for (int b = 0; b < 2; ++b) {
    CISA_RETURN_IF_ERROR(staging_[b].reserve(kPinnedChunk, "cuda download: pinned staging"));
    if (!staged_[b])
      CISA_RETURN_IF_ERROR(check_cuda(cudaEventCreateWithFlags(&staged_[b], cudaEventDisableTiming),
                                      "cuda download: staging event"));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(host_dst);
  const int64_t chunks = (bytes + kPinnedChunk - 1) / kPinnedChunk;
  auto issue = [&](int64_t c) -> Status {
    const int64_t off = c * kPinnedChunk, len = std::min(kPinnedChunk, bytes - off);
    CISA_RETURN_IF_ERROR(
        check_cuda(cudaMemcpyAsync(staging_[c % 2].get(), s + off, static_cast<size_t>(len),
                                   cudaMemcpyDeviceToHost, stream_),
                   "cuda download"));
    return check_cuda(cudaEventRecord(staged_[c % 2], stream_), "cuda download: event");
  };
  CISA_RETURN_IF_ERROR(issue(0));
  for (int64_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) CISA_RETURN_IF_ERROR(issue(c + 1));  // its buffer was copied out at c − 1
    CISA_RETURN_IF_ERROR(
        check_cuda(cudaEventSynchronize(staged_[c % 2]), "cuda download: waiting"));
    const int64_t off = c * kPinnedChunk, len = std::min(kPinnedChunk, bytes - off);
    std::memcpy(d + off, staging_[c % 2].get(), static_cast<size_t>(len));
  }
  return synchronize();
}

Status CudaBackend::synchronize() {
  CISA_RETURN_IF_ERROR(join_side());
  return check_cuda(cudaStreamSynchronize(stream_), "cuda: stream synchronize");
}

Status CudaBackend::fork_side() {
  CISA_RETURN_IF_ERROR(join_side());  // side_'s earlier work is ordered before this fork anyway
  CISA_RETURN_IF_ERROR(check_cuda(cudaEventRecord(forked_, stream_), "cuda: fork event"));
  CISA_RETURN_IF_ERROR(
      check_cuda(cudaStreamWaitEvent(side_, forked_, 0), "cuda: selection stream wait"));
  side_pending_ = true;
  return Status::Ok();
}

Status CudaBackend::join_side() {
  if (!side_pending_) return Status::Ok();
  side_pending_ = false;
  CISA_RETURN_IF_ERROR(check_cuda(cudaEventRecord(side_done_, side_), "cuda: join event"));
  return check_cuda(cudaStreamWaitEvent(stream_, side_done_, 0), "cuda: join wait");
}

int64_t CudaBackend::free_memory() const {
  return device_free_bytes();
}

Result<uint16_t*> CudaBackend::bf16_scratch(int64_t n) {
  CISA_RETURN_IF_ERROR(scratch_bf16_.reserve(n * 2, "bf16 staging buffer", stream_));
  return scratch_bf16_.as<uint16_t>();
}

bool CudaBackend::holds_bf16_copy(const float* x, const uint16_t* xb, int64_t n) const {
  return x == conv_x_ && xb == conv_xb_ && n == conv_n_ && op_count_ == conv_op_;
}

void CudaBackend::note_bf16_copy(const float* x, const uint16_t* xb, int64_t n) {
  conv_x_ = x;
  conv_xb_ = xb;
  conv_n_ = n;
  conv_op_ = op_count_;
}

void CudaBackend::keep_bf16_copy(std::span<float* const> written, std::span<const int64_t> sizes) {
  if (!conv_x_ || conv_op_ != op_count_ - 1) return;
  for (size_t i = 0; i < written.size(); ++i)
    if (written[i] < conv_x_ + conv_n_ && conv_x_ < written[i] + sizes[i]) return;
  conv_op_ = op_count_;
}

Result<float*> CudaBackend::f32_scratch(int64_t n) {
  CISA_RETURN_IF_ERROR(scratch_f32_.reserve(n * 4, "f32 staging buffer", stream_));
  return scratch_f32_.as<float>();
}

Status CudaBackend::launched(cudaError_t err, const char* op) const {
  if (err == cudaErrorInvalidValue) {
    cudaGetLastError();
    return invalid_argument(
        std::string("cuda ") + op +
        ": invalid arguments (a negative size, a null pointer with work to do, or a "
        "shape the kernel does not take)");
  }
  return check_cuda(err, std::string("cuda ") + op);
}

// ---- operations ----

Status CudaBackend::embed(const BackendMatrix& table, const int32_t* tokens, int64_t rows,
                          float scale, float* x) {
  CISA_ASSIGN_OR_RETURN(const DeviceMatrix* t, find_matrix(table, "embed"));
  // Tokens live on the device: one outside the vocabulary gives a row of NaN (model_ops.cuh).
  if (graph_skip(1, {arg(t->data()), arg(tokens), arg(rows), arg(scale), arg(x)}))
    return Status::Ok();
  return launched(
      detail::launch_embed(t->data(), tokens, rows, t->n_cols, scale, x, stream_, t->n_rows),
      "embed");
}

Status CudaBackend::matmul(const BackendMatrix& w, const float* x, float* y, int64_t rows,
                           int64_t ldy) {
  CISA_ASSIGN_OR_RETURN(const DeviceMatrix* m, find_matrix(w, "matmul"));
  if (rows < 0) return invalid_argument("cuda matmul: negative row count");
  if (ldy == 0) ldy = m->n_rows;
  if (ldy < m->n_rows)
    return invalid_argument("cuda matmul: ldy " + std::to_string(ldy) + " is below the " +
                            std::to_string(m->n_rows) + " outputs");
  if (rows == 0) return Status::Ok();
  if (!x || !y) return invalid_argument("cuda matmul: null input or output");
  // x is f32; the GEMM multiplies bf16 with f32 accumulation.
  const int64_t n = rows * m->n_cols;
  CISA_ASSIGN_OR_RETURN(uint16_t * xb, bf16_scratch(n));
  // The previous operation converted this same input (q/k/v, gate/up): the staging holds it.
  const bool converted = holds_bf16_copy(x, xb, n);
  const bool skip = graph_skip(2, {arg(m->data()), arg(m->n_rows), arg(m->n_cols), arg(x), arg(xb),
                                   arg(y), arg(rows), arg(ldy), arg(int64_t{converted})});
  // Kept for the next matmul unless this one writes over its own input.
  const bool keeps_input = y + rows * ldy <= x || x + n <= y;
  if (!skip) {
    conv_x_ = nullptr;
    if (!converted)
      CISA_RETURN_IF_ERROR(
          launched(detail::launch_f32_to_bf16(x, xb, n, stream_), "matmul input to bf16"));
    CISA_RETURN_IF_ERROR(gemm_->run(m->data(), m->n_rows, m->n_cols, xb, rows, y, ldy, stream_));
  }
  note_bf16_copy(keeps_input ? x : nullptr, xb, n);
  return Status::Ok();
}

Result<const CudaBackend::DeviceMatrix*> CudaBackend::whole_stack(std::span<const BackendMatrix> ws,
                                                                  const char* op) const {
  if (ws.size() < 2) return nullptr;
  const DeviceMatrix* first = nullptr;
  for (size_t i = 0; i < ws.size(); ++i) {
    CISA_ASSIGN_OR_RETURN(const DeviceMatrix* m, find_matrix(ws[i], op));
    if (i == 0) first = m;
    if (m->stack != first->stack || m->stack_pos != static_cast<int>(i) ||
        m->stack_size != static_cast<int>(ws.size()))
      return nullptr;
  }
  return first;
}

Status CudaBackend::stacked_product(const DeviceMatrix& first, int64_t total, const float* x,
                                    int64_t rows, uint64_t op, uint64_t tail_hash,
                                    const std::function<cudaError_t(const float*)>& tail,
                                    const char* what) {
  if (!x) return invalid_argument(std::string("cuda ") + what + ": null input");
  const int64_t cols = first.n_cols;
  CISA_ASSIGN_OR_RETURN(float* const y, f32_scratch(rows * total));
  const int64_t n = rows * cols;
  CISA_ASSIGN_OR_RETURN(uint16_t * xb, bf16_scratch(n));
  // The previous operation (rms_norm) left this input's bf16 copy in the staging buffer.
  const bool converted = holds_bf16_copy(x, xb, n);
  conv_x_ = nullptr;
  if (graph_skip(op, {arg(first.data()), arg(total), arg(cols), arg(x), arg(xb), arg(y), arg(rows),
                      tail_hash, arg(int64_t{converted})}))
    return Status::Ok();
  if (!converted)
    CISA_RETURN_IF_ERROR(launched(detail::launch_f32_to_bf16(x, xb, n, stream_), what));
  CISA_RETURN_IF_ERROR(gemm_->run(first.data(), total, cols, xb, rows, y, total, stream_));
  return launched(tail(y), what);
}

Status CudaBackend::matmul_many(std::span<const BackendMatrix> ws, const float* x,
                                std::span<float* const> ys, int64_t rows) {
  if (ws.size() != ys.size())
    return invalid_argument("cuda matmul_many: " + std::to_string(ws.size()) + " matrices but " +
                            std::to_string(ys.size()) + " outputs");
  // One GEMM when the matrices are a whole stack, in order (bind_matrices / random_matrices);
  // then its column blocks go to the outputs.
  CISA_ASSIGN_OR_RETURN(const DeviceMatrix* first, whole_stack(ws, "matmul_many"));
  if (!first || rows <= 0 || ws.size() > static_cast<size_t>(detail::kMaxSplitParts) ||
      std::find(ys.begin(), ys.end(), nullptr) != ys.end())
    return Backend::matmul_many(ws, x, ys, rows);
  detail::SplitParts parts;
  int64_t total = 0;
  uint64_t hash = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    parts.dst[parts.count] = ys[i];
    parts.offset[parts.count] = total;
    parts.cols[parts.count] = ws[i].n_rows;
    ++parts.count;
    total += ws[i].n_rows;
    hash = hash * 0x100000001b3ull + arg(ys[i]);
  }
  return stacked_product(
      *first, total, x, rows, 13, hash,
      [&](const float* y) { return detail::launch_split_columns(y, rows, total, parts, stream_); },
      "matmul_many");
}

Status CudaBackend::gated_matmul(const BackendMatrix& gate, const BackendMatrix& up, Activation act,
                                 const float* x, float* out, float* up_scratch, int64_t rows) {
  const BackendMatrix ws[2] = {gate, up};
  CISA_ASSIGN_OR_RETURN(const DeviceMatrix* first, whole_stack(ws, "gated_matmul"));
  if (!first || rows <= 0 || gate.n_rows != up.n_rows || gate.n_cols != up.n_cols || !out)
    return Backend::gated_matmul(gate, up, act, x, out, up_scratch, rows);
  // The activation reads gate's and up's columns from the one product; out's bf16 copy goes to
  // the staging buffer for the down projection (as rms_norm's).
  const int64_t f = gate.n_rows;
  CISA_ASSIGN_OR_RETURN(uint16_t * outb, bf16_scratch(rows * f));
  const bool gelu = act == Activation::kGeluTanh;
  CISA_RETURN_IF_ERROR(stacked_product(
      *first, 2 * f, x, rows, 15, arg(out) * 31 + arg(outb) + uint64_t{gelu},
      [&](const float* y) {
        return detail::launch_gated_stacked(gelu, y, rows, f, out, outb, stream_);
      },
      "gated_matmul"));
  note_bf16_copy(out, outb, rows * f);
  return Status::Ok();
}

Status CudaBackend::add_rms_norm(float* x, const float* o, const float* w, float* xn, int64_t rows,
                                 int n, float eps) {
  return norm_rows(x, o, w, xn, rows, n, eps, 16, "add_rms_norm");
}

Status CudaBackend::rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                             float eps) {
  // Without a residual nothing writes x (launch_rms_norm's contract).
  return norm_rows(const_cast<float*>(x), nullptr, w, y, rows, n, eps, 3, "rms_norm");
}

Status CudaBackend::norm_rows(float* x, const float* o, const float* w, float* y, int64_t rows,
                              int n, float eps, uint64_t op, const char* what) {
  if (rows > 0 && n <= 0)
    return invalid_argument(std::string("cuda ") + what + ": row width must be positive");
  // The bf16 copy of y goes to the staging buffer too: the next matmul (q/k/v, gate/up) finds it
  // there instead of converting y again.
  CISA_ASSIGN_OR_RETURN(uint16_t * yb, bf16_scratch(std::max<int64_t>(rows, 0) * n));
  const bool skip = graph_skip(
      op, {arg(x), arg(o), arg(w), arg(y), arg(yb), arg(rows), arg(int64_t{n}), arg(eps)});
  if (rows > 0) note_bf16_copy(y, yb, rows * n);
  if (skip) return Status::Ok();
  return launched(detail::launch_add_rms_norm(x, o, w, y, rows, n, eps, stream_, yb), what);
}

Status CudaBackend::rope(float* x, int64_t rows, int heads, int d, const float* cos,
                         const float* sin, RopeStyle style) {
  return rope_many({&x, 1}, {&heads, 1}, rows, d, cos, sin, style);
}

Status CudaBackend::rope_many(std::span<float* const> xs, std::span<const int> heads, int64_t rows,
                              int d, const float* cos, const float* sin, RopeStyle style) {
  if (xs.size() != heads.size() || xs.size() > static_cast<size_t>(detail::kMaxRopeParts))
    return Backend::rope_many(xs, heads, rows, d, cos, sin, style);
  detail::RopeParts parts;
  uint64_t hash = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (rows > 0 && (heads[i] <= 0 || d <= 0 || d % 2 != 0))
      return invalid_argument("cuda rope: heads must be positive and d positive and even (got " +
                              std::to_string(heads[i]) + " heads, d " + std::to_string(d) + ")");
    parts.x[parts.count] = xs[i];
    parts.heads[parts.count] = heads[i];
    ++parts.count;
    hash = hash * 0x100000001b3ull + arg(xs[i]) + static_cast<uint64_t>(heads[i]);
  }
  const bool skip = graph_skip(14, {hash, arg(rows), arg(int64_t{d}), arg(cos), arg(sin),
                                    arg(int64_t{style == RopeStyle::kNeox})});
  // (The early selection's RoPE of the index queries leaves the layer input's bf16 copy for the
  // q/k/v product.)
  int64_t sizes[detail::kMaxRopeParts] = {};
  for (size_t i = 0; i < xs.size(); ++i) sizes[i] = std::max<int64_t>(rows, 0) * heads[i] * d;
  keep_bf16_copy(xs, {sizes, xs.size()});
  if (skip) return Status::Ok();
  return launched(
      detail::launch_rope_many(parts, rows, d, cos, sin, style == RopeStyle::kNeox, stream_),
      "rope");
}

Status CudaBackend::gated_activation(Activation act, const float* gate, const float* up, float* out,
                                     int64_t rows, int64_t n) {
  // The bf16 copy of out goes to the staging buffer too, for the down projection (as rms_norm).
  const int64_t total = std::max<int64_t>(rows, 0) * std::max<int64_t>(n, 0);
  CISA_ASSIGN_OR_RETURN(uint16_t * outb, bf16_scratch(total));
  const bool skip = graph_skip(5, {arg(int64_t{act == Activation::kGeluTanh}), arg(gate), arg(up),
                                   arg(out), arg(outb), arg(rows), arg(n)});
  if (total > 0) note_bf16_copy(out, outb, total);
  if (skip) return Status::Ok();
  return launched(detail::launch_gated_activation(act == Activation::kGeluTanh, gate, up, out, rows,
                                                  n, stream_, outb),
                  "gated_activation");
}

Status CudaBackend::add(float* y, const float* x, int64_t n) {
  if (graph_skip(6, {arg(y), arg(x), arg(n)})) return Status::Ok();
  return launched(detail::launch_add(y, x, n, stream_), "add");
}

Status CudaBackend::round_f16(float* x, int64_t n) {
  if (graph_skip(7, {arg(x), arg(n)})) return Status::Ok();
  return launched(detail::launch_round_f16(x, n, stream_), "round_f16");
}

Status CudaBackend::mean_heads(const float* q, int64_t rows, int hq, int hkv, int d, float* out) {
  if (rows > 0 && (hq <= 0 || hkv <= 0 || d <= 0 || hq % hkv != 0))
    return invalid_argument("cuda mean_heads: " + std::to_string(hq) +
                            " query heads are not a positive multiple of " + std::to_string(hkv) +
                            " KV heads (d " + std::to_string(d) + ")");
  if (graph_skip(
          8, {arg(q), arg(rows), arg(int64_t{hq}), arg(int64_t{hkv}), arg(int64_t{d}), arg(out)}))
    return Status::Ok();
  return launched(detail::launch_mean_heads(q, rows, hq, hkv, d, out, stream_), "mean_heads");
}

Status CudaBackend::fill_random(float* x, int64_t n, uint64_t seed, float scale) {
  if (n < 0) return invalid_argument("cuda fill_random: negative count");
  if (n == 0) return Status::Ok();
  if (!x) return invalid_argument("cuda fill_random: null output");
  if (step_mode_ == StepMode::kCapture || step_mode_ == StepMode::kReplay)
    return failed_precondition("cuda fill_random: not inside a recorded step");
  ++op_count_;  // writes the bf16 staging (matmul's converted input)
  CISA_ASSIGN_OR_RETURN(uint16_t * tmp, bf16_scratch(std::min(n, kFillChunk)));
  for (int64_t i0 = 0; i0 < n; i0 += kFillChunk) {
    const int64_t m = std::min(kFillChunk, n - i0);
    CISA_RETURN_IF_ERROR(fill_random_bf16(tmp, m, chunk_seed(seed, i0), scale, stream_));
    CISA_RETURN_IF_ERROR(
        launched(detail::launch_bf16_to_f32(tmp, x + i0, m, stream_), "fill_random"));
  }
  return Status::Ok();
}

Status CudaBackend::gather_rows(const float* x, std::span<const int64_t> rows, int64_t width,
                                float* out) {
  if (width < 0) return invalid_argument("cuda gather_rows: negative width");
  if (rows.empty() || width == 0) return Status::Ok();
  if (!x || !out) return invalid_argument("cuda gather_rows: null input or output");
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0)
      return invalid_argument("cuda gather_rows: row index " + std::to_string(i) + " is negative");
  const auto n = static_cast<int64_t>(rows.size());
  ++op_count_;
  // Host row indices: uploaded here, so never inside a recorded step (stage_upload says so).
  CISA_RETURN_IF_ERROR(d_gather_rows_.reserve(n * 8, "gather_rows indices", stream_));
  CISA_RETURN_IF_ERROR(stage_upload(d_gather_rows_.get(), rows.data(), n * 8, "gather_rows"));
  return launched(
      detail::launch_gather_rows(x, d_gather_rows_.as<int64_t>(), n, width, out, stream_),
      "gather_rows");
}

Status CudaBackend::argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out) {
  if (rows < 0 || n < 0) return invalid_argument("cuda argmax_rows: negative rows or width");
  if (n > std::numeric_limits<int32_t>::max())
    return invalid_argument("cuda argmax_rows: rows of " + std::to_string(n) +
                            " values do not fit int32 indices");
  if (rows == 0) return Status::Ok();
  if (!out || (n > 0 && !x)) return invalid_argument("cuda argmax_rows: null input or output");
  if (graph_skip(9, {arg(x), arg(rows), arg(n), arg(out)})) return Status::Ok();
  return launched(detail::launch_argmax_rows(x, rows, n, out, stream_), "argmax_rows");
}

}  // namespace cisa::cuda
