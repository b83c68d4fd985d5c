// Few-row products on bf16 tensor cores with split K (skinny_gemm.cuh).
#include <algorithm>
#include <limits>

#include "pdl.cuh"
#include "skinny_gemm.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kWarps = kSkinnyTileN / 16;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ uint4 load_stream(const uint4* p) {  // read once: no L1 allocation
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc + Σ of the 8 products of two rows of 8 bf16 (a bf16 is the high half of an f32).
__device__ __forceinline__ float dot8(uint4 a, uint4 b, float acc) {
  const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(av[i] << 16), __uint_as_float(bv[i] << 16), acc);
    acc = fmaf(__uint_as_float(av[i] & 0xffff0000u), __uint_as_float(bv[i] & 0xffff0000u), acc);
  }
  return acc;
}

// After a block of a split product has written its partials for outputs
// [tile·tile_n, tile·tile_n + tile_n): the last block of the tile to get here (a counter per
// tile) sums the slices in slice order, the same order whoever is last, writes y and resets the
// counter.
__device__ void finish_split_k(const float* part, int* counters, int tile, int tile_n, int n,
                               int rows, int splits, float* y, int ldy) {
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < rows * tile_n; i += blockDim.x) {
    const int r = i / tile_n, o = tile * tile_n + i % tile_n;
    float sum = 0.0f;
    for (int sl = 0; sl < splits; ++sl)
      sum += __ldcg(part + (static_cast<int64_t>(sl) * rows + r) * n + o);
    y[static_cast<int64_t>(r) * ldy + o] = sum;
  }
  if (threadIdx.x == 0) counters[tile] = 0;
}

// NT n8 tiles of x rows (1: rows ≤ 8, 2: rows ≤ 16); kUnroll k steps whose loads are in flight
// together (2·kUnroll × 16 B of W per lane). Block (tile, slice): outputs [64·tile, 64·tile + 64),
// k steps [slice·per, min(k/32, (slice+1)·per)).
template <int NT, int kUnroll>
__global__ void __launch_bounds__(kThreads)
    skinny_gemm_kernel(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x, int n, int k,
                       int rows, int splits, int per, float* __restrict__ y, int ldy,
                       float* __restrict__ part, int* __restrict__ counters) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int tile = blockIdx.x, slice = blockIdx.y;
  const int o0 = tile * kSkinnyTileN + warp * 16;
  const int steps = k / kSkinnyKStep;
  const int s0 = slice * per, s1 = min(steps, s0 + per);
  const int k4 = k / 8;  // uint4 per row
  const uint4* wa = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(o0 + g) * k4 + t;
  const uint4* wb = wa + static_cast<int64_t>(8) * k4;
  const uint4* xr[NT];
  bool has[NT];
  for (int j = 0; j < NT; ++j) {
    has[j] = g + 8 * j < rows;
    xr[j] =
        reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(has[j] ? g + 8 * j : 0) * k4 + t;
  }
  float c[NT][4] = {};
  uint4 lo[kUnroll], hi[kUnroll];  // W rows g and g + 8
  const auto load_w = [&](int s) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s + u < s1) {
        lo[u] = load_stream(wa + (s + u) * 4);
        hi[u] = load_stream(wb + (s + u) * 4);
      }
    }
  };
  // The weights are written by no kernel: the first loads go out before the wait for the kernel
  // that writes x (pdl.cuh), so they overlap its tail.
  load_w(s0);
  dev::dependent_start();
  for (int s = s0; s < s1; s += kUnroll) {
    if (s != s0) load_w(s);
    uint4 xb[NT][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s + u < s1) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
          xb[j][u] = has[j] ? __ldg(xr[j] + (s + u) * 4) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s + u < s1) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          mma_bf16(c[j], lo[u].x, hi[u].x, lo[u].y, hi[u].y, xb[j][u].x, xb[j][u].y);
          mma_bf16(c[j], lo[u].z, hi[u].z, lo[u].w, hi[u].w, xb[j][u].z, xb[j][u].w);
        }
      }
    }
  }
  // c[j]: outputs o0 + g (c0, c1) and o0 + g + 8 (c2, c3), x rows 8j + 2t and 8j + 2t + 1.
  if (splits == 1) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 8 * j + 2 * t + (e & 1), o = o0 + g + (e >> 1) * 8;
        if (r < rows) y[static_cast<int64_t>(r) * ldy + o] = c[j][e];
      }
    return;
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 8 * j + 2 * t + (e & 1), o = o0 + g + (e >> 1) * 8;
      if (r < rows) part[(static_cast<int64_t>(slice) * rows + r) * n + o] = c[j][e];
    }
  finish_split_k(part, counters, tile, kSkinnyTileN, n, rows, splits, y, ldy);
}

// The streaming kernel (skinny_gemm.cuh): warp w of block (tile, slice) owns W rows
// o0 = 8R·tile + R·w … o0 + R − 1 and reads each of them as 512 contiguous bytes per load
// instruction (lane l: k = 256s + 8l … 8l + 7); U k steps of each row in flight; f32 FMAs, then
// one butterfly sum per output across the warp's lanes (a fixed order).
template <int R, int U, int ROWS>
__global__ void __launch_bounds__(kStreamThreads)
    skinny_stream_kernel(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x, int n,
                         int k, int rows, int splits, int per, float* __restrict__ y, int ldy,
                         float* __restrict__ part, int* __restrict__ counters) {
  constexpr int kTile = (kStreamThreads / 32) * R;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile = blockIdx.x, slice = blockIdx.y;
  const int o0 = tile * kTile + warp * R;
  const int steps = k / kStreamKStep;
  const int s0 = slice * per, s1 = min(steps, s0 + per);
  const int64_t k16 = k / 8;  // uint4 per row
  const uint4* wr = reinterpret_cast<const uint4*>(w) + o0 * k16 + lane;
  const uint4* xr = reinterpret_cast<const uint4*>(x) + lane;
  float acc[R][ROWS] = {};
  uint4 wb[U][R];
  const auto load_w = [&](int s) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s + u < s1)
#pragma unroll
        for (int r = 0; r < R; ++r) wb[u][r] = load_stream(wr + r * k16 + (s + u) * 32);
  };
  load_w(s0);  // weights: before the wait (as skinny_gemm_kernel)
  dev::dependent_start();
  for (int s = s0; s < s1; s += U) {
    if (s != s0) load_w(s);
    uint4 xb[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int m = 0; m < ROWS; ++m)
        xb[u][m] =
            s + u < s1 && m < rows ? __ldg(xr + m * k16 + (s + u) * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s + u < s1)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < ROWS; ++m) acc[r][m] = dot8(wb[u][r], xb[u][m], acc[r][m]);
  }
  // Butterfly sums (every lane then holds every sum); lane r·ROWS + m writes output o0 + r of
  // row m.
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < ROWS; ++m)
#pragma unroll
      for (int off = 16; off > 0; off /= 2)
        acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < ROWS; ++m)
      if (lane == r * ROWS + m && m < rows) {
        if (splits == 1)
          y[static_cast<int64_t>(m) * ldy + o0 + r] = acc[r][m];
        else
          part[(static_cast<int64_t>(slice) * rows + m) * n + o0 + r] = acc[r][m];
      }
  if (splits == 1) return;
  finish_split_k(part, counters, tile, kTile, n, rows, splits, y, ldy);
}

// Reads `words` 16-byte words (grid-stride) and writes `sink` only if they XOR to a value the
// caller's zeroed buffer cannot hold: the reads cannot be optimised away, and nothing is written.
__global__ void read_sweep_kernel(const uint4* __restrict__ buf, int64_t words,
                                  uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = load_stream(buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0xdeadbeefu) *sink = acc;
}

}  // namespace

bool skinny_gemm_applies(int64_t n, int64_t k, int64_t rows, const void* w, const void* x,
                         int64_t max_tiles) {
  return rows >= 1 && rows <= kSkinnyMaxRows && n >= kSkinnyTileN && n % kSkinnyTileN == 0 &&
         k >= kSkinnyKStep && k % kSkinnyKStep == 0 && n / kSkinnyTileN <= max_tiles &&
         n <= (int64_t{1} << 30) && k <= (int64_t{1} << 30) &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

int skinny_gemm_default_splits(int64_t n, int64_t k, int sms) {
  const int64_t tiles = n / kSkinnyTileN, target = int64_t{4} * sms;
  if (tiles >= target / 2) return 1;
  const int64_t steps = k / kSkinnyKStep;
  // At least 8 k steps (256 k) per slice: fewer and the partials cost more than they spread.
  return static_cast<int>(
      std::clamp<int64_t>((target + tiles - 1) / tiles, 1, std::max<int64_t>(1, steps / 8)));
}

namespace {

// The (at most) two split counts in [1, max_splits] whose tiles · s blocks come closest to a
// multiple of `sms`, with min_per_sm to max_per_sm blocks on the busiest SM, best first.
std::vector<int> balanced_splits(int64_t tiles, int64_t max_splits, int sms, int64_t min_per_sm,
                                 int64_t max_per_sm) {
  std::vector<int> out;
  if (tiles < 1 || sms < 1) return out;
  // Balance of s splits: blocks / (sms · ⌈blocks / sms⌉), as a fraction blocks : sms · waves.
  struct Option {
    int64_t splits, blocks, slots;
  };
  std::vector<Option> opts;
  for (int64_t s = 1; s <= std::min<int64_t>(max_splits, 1024); ++s) {
    const int64_t blocks = tiles * s, per_sm = (blocks + sms - 1) / sms;
    if (per_sm < min_per_sm || per_sm > max_per_sm) continue;
    opts.push_back({s, blocks, per_sm * sms});
  }
  std::stable_sort(opts.begin(), opts.end(), [](const Option& a, const Option& b) {
    return a.blocks * b.slots > b.blocks * a.slots;  // a's balance > b's, exactly
  });
  for (size_t i = 0; i < opts.size() && out.size() < 2; ++i)
    out.push_back(static_cast<int>(opts[i].splits));
  return out;
}

using FewRowKernel = void (*)(const uint16_t*, const uint16_t*, int, int, int, int, int, float*,
                              int, float*, int*);

// Launches a few-row kernel (arguments w, x, n, k, rows, splits, per, y, ldy, part, counters) on
// n / tile tiles and `splits` K slices of k_step-wide steps, clamped to [1, k / k_step] and cut
// so that no slice is empty. The shape was checked by the caller.
cudaError_t launch_few_row(FewRowKernel kernel, int threads, int64_t tile, int64_t k_step,
                           const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t rows,
                           float* y, int64_t ldy, int splits, float* workspace, int* counters,
                           cudaStream_t stream) {
  const int steps = static_cast<int>(k / k_step);
  splits = std::clamp(splits, 1, steps);
  const int per = (steps + splits - 1) / splits;
  splits = (steps + per - 1) / per;  // no empty slice
  if (splits > 1 && (!workspace || !counters)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n / tile), static_cast<unsigned>(splits));
  return launch_dependent(kernel, grid, threads, 0, stream, w, x, static_cast<int>(n),
                          static_cast<int>(k), static_cast<int>(rows), splits, per, y,
                          static_cast<int>(ldy), workspace, counters);
}

}  // namespace

std::vector<int> skinny_gemm_balanced_splits(int64_t n, int64_t k, int sms) {
  return balanced_splits(n / kSkinnyTileN, std::max<int64_t>(1, k / kSkinnyKStep / 8), sms, 2, 16);
}

int64_t skinny_gemm_workspace_floats(int64_t n, int64_t rows, int splits) {
  return splits > 1 ? int64_t{splits} * rows * n : 0;
}

cudaError_t launch_skinny_gemm(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x,
                               int64_t rows, float* y, int64_t ldy, int splits, float* workspace,
                               int* counters, cudaStream_t stream, int unroll) {
  if ((unroll != 4 && unroll != 8) || rows < 1 || rows > kSkinnyMaxRows || n % kSkinnyTileN != 0 ||
      k % kSkinnyKStep != 0 || ldy < n || ldy > std::numeric_limits<int32_t>::max() || !w || !x ||
      !y)
    return cudaErrorInvalidValue;
  const FewRowKernel kernel =
      unroll == 8 ? (rows <= 8 ? skinny_gemm_kernel<1, 8> : skinny_gemm_kernel<2, 8>)
                  : (rows <= 8 ? skinny_gemm_kernel<1, 4> : skinny_gemm_kernel<2, 4>);
  return launch_few_row(kernel, kThreads, kSkinnyTileN, kSkinnyKStep, w, n, k, x, rows, y, ldy,
                        splits, workspace, counters, stream);
}

int skinny_stream_tile(int rows_per_warp) {
  return (kStreamThreads / 32) * rows_per_warp;
}

bool skinny_stream_applies(int64_t n, int64_t k, int64_t rows, const void* w, const void* x,
                           int64_t max_tiles, int rows_per_warp) {
  const int tile = skinny_stream_tile(rows_per_warp);
  return (rows_per_warp == 4 || rows_per_warp == 8) && rows >= 1 && rows <= kStreamMaxRows &&
         n >= tile && n % tile == 0 && k >= kStreamKStep && k % kStreamKStep == 0 &&
         n / tile <= max_tiles && n <= (int64_t{1} << 30) && k <= (int64_t{1} << 30) &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

std::vector<int> skinny_stream_splits(int64_t n, int64_t k, int sms, int rows_per_warp) {
  const int64_t tiles = n / skinny_stream_tile(rows_per_warp), steps = k / kStreamKStep;
  // Two blocks of 256 threads fit an SM at up to 128 registers (ROWS ≤ 2), one above: blocks past
  // that wait for a second wave, which the timing weighs against the balance it buys.
  std::vector<int> out = balanced_splits(tiles, steps, sms, 1, 2);
  const auto add = [&](int64_t s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(static_cast<int>(s));
  };
  if (const std::vector<int> more = balanced_splits(tiles, steps, sms, 3, 4); !more.empty())
    add(more.front());
  add(std::clamp<int64_t>((2 * int64_t{sms} + tiles - 1) / tiles, 1, steps));  // ~2 per SM
  return out;
}

cudaError_t launch_skinny_stream(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x,
                                 int64_t rows, float* y, int64_t ldy, int splits, float* workspace,
                                 int* counters, cudaStream_t stream, int rows_per_warp) {
  const int tile = skinny_stream_tile(rows_per_warp);
  if ((rows_per_warp != 4 && rows_per_warp != 8) || rows < 1 || rows > kStreamMaxRows ||
      n % tile != 0 || k % kStreamKStep != 0 || ldy < n ||
      ldy > std::numeric_limits<int32_t>::max() || !w || !x || !y)
    return cudaErrorInvalidValue;
  // (rows per warp, k steps in flight): (8, 2) or (4, 4), 16 loads of 16 bytes a lane either way.
  static constexpr FewRowKernel kernels[2][3] = {
      {skinny_stream_kernel<4, 4, 1>, skinny_stream_kernel<4, 4, 2>, skinny_stream_kernel<4, 4, 4>},
      {skinny_stream_kernel<8, 2, 1>, skinny_stream_kernel<8, 2, 2>,
       skinny_stream_kernel<8, 2, 4>}};
  const FewRowKernel kernel = kernels[rows_per_warp == 8][rows == 1 ? 0 : rows == 2 ? 1 : 2];
  return launch_few_row(kernel, kStreamThreads, tile, kStreamKStep, w, n, k, x, rows, y, ldy,
                        splits, workspace, counters, stream);
}

cudaError_t launch_read_sweep(const void* buf, size_t bytes, void* sink, int sms,
                              cudaStream_t stream) {
  if (!buf || !sink || sms < 1 || reinterpret_cast<uintptr_t>(buf) % 16 != 0)
    return cudaErrorInvalidValue;
  read_sweep_kernel<<<4 * sms, 512, 0, stream>>>(static_cast<const uint4*>(buf),
                                                 static_cast<int64_t>(bytes / 16),
                                                 static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
