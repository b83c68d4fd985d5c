// cisa::cuda::Gemm — the model's matrix products on the GPU: y = W x for every row x, with bf16
// weights and activations, f32 accumulation (CUBLAS_COMPUTE_32F) and an f32 result, on cuBLASLt.
//
// One Gemm per backend (it owns a cuBLASLt handle and a 32 MiB workspace); it caches the matmul
// description and an algorithm per shape and pointer alignment, so repeated shapes (every decode
// step) skip the choice. For up to 256 rows (decode: the weights' bytes are the cost) the first
// call of a shape times up to 16 of the heuristic's candidates, and their split-K variants, on its
// own operands (synchronising the stream once) and keeps the fastest; more rows take the
// heuristic's first pick. run() only enqueues on `stream` once a shape has been seen (CUDA-graph
// safe; during a capture a new shape takes the heuristic's first pick, untimed). Not for concurrent
// use from several streams: the workspace is shared (calls are serialised on the host by a mutex,
// but two streams could still overlap on the device).
//
// GemmOptions::batch_invariant trades speed for one reduction order per matrix: every row count
// of a shape (n x k, ldy) runs the same cuBLASLt algorithm with K unsplit, so row r of y is the
// same bits whether x holds 1 row or 4,000 (a sequence alone and in a batch give the same logits).
// Without it, the algorithm, K split and few-row kernel are chosen per row count.
//
//   auto gemm = *cisa::cuda::Gemm::create();
//   // W: device bf16 [n][k]; x: device bf16 [rows][k]; y: device f32 [rows][ldy], ldy ≥ n
//   CISA_RETURN_IF_ERROR(gemm->run(w, n, k, x, rows, y, /*ldy=*/n, stream));
//
// No CUDA headers here: the stream is a cudaStream_t passed as void*.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cisa/core/status.h"

namespace cisa::cuda {

struct GemmOptions {
  // One algorithm per shape for every row count, K never split (see above).
  bool batch_invariant = false;
};

class Gemm {
 public:
  // Creates the cuBLASLt handle and the workspace on the current device.
  static Result<std::unique_ptr<Gemm>> create(const GemmOptions& options = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[r][o] = Σ_c w[o][c] · x[r][c] for r < rows, o < n (row-major; y[r][n..ldy) untouched).
  //   w: device bf16 [n][k]; x: device bf16 [rows][k]; y: device f32 [rows][ldy].
  // n, k ≥ 1, ldy ≥ n; rows = 0 does nothing. Errors: invalid_argument for bad shapes or null
  // pointers, internal (with the cuBLAS status name) for a cuBLASLt failure or no algorithm.
  Status run(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t rows, float* y,
             int64_t ldy, void* stream);

  // One line per cached shape: its n x k and rows, the chosen kernel and, for timed shapes,
  // its median time and the runner-up's (benchmark reports: which kernels a step ran).
  std::vector<std::string> describe() const;

  // Shapes whose descriptors and algorithm are cached (tests and logs).
  int64_t cached_shapes() const;

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cisa::cuda
