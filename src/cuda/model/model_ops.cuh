// Element-wise and per-row kernels of the transformer layers on the GPU (the CUDA twins of
// src/model/model_ops.h and the CPU backend's operations): embedding lookup, RMSNorm, RoPE, gated
// activations, residual add, f16 rounding, head means, row gathers, f32 ↔ bf16 conversion and the
// paged-KV append. All take raw device pointers (shapes beside each) and enqueue on `stream`; none
// allocates or synchronises, so a step made of them can be captured in a CUDA graph.
// The reference for each is the CPU operation; tests/gpu/cuda_model_ops_test.cpp compares them.
// Bad arguments (negative sizes, null pointers with work to do, odd d for RoPE, hq not a multiple
// of hkv) return cudaErrorInvalidValue before anything is launched; empty work launches nothing.
//
//   CISA_RETURN_IF_ERROR(
//       cuda_status(detail::launch_rms_norm(x, w, x, rows, n, eps, stream), "rms_norm"));
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cisa::cuda::detail {

// x[r][i] = bf16 table[tokens[r]][i] · scale.  table: [n_vocab][n], tokens: [rows], x: [rows][n]
// With n_vocab > 0 a token outside [0, n_vocab) gives a row of NaN instead of a read past the
// table (tokens live on the device, so the host cannot check them); n_vocab = 0 trusts them.
cudaError_t launch_embed(const uint16_t* table, const int32_t* tokens, int64_t rows, int64_t n,
                         float scale, float* x, cudaStream_t stream, int64_t n_vocab = 0);

// y[r] = x[r] / sqrt(mean(x[r]²) + eps) ⊙ w (w may be null). x, y: [rows][n]; may alias;
// w: [n]; n ≥ 1. Sums of squares in f32 (one warp per row up to n = 1024, else a block).
// yb (optional): y rounded to bf16 as well (launch_f32_to_bf16's values), the next GEMM's input.
cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                            float eps, cudaStream_t stream, uint16_t* yb = nullptr);
// The residual add fused in front: x[r] += add[r] (written back), then y[r] = rms_norm(x[r]) as
// above (add may be null: launch_rms_norm). x and add: [rows][n]; y must not alias add.
cudaError_t launch_add_rms_norm(float* x, const float* add, const float* w, float* y, int64_t rows,
                                int n, float eps, cudaStream_t stream, uint16_t* yb = nullptr);

// Rotates x: [rows][heads][d] in place by cos/sin: [rows][d/2]; neox pairs i with i + d/2,
// otherwise 2i with 2i + 1; d even. Bit-identical to ops::rope_apply (the same fma and product).
cudaError_t launch_rope(float* x, int64_t rows, int heads, int d, const float* cos,
                        const float* sin, bool neox, cudaStream_t stream);

// The same rotation of several tensors at once (q, k and the index queries): part i is
// x[i]: [rows][heads[i]][d] (heads 0: nothing), one launch.
constexpr int kMaxRopeParts = 4;
struct RopeParts {
  float* x[kMaxRopeParts] = {};
  int heads[kMaxRopeParts] = {};
  int count = 0;
};
cudaError_t launch_rope_many(const RopeParts& parts, int64_t rows, int d, const float* cos,
                             const float* sin, bool neox, cudaStream_t stream);

// out[r][i] = act(gate[r][i]) · up[r][i]; act = GELU(tanh) when gelu, else SiLU. [rows][n];
// out may alias gate or up. GELU is the exact tanh form (ops::gelu_tanh), not llama.cpp's f16
// table; both use expf (a few ulp from ops::gelu_tanh / ops::silu). outb (optional): out
// rounded to bf16 as well, the down projection's input.
cudaError_t launch_gated_activation(bool gelu, const float* gate, const float* up, float* out,
                                    int64_t rows, int64_t n, cudaStream_t stream,
                                    uint16_t* outb = nullptr);

// The gated activation over a stacked product y: [rows][2n] (gate's n columns, then up's):
// out[r][i] = act(y[r][i]) · y[r][n + i], out: [rows][n]; outb (optional) its bf16 copy.
cudaError_t launch_gated_stacked(bool gelu, const float* y, int64_t rows, int64_t n, float* out,
                                 uint16_t* outb, cudaStream_t stream);

// y[i] += x[i]
cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t stream);

// x[i] = nearest IEEE half of x[i], as f32
cudaError_t launch_round_f16(float* x, int64_t n, cudaStream_t stream);

// out[r][g] = mean over h in group g of q[r][h], group g = heads [g·hq/hkv, (g+1)·hq/hkv)
// (summed in f32, times 1/(hq/hkv)). q: [rows][hq][d], out: [rows][hkv][d]; hq % hkv == 0.
cudaError_t launch_mean_heads(const float* q, int64_t rows, int hq, int hkv, int d, float* out,
                              cudaStream_t stream);

// out[i] = x[rows[i]] (width values). rows: device int64 [n], trusted (the caller checks them
// on the host before uploading). x: [*][width], out: [n][width].
cudaError_t launch_gather_rows(const float* x, const int64_t* rows, int64_t n, int64_t width,
                               float* out, cudaStream_t stream);

// out[r] = argmax of x[r][0..n): ties to the smaller index, NaN never wins, a row of NaN gives 0,
// n = 0 gives -1 (cisa::argmax, sampling.h). x: [rows][n], out: int32 [rows]. One block per row.
cudaError_t launch_argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out,
                               cudaStream_t stream);

// bf16 ↔ f32, n values (round to nearest even, bit-identical to cisa::f32_to_bf16).
cudaError_t launch_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
cudaError_t launch_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);

// The column blocks of a stacked product (CudaBackend::matmul_many): part i of row r is
// y[r][offset_i .. offset_i + cols_i), copied to dst_i[r][0 .. cols_i). y: [rows][width].
constexpr int kMaxSplitParts = 4;
struct SplitParts {
  float* dst[kMaxSplitParts];
  int64_t offset[kMaxSplitParts];
  int64_t cols[kMaxSplitParts];
  int count = 0;
};
cudaError_t launch_split_columns(const float* y, int64_t rows, int64_t width,
                                 const SplitParts& parts, cudaStream_t stream);

// Paged KV append: row r of the step (r < rows) is token slots[r] of the pools, where
// slots[r] = physical_page · 16 + offset in page. k, v: f32 [rows][num_kv_heads][head_dim];
// k_pool, v_pool: bf16 [num_pages][num_kv_heads][16][head_dim]. slots: device int64 [rows],
// trusted; a negative slot skips its row (padding). Rounding as PagedKvCache's bf16 store.
cudaError_t launch_append_kv(const float* k, const float* v, const int64_t* slots, int64_t rows,
                             int num_kv_heads, int head_dim, uint16_t* k_pool, uint16_t* v_pool,
                             cudaStream_t stream);

}  // namespace cisa::cuda::detail
