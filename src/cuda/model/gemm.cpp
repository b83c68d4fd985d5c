// cuBLASLt matrix products of the model (gemm.h).
//
// Layouts. cuBLASLt is column-major; a row-major matrix M[r][c] with leading dimension ld is the
// column-major Mᵀ (c × r, same ld). So, row-major:
//   W [n][k]     → column-major k × n, ld k     (A, used transposed: op(A) = n × k)
//   X [rows][k]  → column-major k × rows, ld k  (B, not transposed)
//   Y [rows][ldy]→ column-major n × rows, ld ldy (C = D)
// and Yᵀ = W Xᵀ is D = op(A) · B with m = n, n = rows, k = k: the "TN" product.
#include "gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace cisa::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS' recommendation for Hopper
constexpr size_t kMaxCachedShapes = 1024;  // prefill row counts vary; start over past this

Status blas_error(cublasStatus_t s, const char* what) {
  return internal_error(std::string("cuda gemm: ") + what + " failed: " + cublasLtGetStatusName(s) +
                        " (" + cublasLtGetStatusString(s) + ")");
}

#define CISA_BLAS_OK(expr, what)                                                      \
  do {                                                                                \
    const cublasStatus_t blas_status_ = (expr);                                       \
    if (blas_status_ != CUBLAS_STATUS_SUCCESS) return blas_error(blas_status_, what); \
  } while (0)

// The largest power of two (≤ 256) that divides the address: what cuBLASLt may assume of it.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// The descriptors and the chosen algorithm of one shape; owns the layouts.
struct Plan {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

// n, k, rows, ldy, alignment of w, x, y
using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>;

// The operands of one run() (what the first call of a shape times its candidates on).
struct Call {
  const void* w;
  const void* x;
  void* y;
  cudaStream_t stream;
};

// Products of up to kTimedRowsMax rows (decode steps: the weights' bytes are the whole cost, and
// the heuristic's first pick can be far from the bandwidth) time up to kCandidates algorithms.
constexpr int kCandidates = 8;
constexpr int64_t kTimedRowsMax = 256;
constexpr int kTimedRuns = 3;

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;  // TN, f32 compute and scale: the same for every shape
  void* workspace = nullptr;            // device, kWorkspaceBytes
  mutable std::mutex mu;
  std::map<ShapeKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (handle) cublasLtDestroy(handle);
    if (workspace) cudaFree(workspace);
  }

  // The cached plan of a shape, made (layouts + heuristic, and for small row counts the fastest of
  // the heuristic's candidates, timed on `call`) on first use.
  Result<const Plan*> plan(const ShapeKey& key, const Call& call) {
    if (auto it = plans.find(key); it != plans.end()) return it->second.get();
    const auto [n, k, rows, ldy, align_w, align_x, align_y] = key;
    auto p = std::make_unique<Plan>();
    const auto un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k),
               ur = static_cast<uint64_t>(rows);
    CISA_BLAS_OK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, uk, un, k), "layout of W");
    CISA_BLAS_OK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, uk, ur, k), "layout of x");
    CISA_BLAS_OK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, un, ur, ldy), "layout of y");

    cublasLtMatmulPreference_t pref = nullptr;
    CISA_BLAS_OK(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t ws = kWorkspaceBytes;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const uint32_t aligns[4] = {align_w, align_x, align_y, align_y};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; ++i)
      s = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &aligns[i], sizeof aligns[i]);
    cublasLtMatmulHeuristicResult_t results[kCandidates]{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(handle, desc, p->a, p->b, p->c, p->c, pref, kCandidates,
                                         results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) return blas_error(s, "algorithm heuristic");
    if (found < 1 || results[0].state != CUBLAS_STATUS_SUCCESS)
      return internal_error(
          "cuda gemm: cuBLASLt has no bf16 → f32 algorithm for n = " + std::to_string(n) +
          ", k = " + std::to_string(k) + ", rows = " + std::to_string(rows) +
          ", ldy = " + std::to_string(ldy) + " (alignments " + std::to_string(align_w) + "/" +
          std::to_string(align_x) + "/" + std::to_string(align_y) + " bytes): " +
          cublasLtGetStatusName(found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : results[0].state));
    p->algo = results[0].algo;
    if (rows <= kTimedRowsMax && found > 1) p->algo = fastest(*p, results, found, call);
    if (plans.size() >= kMaxCachedShapes) plans.clear();
    return plans.emplace(key, std::move(p)).first->second.get();
  }

  // The fastest of the heuristic's candidates on this call's own operands (each run once to warm
  // up, then timed over kTimedRuns with events on the call's stream; the result is overwritten by
  // the call itself). The heuristic's first pick when the stream is being captured or timing fails.
  cublasLtMatmulAlgo_t fastest(const Plan& p, const cublasLtMatmulHeuristicResult_t* cand,
                               int found, const Call& call) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(call.stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return cand[0].algo;
    }
    cudaEvent_t ev[2] = {nullptr, nullptr};
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
      cudaGetLastError();
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
      return cand[0].algo;
    }
    const float alpha = 1.0f, beta = 0.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& a) {
      return cublasLtMatmul(handle, desc, &alpha, call.w, p.a, call.x, p.b, &beta, call.y, p.c,
                            call.y, p.c, &a, workspace, kWorkspaceBytes, call.stream);
    };
    cublasLtMatmulAlgo_t best = cand[0].algo;
    float best_ms = -1.0f;
    for (int i = 0; i < found; ++i) {
      if (cand[i].state != CUBLAS_STATUS_SUCCESS || run(cand[i].algo) != CUBLAS_STATUS_SUCCESS)
        continue;
      bool ok = cudaEventRecord(ev[0], call.stream) == cudaSuccess;
      for (int r = 0; ok && r < kTimedRuns; ++r) ok = run(cand[i].algo) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cudaEventRecord(ev[1], call.stream) == cudaSuccess &&
           cudaEventSynchronize(ev[1]) == cudaSuccess;
      float ms = 0.0f;
      ok = ok && cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess;
      if (!ok) {
        cudaGetLastError();
        continue;
      }
      if (best_ms < 0.0f || ms < best_ms) {
        best_ms = ms;
        best = cand[i].algo;
      }
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    return best;
  }
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

Result<std::unique_ptr<Gemm>> Gemm::create() {
  auto impl = std::make_unique<Impl>();
  CISA_BLAS_OK(cublasLtCreate(&impl->handle), "cublasLtCreate");
  CISA_BLAS_OK(cublasLtMatmulDescCreate(&impl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "matmul description");
  const cublasOperation_t trans_w = CUBLAS_OP_T, trans_x = CUBLAS_OP_N;
  CISA_BLAS_OK(cublasLtMatmulDescSetAttribute(impl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w,
                                              sizeof trans_w),
               "transpose of W");
  CISA_BLAS_OK(cublasLtMatmulDescSetAttribute(impl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_x,
                                              sizeof trans_x),
               "transpose of x");
  const cudaError_t err = cudaMalloc(&impl->workspace, kWorkspaceBytes);
  if (err != cudaSuccess) {
    impl->workspace = nullptr;
    const std::string m = std::string("cuda gemm: workspace of ") +
                          std::to_string(kWorkspaceBytes >> 20) + " MiB: " + cudaGetErrorName(err) +
                          " (" + cudaGetErrorString(err) + ")";
    cudaGetLastError();
    return err == cudaErrorMemoryAllocation ? resource_exhausted(m) : unavailable(m);
  }
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

Status Gemm::run(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t rows, float* y,
                 int64_t ldy, void* stream) {
  if (n < 1 || k < 1 || rows < 0 || ldy < n)
    return invalid_argument("cuda gemm: bad shape n = " + std::to_string(n) +
                            ", k = " + std::to_string(k) + ", rows = " + std::to_string(rows) +
                            ", ldy = " + std::to_string(ldy) +
                            " (need n, k >= 1, rows >= 0, ldy >= n)");
  if (rows == 0) return Status::Ok();
  if (!w || !x || !y) return invalid_argument("cuda gemm: null W, x or y pointer");
  std::lock_guard<std::mutex> lock(impl_->mu);
  const ShapeKey key{n, k, rows, ldy, alignment_of(w), alignment_of(x), alignment_of(y)};
  CISA_ASSIGN_OR_RETURN(const Plan* p,
                        impl_->plan(key, {w, x, y, static_cast<cudaStream_t>(stream)}));
  const float alpha = 1.0f, beta = 0.0f;
  CISA_BLAS_OK(cublasLtMatmul(impl_->handle, impl_->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c,
                              y, p->c, &p->algo, impl_->workspace, kWorkspaceBytes,
                              static_cast<cudaStream_t>(stream)),
               "cublasLtMatmul");
  return Status::Ok();
}

int64_t Gemm::cached_shapes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int64_t>(impl_->plans.size());
}

}  // namespace cisa::cuda
