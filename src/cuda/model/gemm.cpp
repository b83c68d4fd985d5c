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

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "skinny_gemm.cuh"

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

// One way to run a shape: a cuBLASLt algorithm, or (skinny_splits > 0) a few-row kernel of
// skinny_gemm.cuh with that many K slices: the tensor-core kernel with skinny_unroll k steps in
// flight, or (stream_rows > 0) the streaming kernel with that many W rows per warp.
struct Candidate {
  cublasLtMatmulAlgo_t algo{};
  int skinny_splits = 0;
  int skinny_unroll = 4;
  int stream_rows = 0;
};

// The descriptors and the chosen way of one shape; owns the layouts.
struct Plan {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Candidate choice;
  std::string note;  // what was chosen and how (Gemm::describe)
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

// A candidate in words (Gemm::describe).
std::string label(const Candidate& c) {
  if (c.stream_rows > 0)
    return "streaming kernel, " + std::to_string(c.stream_rows) + " W rows a warp, " +
           std::to_string(c.skinny_splits) + " K slices";
  if (c.skinny_splits > 0)
    return "tensor-core few-row kernel, " + std::to_string(c.skinny_unroll) +
           " k steps in flight, " + std::to_string(c.skinny_splits) + " K slices";
  int32_t id = -1, splits = 1;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                       sizeof splits, &written);
  return "cuBLASLt algorithm " + std::to_string(id) + ", split K " + std::to_string(splits);
}

// n tiles of the skinny kernel the counters serve (n ≤ 4 M outputs).
constexpr int64_t kSkinnyMaxTiles = int64_t{1} << 16;

// Products of up to kTimedRowsMax rows (decode steps: the weights' bytes are the whole cost, and
// the heuristic's first pick can be far from the bandwidth) time up to kCandidates algorithms.
constexpr int kCandidates = 16;
constexpr int64_t kTimedRowsMax = 256;
constexpr int kTimedRuns = 5;  // each after an L2 flush; a candidate's time is their median
// The timing runs each candidate alone, but in a decode step the few-row kernels overlap: they
// issue their first weight loads before the programmatic-dependent-launch wait (pdl.cuh), so
// those overlap the previous kernel's tail, and they let the next kernel launch early.
// cuBLASLt's kernels do neither. So a few-row candidate within this fraction of a faster cuBLASLt
// one is chosen: at 2 x 1M the isolated times were within 1-8 % of each other, and which side won
// changed from process to process (docs/cuda-model.md, 2026-12-04).
constexpr float kOwnKernelMargin = 0.10f;
// GemmOptions::batch_invariant: a shape's one algorithm is the heuristic's first pick for this many
// rows (the model's prefill block) that runs with K unsplit, and every row count runs it. Its
// alignment preference is capped at 16 bytes, so that the pick serves every operand offset the
// model passes (rows of bf16 or f32 matrices whose widths are multiples of 8).
constexpr int64_t kInvariantRows = 512;
constexpr uint32_t kInvariantAlign = 16;

}  // namespace

// n, k, ldy and the alignments (capped at kInvariantAlign) of a batch-invariant algorithm.
using InvariantKey = std::tuple<int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>;

struct Gemm::Impl {
  GemmOptions options;
  std::map<InvariantKey, cublasLtMatmulAlgo_t> invariant;  // batch_invariant: algorithm per shape
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;  // TN, f32 compute and scale: the same for every shape
  void* workspace = nullptr;            // device, kWorkspaceBytes (also the skinny partials)
  int* counters = nullptr;              // device, kSkinnyMaxTiles zeros (skinny split K)
  void* l2_flush = nullptr;  // device, l2_flush_bytes + 16, zero: read before each timed run
  size_t l2_flush_bytes = 0;
  int sms = 132;
  mutable std::mutex mu;
  std::map<ShapeKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (handle) cublasLtDestroy(handle);
    if (workspace) cudaFree(workspace);
    if (counters) cudaFree(counters);
    if (l2_flush) cudaFree(l2_flush);
  }

  // Launches the plan's choice for one call.
  cublasStatus_t launch(const Plan& p, const Candidate& c, const Call& call, int64_t n, int64_t k,
                        int64_t rows, int64_t ldy) {
    if (c.skinny_splits > 0) {
      const auto* w = static_cast<const uint16_t*>(call.w);
      const auto* x = static_cast<const uint16_t*>(call.x);
      auto* y = static_cast<float*>(call.y);
      auto* ws = static_cast<float*>(workspace);
      const cudaError_t e =
          c.stream_rows > 0
              ? detail::launch_skinny_stream(w, n, k, x, rows, y, ldy, c.skinny_splits, ws,
                                             counters, call.stream, c.stream_rows)
              : detail::launch_skinny_gemm(w, n, k, x, rows, y, ldy, c.skinny_splits, ws, counters,
                                           call.stream, c.skinny_unroll);
      return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
    }
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle, desc, &alpha, call.w, p.a, call.x, p.b, &beta, call.y, p.c,
                          call.y, p.c, &c.algo, workspace, kWorkspaceBytes, call.stream);
  }

  // The few-row kernels' candidates for a shape. The tensor-core kernel: the default K split,
  // half and twice it, and the two splits that spread the blocks most evenly over the SMs, each
  // with 4 and 8 k steps in flight. The streaming kernel (≤ 4 rows): its split candidates with 4
  // and 8 W rows per warp.
  void add_skinny(int64_t n, int64_t k, int64_t rows, const Call& call,
                  std::vector<Candidate>* cand) const {
    const auto fits = [&](int s) {
      return detail::skinny_gemm_workspace_floats(n, rows, s) * 4 <=
             static_cast<int64_t>(kWorkspaceBytes);
    };
    for (const int r : {4, 8}) {
      if (!detail::skinny_stream_applies(n, k, rows, call.w, call.x, kSkinnyMaxTiles, r)) continue;
      for (const int s : detail::skinny_stream_splits(n, k, sms, r))
        if (fits(s)) cand->push_back({.skinny_splits = s, .stream_rows = r});
    }
    if (!detail::skinny_gemm_applies(n, k, rows, call.w, call.x, kSkinnyMaxTiles)) return;
    const int d = detail::skinny_gemm_default_splits(n, k, sms);
    std::vector<int> splits = {d, std::max(1, d / 2), 2 * d};
    for (const int s : detail::skinny_gemm_balanced_splits(n, k, sms)) splits.push_back(s);
    for (const int s : splits) {
      if (!fits(s)) continue;
      if (std::none_of(cand->begin(), cand->end(), [s](const Candidate& c) {
            return c.skinny_splits == s && c.stream_rows == 0;
          }))
        for (const int u : {4, 8}) cand->push_back({.skinny_splits = s, .skinny_unroll = u});
    }
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

    if (options.batch_invariant) {
      CISA_ASSIGN_OR_RETURN(p->choice.algo, invariant_algo(n, k, ldy, align_w, align_x, align_y));
      cublasLtMatmulHeuristicResult_t check{};
      const cublasStatus_t s =
          cublasLtMatmulAlgoCheck(handle, desc, p->a, p->b, p->c, p->c, &p->choice.algo, &check);
      if (s != CUBLAS_STATUS_SUCCESS || check.workspaceSize > kWorkspaceBytes)
        return internal_error("cuda gemm: the batch-invariant algorithm of n = " +
                              std::to_string(n) + ", k = " + std::to_string(k) + " does not run " +
                              std::to_string(rows) + " rows (" + cublasLtGetStatusName(s) + ")");
      p->note = label(p->choice) + " (batch-invariant: one algorithm, every row count)";
    } else {
      cublasLtMatmulHeuristicResult_t results[kCandidates]{};
      int found = 0;
      CISA_RETURN_IF_ERROR(
          heuristic(*p, {align_w, align_x, align_y}, results, &found, n, k, rows, ldy));
      p->choice = {.algo = results[0].algo};
      p->note = label(p->choice) + " (the heuristic's first pick, untimed)";
      if (rows <= kTimedRowsMax) {
        std::vector<Candidate> cand;
        for (int i = 0; i < found; ++i)
          if (results[i].state == CUBLAS_STATUS_SUCCESS) cand.push_back({.algo = results[i].algo});
        add_split_k_variants(*p, &cand);
        add_skinny(n, k, rows, call, &cand);
        if (cand.size() > 1) fastest(*p, cand, call, n, k, rows, ldy);
      }
    }
    p->note = std::to_string(n) + " x " + std::to_string(k) + ", " + std::to_string(rows) +
              " rows: " + p->note;
    if (plans.size() >= kMaxCachedShapes) plans.clear();
    return plans.emplace(key, std::move(p)).first->second.get();
  }

  // Up to kCandidates algorithms of the heuristic for the plan's layouts, whose operands are
  // aligned to `aligns` (W, x, y) bytes; an error when it has none.
  Status heuristic(const Plan& p, const std::array<uint32_t, 3>& aligns,
                   cublasLtMatmulHeuristicResult_t* results, int* found, int64_t n, int64_t k,
                   int64_t rows, int64_t ldy) {
    cublasLtMatmulPreference_t pref = nullptr;
    CISA_BLAS_OK(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t ws = kWorkspaceBytes;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const uint32_t al[4] = {aligns[0], aligns[1], aligns[2], aligns[2]};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; ++i)
      s = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
    *found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(handle, desc, p.a, p.b, p.c, p.c, pref, kCandidates,
                                         results, found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) return blas_error(s, "algorithm heuristic");
    if (*found < 1 || results[0].state != CUBLAS_STATUS_SUCCESS)
      return internal_error(
          "cuda gemm: cuBLASLt has no bf16 → f32 algorithm for n = " + std::to_string(n) +
          ", k = " + std::to_string(k) + ", rows = " + std::to_string(rows) +
          ", ldy = " + std::to_string(ldy) + " (alignments " + std::to_string(aligns[0]) + "/" +
          std::to_string(aligns[1]) + "/" + std::to_string(aligns[2]) + " bytes): " +
          cublasLtGetStatusName(*found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : results[0].state));
    return Status::Ok();
  }

  // GemmOptions::batch_invariant: the one algorithm of a shape, made on first use: the first of
  // the heuristic's picks for kInvariantRows rows that runs with K unsplit (its split count set to
  // 1 where it had more).
  Result<cublasLtMatmulAlgo_t> invariant_algo(int64_t n, int64_t k, int64_t ldy, uint32_t align_w,
                                              uint32_t align_x, uint32_t align_y) {
    const std::array<uint32_t, 3> al = {std::min(align_w, kInvariantAlign),
                                        std::min(align_x, kInvariantAlign),
                                        std::min(align_y, kInvariantAlign)};
    const InvariantKey key{n, k, ldy, al[0], al[1], al[2]};
    if (auto it = invariant.find(key); it != invariant.end()) return it->second;
    Plan ref;
    const auto un = static_cast<uint64_t>(n), uk = static_cast<uint64_t>(k),
               ur = static_cast<uint64_t>(kInvariantRows);
    CISA_BLAS_OK(cublasLtMatrixLayoutCreate(&ref.a, CUDA_R_16BF, uk, un, k), "layout of W");
    CISA_BLAS_OK(cublasLtMatrixLayoutCreate(&ref.b, CUDA_R_16BF, uk, ur, k), "layout of x");
    CISA_BLAS_OK(cublasLtMatrixLayoutCreate(&ref.c, CUDA_R_32F, un, ur, ldy), "layout of y");
    cublasLtMatmulHeuristicResult_t results[kCandidates]{};
    int found = 0;
    CISA_RETURN_IF_ERROR(heuristic(ref, al, results, &found, n, k, kInvariantRows, ldy));
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      cublasLtMatmulAlgo_t a = results[i].algo;
      int32_t splits = 1;
      size_t written = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                               sizeof splits, &written) != CUBLAS_STATUS_SUCCESS)
        continue;
      if (splits > 1) {
        const int32_t one = 1;
        const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                                 sizeof one) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                                 sizeof none) != CUBLAS_STATUS_SUCCESS)
          continue;
      }
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(handle, desc, ref.a, ref.b, ref.c, ref.c, &a, &check) !=
              CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > kWorkspaceBytes)
        continue;
      return invariant.emplace(key, a).first->second;
    }
    return internal_error("cuda gemm: no cuBLASLt algorithm runs n = " + std::to_string(n) +
                          ", k = " + std::to_string(k) + " with K unsplit (batch-invariant)");
  }

  // Copies of the heuristic's candidates that split K over 2-16 slices, where the algorithm
  // takes a split and the heuristic chose none: with a few rows and a square matrix (the
  // attention output, 3584 x 3584) the heuristic's kernels leave most SMs idle (measured 1.9 TB/s
  // of weights, 2026-12-02). Each is checked by cublasLtMatmulAlgoCheck against the workspace.
  void add_split_k_variants(const Plan& p, std::vector<Candidate>* cand) {
    const size_t heuristic = cand->size();
    for (size_t i = 0; i < heuristic; ++i) {
      int32_t supported = 0, splits = 1;
      size_t written = 0;
      if (cublasLtMatmulAlgoCapGetAttribute(&(*cand)[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT,
                                            &supported, sizeof supported,
                                            &written) != CUBLAS_STATUS_SUCCESS ||
          !supported ||
          cublasLtMatmulAlgoConfigGetAttribute(&(*cand)[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                               &splits, sizeof splits,
                                               &written) != CUBLAS_STATUS_SUCCESS ||
          splits > 1)
        continue;
      for (const int32_t k : {2, 4, 8, 16}) {
        cublasLtMatmulAlgo_t a = (*cand)[i].algo;
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k,
                                                 sizeof k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoCheck(handle, desc, p.a, p.b, p.c, p.c, &a, &check) ==
                CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= kWorkspaceBytes)
          cand->push_back({.algo = a});
      }
    }
  }

  // A zeroed buffer of twice the L2's size (and 16 bytes for the sweep's sink), allocated on the
  // first timing (nullptr where it cannot be: the timing then runs with whatever L2 holds).
  void* flush_buffer() {
    if (l2_flush) return l2_flush;
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess || l2 <= 0 ||
        cudaMalloc(&l2_flush, 2 * static_cast<size_t>(l2) + 16) != cudaSuccess ||
        cudaMemset(l2_flush, 0, 2 * static_cast<size_t>(l2) + 16) != cudaSuccess) {
      cudaGetLastError();
      if (l2_flush) cudaFree(l2_flush);
      l2_flush = nullptr;
      return nullptr;
    }
    l2_flush_bytes = 2 * static_cast<size_t>(l2);
    return l2_flush;
  }

  // The fastest of the candidates on this call's own operands: each run once to warm up, then
  // kTimedRuns rounds that time every candidate once with events on the call's stream (rounds,
  // so that a drift of the clocks weighs on all alike), a candidate's median counting (the result
  // is overwritten by the call itself). Before each timed run a read of twice the L2's size
  // evicts W: in a decode step every layer's weights come from HBM (the step streams gigabytes
  // between two reads of one matrix), while a matrix of up to ~25 MB (the attention output,
  // q/k/v) timed back to back is read from L2, which favours kernels that are slower from HBM. A
  // read, not a memset: a memset leaves L2 full of dirty lines, and their write-backs during the
  // timed run slowed kernels unevenly (the choices moved between loads, 2026-12-03). The first
  // candidate when the stream is being captured or timing fails.
  void fastest(Plan& p, const std::vector<Candidate>& cand, const Call& call, int64_t n, int64_t k,
               int64_t rows, int64_t ldy) {
    p.choice = cand[0];
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(call.stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      p.note = label(p.choice) + " (first candidate: shape first seen during a stream capture)";
      return;
    }
    cudaEvent_t ev[2] = {nullptr, nullptr};
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
      cudaGetLastError();
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
      p.note = label(p.choice) + " (first candidate: no timing events)";
      return;
    }
    char* flush = static_cast<char*>(flush_buffer());
    auto run = [&](const Candidate& c) { return launch(p, c, call, n, k, rows, ldy); };
    std::vector<std::vector<float>> times(cand.size());
    std::vector<bool> ok(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) {
      ok[i] = run(cand[i]) == CUBLAS_STATUS_SUCCESS;
      if (!ok[i]) cudaGetLastError();
    }
    for (int r = 0; r < kTimedRuns; ++r)
      for (size_t i = 0; i < cand.size(); ++i) {
        if (!ok[i]) continue;
        bool good =
            !flush || detail::launch_read_sweep(flush, l2_flush_bytes, flush + l2_flush_bytes, sms,
                                                call.stream) == cudaSuccess;
        float ms = 0.0f;
        good = good && cudaEventRecord(ev[0], call.stream) == cudaSuccess &&
               run(cand[i]) == CUBLAS_STATUS_SUCCESS &&
               cudaEventRecord(ev[1], call.stream) == cudaSuccess &&
               cudaEventSynchronize(ev[1]) == cudaSuccess &&
               cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess;
        if (!good) {
          cudaGetLastError();
          ok[i] = false;
          continue;
        }
        times[i].push_back(ms);
      }
    // Medians, fastest first.
    std::vector<std::pair<float, size_t>> med;
    for (size_t i = 0; i < cand.size(); ++i) {
      if (!ok[i]) continue;
      std::vector<float>& t = times[i];
      std::nth_element(t.begin(), t.begin() + kTimedRuns / 2, t.end());
      med.emplace_back(t[kTimedRuns / 2], i);
    }
    std::stable_sort(med.begin(), med.end());
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    if (med.empty()) {
      p.note = label(p.choice) + " (first candidate: no candidate could be timed)";
      return;
    }
    const auto us = [](float ms) { return std::to_string(static_cast<int>(ms * 1000.0f + 0.5f)); };
    // A few-row kernel within kOwnKernelMargin of a faster cuBLASLt candidate is taken instead.
    size_t pick = 0;
    if (cand[med[0].second].skinny_splits == 0)
      for (size_t i = 1; i < med.size(); ++i)
        if (cand[med[i].second].skinny_splits > 0) {
          if (med[i].first <= med[0].first * (1.0f + kOwnKernelMargin)) pick = i;
          break;
        }
    p.choice = cand[med[pick].second];
    p.note = label(p.choice) + ", " + us(med[pick].first) + " us (median of " +
             std::to_string(kTimedRuns) + ", " +
             (pick == 0 ? "fastest of " + std::to_string(med.size()) + " timed"
                        : "within " + std::to_string(static_cast<int>(kOwnKernelMargin * 100)) +
                              "% of the fastest of " + std::to_string(med.size()) + " timed");
    const size_t other = pick == 0 ? 1 : 0;
    if (med.size() > 1)
      p.note += "; " + std::string(pick == 0 ? "next " : "fastest ") +
                label(cand[med[other].second]) + ", " + us(med[other].first) + " us";
    p.note += ")";
  }
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

Result<std::unique_ptr<Gemm>> Gemm::create(const GemmOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
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
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&impl->sms, cudaDevAttrMultiProcessorCount, dev);
  cudaError_t err = cudaMalloc(&impl->workspace, kWorkspaceBytes);
  if (err == cudaSuccess) {
    err = cudaMalloc(&impl->counters, kSkinnyMaxTiles * sizeof(int));
    if (err == cudaSuccess) err = cudaMemset(impl->counters, 0, kSkinnyMaxTiles * sizeof(int));
  }
  if (err != cudaSuccess) {
    if (impl->workspace) cudaFree(impl->workspace);
    impl->workspace = nullptr;
    const std::string m = std::string("cuda gemm: workspace of ") +
                          std::to_string(kWorkspaceBytes >> 20) +
                          " MiB and split-K counters: " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")";
    cudaGetLastError();
    return err == cudaErrorMemoryAllocation ? resource_exhausted(m) : unavailable(m);
  }
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

std::vector<std::string> Gemm::describe() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [key, plan] : impl_->plans) out.push_back(plan->note);
  return out;
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
  CISA_BLAS_OK(
      impl_->launch(*p, p->choice, {w, x, y, static_cast<cudaStream_t>(stream)}, n, k, rows, ldy),
      p->choice.skinny_splits > 0 ? "the few-row GEMM kernel's launch" : "cublasLtMatmul");
  return Status::Ok();
}

int64_t Gemm::cached_shapes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int64_t>(impl_->plans.size());
}

}  // namespace cisa::cuda
