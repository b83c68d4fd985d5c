// Representative update kernel: one block per (page, KV head), one thread per channel.
#include "common.cuh"
#include "pdl.cuh"
#include "plan_types.h"
#include "reps.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr float kInt8Top = 127.0f;  // core/rep_quant.cpp's kInt8Max

// The smallest e ≥ kRepExpMin with m ≤ 127 · 2^e, for finite m > 0: core/rep_quant.cpp's
// scale_exponent, step for step (double log2, then the same corrections), and its floor.
__device__ int int8_scale_exponent(float m) {
  int e = static_cast<int>(ceil(log2(static_cast<double>(m) / kInt8Top)));
  while (ldexp(static_cast<double>(kInt8Top), e) < m) ++e;
  while (ldexp(static_cast<double>(kInt8Top), e - 1) >= m) --e;
  return max(e, kRepExpMin);
}

// The page's representative values in f32, as the CPU cache computes them before rounding:
// the mean of 16 bf16 keys summed in double (exact), or the per-channel min, then max.
__device__ __forceinline__ float rep_value(const uint16_t* kp, int head_dim, int i, bool quest) {
  constexpr int B = tiles::kPageSize;
  if (!quest) {
    double acc = 0.0;
    for (int s = 0; s < B; ++s) acc += dev::bf16_to_f32(kp[s * head_dim + i]);
    return static_cast<float>(acc / B);
  }
  const int c = i % head_dim;
  float lo = dev::bf16_to_f32(kp[c]), hi = lo;
  for (int s = 1; s < B; ++s) {
    const float x = dev::bf16_to_f32(kp[s * head_dim + c]);
    lo = x < lo ? x : lo;  // std::min(lo, x) keeps lo when x is NaN… and so does this
    hi = hi < x ? x : hi;  // std::max(hi, x): hi < x ? x : hi
  }
  return i < head_dim ? lo : hi;
}

__global__ void update_reps_kernel(const uint16_t* __restrict__ k, uint16_t* __restrict__ reps,
                                   const int32_t* __restrict__ pages, int num_kv_heads,
                                   int head_dim, bool quest) {
  dev::dependent_start();
  constexpr int B = tiles::kPageSize;
  const int64_t page = pages[blockIdx.x];
  const int g = blockIdx.y;
  const uint16_t* kp = k + ((page * num_kv_heads + g) * B) * head_dim;
  const int rw = quest ? 2 * head_dim : head_dim;
  uint16_t* out = reps + (page * num_kv_heads + g) * rw;
  for (int i = threadIdx.x; i < rw; i += blockDim.x)
    out[i] = dev::f32_to_bf16(rep_value(kp, head_dim, i, quest));
}

// int8 representatives (core/rep_quant.h): the f32 values above, one power-of-two scale 2^e for
// the whole representative (the smallest with max |x| ≤ 127 · 2^e), codes round(x / 2^e) ties to
// even, e stored as one byte. A representative with a non-finite value gets codes 0 and the byte
// kRepExpNaN, which the scoring kernels turn into the scale −inf: its scores are
// 0 · −inf = NaN (rep_read.cuh). One of zeros gets codes 0 and e = 0.
__global__ void update_reps_int8_kernel(const uint16_t* __restrict__ k, int8_t* __restrict__ codes,
                                        int8_t* __restrict__ exps,
                                        const int32_t* __restrict__ pages, int num_kv_heads,
                                        int head_dim, bool quest) {
  dev::dependent_start();
  constexpr int B = tiles::kPageSize;
  constexpr int kMaxRep = 512;  // quest at d = 256
  __shared__ float vals[kMaxRep];
  __shared__ float warp_max[tiles::kRepThreads / 32];
  __shared__ int warp_bad[tiles::kRepThreads / 32];
  __shared__ double step;  // 2^-e
  const int64_t page = pages[blockIdx.x];
  const int g = blockIdx.y;
  const int64_t rep = page * num_kv_heads + g;
  const uint16_t* kp = k + (rep * B) * head_dim;
  const int rw = quest ? 2 * head_dim : head_dim;
  float m = 0.0f;
  int bad = 0;
  for (int i = threadIdx.x; i < rw; i += blockDim.x) {
    const float x = rep_value(kp, head_dim, i, quest);
    vals[i] = x;
    bad |= !isfinite(x);
    m = fmaxf(m, fabsf(x));
  }
  for (int o = 16; o > 0; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    bad |= __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if (threadIdx.x % 32 == 0) {
    warp_max[threadIdx.x / 32] = m;
    warp_bad[threadIdx.x / 32] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      m = fmaxf(m, warp_max[w]);
      bad |= warp_bad[w];
    }
    const int e = bad || m == 0.0f ? 0 : int8_scale_exponent(m);
    exps[rep] = bad ? kRepExpNaN : static_cast<int8_t>(e);
    step = bad ? 0.0 : ldexp(1.0, -e);
  }
  __syncthreads();
  int8_t* out = codes + rep * rw;
  const bool nan_rep = step == 0.0;                   // codes 0: see above
  for (int i = threadIdx.x; i < rw; i += blockDim.x)  // x · 2^-e: exact in double, one rounding
    out[i] =
        nan_rep
            ? int8_t{0}
            : static_cast<int8_t>(rintf(static_cast<float>(static_cast<double>(vals[i]) * step)));
}

}  // namespace

cudaError_t launch_update_reps(const uint16_t* k, const RepArgsOut& reps, const int32_t* pages,
                               int64_t n, int num_kv_heads, int head_dim, bool quest,
                               cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (reps.int8 && !reps.exps) return cudaErrorInvalidValue;
  for (int64_t done = 0; done < n; done += 65535 * 1024) {
    const int64_t m = n - done < 65535 * 1024 ? n - done : 65535 * 1024;
    const dim3 grid(static_cast<unsigned>(m), num_kv_heads);
    if (reps.int8)
      launch_dependent(update_reps_int8_kernel, grid, tiles::kRepThreads, 0, stream, k,
                       reinterpret_cast<int8_t*>(reps.data), reps.exps, pages + done, num_kv_heads,
                       head_dim, quest);
    else
      launch_dependent(update_reps_kernel, grid, tiles::kRepThreads, 0, stream, k,
                       reinterpret_cast<uint16_t*>(reps.data), pages + done, num_kv_heads, head_dim,
                       quest);
  }
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
