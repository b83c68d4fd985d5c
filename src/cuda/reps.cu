// Representative update kernel: one block per (page, KV head), one thread per channel.
#include "common.cuh"
#include "pdl.cuh"
#include "reps.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

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
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    if (!quest) {
      double acc = 0.0;  // exact for 16 bf16 values; matches the CPU's double accumulation
      for (int s = 0; s < B; ++s) acc += dev::bf16_to_f32(kp[s * head_dim + i]);
      out[i] = dev::f32_to_bf16(static_cast<float>(acc / B));
    } else {
      float lo = dev::bf16_to_f32(kp[i]), hi = lo;
      for (int s = 1; s < B; ++s) {
        const float x = dev::bf16_to_f32(kp[s * head_dim + i]);
        lo = x < lo ? x : lo;  // std::min(lo, x) keeps lo when x is NaN… and so does this
        hi = hi < x ? x : hi;  // std::max(hi, x): hi < x ? x : hi
      }
      out[i] = dev::f32_to_bf16(lo);
      out[head_dim + i] = dev::f32_to_bf16(hi);
    }
  }
}

}  // namespace

cudaError_t launch_update_reps(const uint16_t* k, uint16_t* reps, const int32_t* pages, int64_t n,
                               int num_kv_heads, int head_dim, bool quest, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  for (int64_t done = 0; done < n; done += 65535 * 1024) {
    const int64_t m = n - done < 65535 * 1024 ? n - done : 65535 * 1024;
    launch_dependent(update_reps_kernel, dim3(static_cast<unsigned>(m), num_kv_heads),
                     tiles::kRepThreads, 0, stream, k, reps, pages + done, num_kv_heads, head_dim,
                     quest);
  }
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
