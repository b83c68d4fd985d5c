// The decode-step product y = W x for a few rows x (≤ 16): every weight is read once, so the
// cost is the weights' bytes, and cuBLASLt's kernels for these shapes reach 1.9-3.7 TB/s of the
// H200's ~4.4 (ncu, 2026-12-02: the 3584 x 3584 attention output 13 µs for 25.7 MB). This kernel
// streams W with 16-byte loads straight into bf16 tensor-core fragments (mma.sync m16n8k16, f32
// accumulation), no shared-memory staging, and splits K across blocks to fill the GPU.
//
// Layout trick: a dot product may visit k in any order, so lane (g, t) of a warp loads the 16
// contiguous bytes k = 32s + 8t … 8t + 7 of W rows g and g + 8 and of x row g, and feeds them to
// two MMAs whose fragment k indices (2t, 2t+1, 2t+8, 2t+9) stand for physical k 8t … 8t+3 and
// 8t+4 … 8t+7: the A and B fragments agree on the permutation, and every load is a full,
// coalesced 16 bytes.
//
// Split K: blocks (n tile, slice) write f32 partials to a workspace; the last block of an n tile
// to finish (a counter per tile) sums the slices in slice order and writes y, so the result does
// not depend on which block finished last (deterministic), and resets the counter (graph-safe).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace cisa::cuda::detail {

constexpr int kSkinnyMaxRows = 16;
constexpr int kSkinnyTileN = 64;  // outputs per block: 4 warps of 16
constexpr int kSkinnyKStep = 32;  // k per load of a lane (two MMAs)

// Whether skinny_gemm takes the shape: 1 ≤ rows ≤ 16, n % 64 == 0, k % 32 == 0, 16-byte aligned
// W and x, and at most max_tiles n tiles (the counters).
bool skinny_gemm_applies(int64_t n, int64_t k, int64_t rows, const void* w, const void* x,
                         int64_t max_tiles);

// K slices for a shape on `sms` SMs (about 4 blocks per SM; 1 when the n tiles alone fill it).
int skinny_gemm_default_splits(int64_t n, int64_t k, int sms);

// K splits whose blocks (n tiles x splits) spread evenly over `sms` SMs: the (at most) two
// split counts in [1, k / 256] whose block count is closest to a multiple of `sms` (the share of
// SMs that run as many blocks as the busiest one), with 2 to 16 blocks per SM, best first; ties go
// to fewer splits. Every block streams the same bytes, so an SM that runs one block more than
// another is the step's tail: 560 blocks of the 3584 x 18944 product on 132 SMs leave 100 SMs
// idle while 32 run a fifth block. Candidates for the per-shape timing (gemm.cpp).
std::vector<int> skinny_gemm_balanced_splits(int64_t n, int64_t k, int sms);

// Workspace floats the partials of `splits` slices need (0 for one slice).
int64_t skinny_gemm_workspace_floats(int64_t n, int64_t rows, int splits);

// y[r·ldy + o] = Σ_c w[o·k + c] · x[r·k + c] (bf16 inputs, f32 accumulation) for r < rows,
// o < n. workspace: ≥ skinny_gemm_workspace_floats floats; counters: n / 64 ints, zero on entry
// (left zero). splits is clamped to [1, k / 32]. unroll: k steps of 32 whose loads a lane has in
// flight at once, 4 or 8 (more bytes in flight, more registers).
cudaError_t launch_skinny_gemm(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x,
                               int64_t rows, float* y, int64_t ldy, int splits, float* workspace,
                               int* counters, cudaStream_t stream, int unroll = 4);

// The streaming variant for 1-4 rows (decode steps of a few sequences): 8 warps a block, each warp
// owning rows_per_warp (4 or 8) rows of W and reading each as 512 contiguous bytes per load
// instruction, f32 FMAs instead of tensor cores (at ≤ 4 rows the arithmetic is a few percent of
// the SMs'), one butterfly sum per output. A row of W is read in runs of per · 512 bytes instead of
// skinny_gemm_kernel's 64-byte pieces of 16 rows at once. Split K and its deterministic sum as
// above (the same workspace and counters; n / (8 · rows_per_warp) tiles).
constexpr int kStreamMaxRows = 4;
constexpr int kStreamThreads = 256;
constexpr int kStreamKStep = 256;  // k per load instruction of a warp (32 lanes x 8)

// Outputs per block: 8 · rows_per_warp.
int skinny_stream_tile(int rows_per_warp);

// Whether the streaming kernel takes the shape: rows_per_warp 4 or 8, 1 ≤ rows ≤ 4, n a
// multiple of the tile, k % 256 == 0, 16-byte aligned W and x, at most max_tiles tiles.
bool skinny_stream_applies(int64_t n, int64_t k, int64_t rows, const void* w, const void* x,
                           int64_t max_tiles, int rows_per_warp);

// Candidate K splits for the per-shape timing: the two that spread 1-2 blocks per SM most evenly,
// the one that spreads 3-4 most evenly, and about two blocks per SM.
std::vector<int> skinny_stream_splits(int64_t n, int64_t k, int sms, int rows_per_warp);

// launch_skinny_gemm's contract (workspace: skinny_gemm_workspace_floats(n, rows, splits)) for
// the streaming kernel; splits is clamped to [1, k / 256].
cudaError_t launch_skinny_stream(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x,
                                 int64_t rows, float* y, int64_t ldy, int splits, float* workspace,
                                 int* counters, cudaStream_t stream, int rows_per_warp);

// Reads bytes / 16 words of a zeroed, 16-byte aligned device buffer and writes nothing (sink: 4
// device bytes it would write only for other contents), with 4 blocks per SM of `sms`: evicts
// what L2 held with clean lines, where a memset would leave dirty ones whose write-backs slow
// whatever runs next. The GEMM timing's L2 flush (gemm.cpp).
cudaError_t launch_read_sweep(const void* buf, size_t bytes, void* sink, int sms,
                              cudaStream_t stream);

}  // namespace cisa::cuda::detail
