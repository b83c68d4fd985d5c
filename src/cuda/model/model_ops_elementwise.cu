// The flat element-wise kernels of the transformer layers (model_ops.cuh): gated activations,
// residual add, f16 rounding and the f32 ↔ bf16 conversions. Each is a grid-stride loop over a
// V-wide body (n / V groups; V = 4 when every pointer allows it) and then a scalar tail of
// n mod V values. The activation's out may alias gate or up: no __restrict__ there; each element
// is read before the same thread writes it.
#include <cuda_fp16.h>

#include <algorithm>

#include "model_ops.cuh"
#include "model_ops_vec.cuh"
#include "pdl.cuh"

namespace cisa::cuda::detail {
namespace {

using namespace vec;

// GELU(tanh) = 0.5 x (1 + tanh(u)) = x · σ(2u), u = √(2/π)(x + 0.044715 x³); the σ form has no
// cancellation for negative x. expf, not __expf: the fast one loses ~|2u|·2^-24 relatively.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u2 = 2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.0f + expf(-u2));
}
__device__ __forceinline__ float silu(float x) {
  return x / (1.0f + expf(-x));
}

template <bool Gelu, int V>
__global__ void gated_kernel(const float* gate, const float* up, float* out, uint16_t* outb,
                             int64_t n) {
  dev::dependent_start();
  const int64_t nv = n / V;
  for (int64_t t = first_index(); t < nv + (n - nv * V); t += grid_stride()) {
    if (t < nv) {
      const Vec<V> g = load_f32<V>(gate + t * V), u = load_f32<V>(up + t * V);
      Vec<V> o;
      for (int j = 0; j < V; ++j) o.v[j] = (Gelu ? gelu_tanh(g.v[j]) : silu(g.v[j])) * u.v[j];
      store_f32<V>(out + t * V, o);
      if (outb) store_bf16<V>(outb + t * V, o);
    } else {
      const int64_t i = nv * V + (t - nv);
      const float o = (Gelu ? gelu_tanh(gate[i]) : silu(gate[i])) * up[i];
      out[i] = o;
      if (outb) outb[i] = dev::f32_to_bf16(o);
    }
  }
}

template <bool Gelu, int V>
__global__ void gated_stacked_kernel(const float* __restrict__ y, int64_t rows, int64_t n,
                                     float* __restrict__ out, uint16_t* __restrict__ outb) {
  dev::dependent_start();
  const int64_t per_row = n / V;
  for (int64_t t = first_index(); t < rows * per_row; t += grid_stride()) {
    const int64_t r = t / per_row, c = (t - r * per_row) * V;
    const Vec<V> g = load_f32<V>(y + r * 2 * n + c), u = load_f32<V>(y + r * 2 * n + n + c);
    Vec<V> o;
    for (int j = 0; j < V; ++j) o.v[j] = (Gelu ? gelu_tanh(g.v[j]) : silu(g.v[j])) * u.v[j];
    store_f32<V>(out + r * n + c, o);
    if (outb) store_bf16<V>(outb + r * n + c, o);
  }
}

template <int V>
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  dev::dependent_start();
  const int64_t nv = n / V;
  for (int64_t t = first_index(); t < nv + (n - nv * V); t += grid_stride()) {
    if (t < nv) {
      Vec<V> a = load_f32<V>(y + t * V);
      const Vec<V> b = load_f32<V>(x + t * V);
      for (int j = 0; j < V; ++j) a.v[j] += b.v[j];
      store_f32<V>(y + t * V, a);
    } else {
      y[nv * V + (t - nv)] += x[nv * V + (t - nv)];
    }
  }
}

template <int V>
__global__ void round_f16_kernel(float* x, int64_t n) {
  dev::dependent_start();
  const int64_t nv = n / V;
  for (int64_t t = first_index(); t < nv + (n - nv * V); t += grid_stride()) {
    float* p = t < nv ? x + t * V : x + nv * V + (t - nv);
    if (t < nv) {
      Vec<V> a = load_f32<V>(p);
      for (int j = 0; j < V; ++j) a.v[j] = __half2float(__float2half_rn(a.v[j]));
      store_f32<V>(p, a);
    } else {
      *p = __half2float(__float2half_rn(*p));
    }
  }
}

template <int V>
__global__ void f32_to_bf16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y,
                                   int64_t n) {
  dev::dependent_start();
  const int64_t nv = n / V;
  for (int64_t t = first_index(); t < nv + (n - nv * V); t += grid_stride()) {
    if (t < nv) {
      store_bf16<V>(y + t * V, load_f32<V>(x + t * V));
    } else {
      const int64_t i = nv * V + (t - nv);
      y[i] = dev::f32_to_bf16(x[i]);
    }
  }
}

template <int V>
__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ x, float* __restrict__ y,
                                   int64_t n) {
  dev::dependent_start();
  const int64_t nv = n / V;
  for (int64_t t = first_index(); t < nv + (n - nv * V); t += grid_stride()) {
    if (t < nv) {
      store_f32<V>(y + t * V, load_bf16<V>(x + t * V));
    } else {
      const int64_t i = nv * V + (t - nv);
      y[i] = dev::bf16_to_f32(x[i]);
    }
  }
}

// One thread per V values of one part's row: blockIdx.y is the part, the grid-stride loop runs
// over rows × cols / V of it.
template <int V>
__global__ void split_columns_kernel(const float* __restrict__ y, int64_t rows, int64_t width,
                                     SplitParts parts) {
  dev::dependent_start();
  const int p = static_cast<int>(blockIdx.y);
  const int64_t cols = parts.cols[p], per_row = cols / V;
  const float* src = y + parts.offset[p];
  float* dst = parts.dst[p];
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows * per_row;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / per_row, c = (t - r * per_row) * V;
    store_f32<V>(dst + r * cols + c, load_f32<V>(src + r * width + c));
  }
}

}  // namespace

cudaError_t launch_split_columns(const float* y, int64_t rows, int64_t width,
                                 const SplitParts& parts, cudaStream_t stream) {
  if (rows < 0 || width < 0 || parts.count < 0 || parts.count > kMaxSplitParts)
    return cudaErrorInvalidValue;
  if (rows == 0 || parts.count == 0) return cudaSuccess;
  if (!y) return cudaErrorInvalidValue;
  bool vec = aligned(y, 16) && width % 4 == 0;
  int64_t most = 0;
  for (int i = 0; i < parts.count; ++i) {
    if (!parts.dst[i] || parts.cols[i] < 1 || parts.offset[i] < 0 ||
        parts.offset[i] + parts.cols[i] > width)
      return cudaErrorInvalidValue;
    vec = vec && aligned(parts.dst[i], 16) && parts.cols[i] % 4 == 0 && parts.offset[i] % 4 == 0;
    most = std::max(most, rows * parts.cols[i]);
  }
  const dim3 grid(blocks_for(vec ? most / 4 : most), static_cast<unsigned>(parts.count));
  if (vec)
    launch_dependent(split_columns_kernel<4>, grid, kThreads, 0, stream, y, rows, width, parts);
  else
    launch_dependent(split_columns_kernel<1>, grid, kThreads, 0, stream, y, rows, width, parts);
  return cudaGetLastError();
}

cudaError_t launch_gated_activation(bool gelu, const float* gate, const float* up, float* out,
                                    int64_t rows, int64_t n, cudaStream_t stream, uint16_t* outb) {
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  const int64_t total = rows * n;
  if (total == 0) return cudaSuccess;
  if (!gate || !up || !out) return cudaErrorInvalidValue;
  const bool vec =
      aligned(gate, 16) && aligned(up, 16) && aligned(out, 16) && (!outb || aligned(outb, 8));
  const unsigned grid = blocks_for(vec ? total / 4 + 3 : total);
  if (gelu) {
    if (vec)
      launch_dependent(gated_kernel<true, 4>, grid, kThreads, 0, stream, gate, up, out, outb,
                       total);
    else
      launch_dependent(gated_kernel<true, 1>, grid, kThreads, 0, stream, gate, up, out, outb,
                       total);
  } else {
    if (vec)
      launch_dependent(gated_kernel<false, 4>, grid, kThreads, 0, stream, gate, up, out, outb,
                       total);
    else
      launch_dependent(gated_kernel<false, 1>, grid, kThreads, 0, stream, gate, up, out, outb,
                       total);
  }
  return cudaGetLastError();
}

cudaError_t launch_gated_stacked(bool gelu, const float* y, int64_t rows, int64_t n, float* out,
                                 uint16_t* outb, cudaStream_t stream) {
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  if (!y || !out) return cudaErrorInvalidValue;
  const bool vec = n % 4 == 0 && aligned(y, 16) && aligned(out, 16) && (!outb || aligned(outb, 8));
  const unsigned grid = blocks_for(vec ? rows * n / 4 : rows * n);
  if (gelu) {
    if (vec)
      launch_dependent(gated_stacked_kernel<true, 4>, grid, kThreads, 0, stream, y, rows, n, out,
                       outb);
    else
      launch_dependent(gated_stacked_kernel<true, 1>, grid, kThreads, 0, stream, y, rows, n, out,
                       outb);
  } else {
    if (vec)
      launch_dependent(gated_stacked_kernel<false, 4>, grid, kThreads, 0, stream, y, rows, n, out,
                       outb);
    else
      launch_dependent(gated_stacked_kernel<false, 1>, grid, kThreads, 0, stream, y, rows, n, out,
                       outb);
  }
  return cudaGetLastError();
}

cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!y || !x) return cudaErrorInvalidValue;
  if (aligned(y, 16) && aligned(x, 16))
    launch_dependent(add_kernel<4>, blocks_for(n / 4 + 3), kThreads, 0, stream, y, x, n);
  else
    launch_dependent(add_kernel<1>, blocks_for(n), kThreads, 0, stream, y, x, n);
  return cudaGetLastError();
}

cudaError_t launch_round_f16(float* x, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x) return cudaErrorInvalidValue;
  if (aligned(x, 16))
    launch_dependent(round_f16_kernel<4>, blocks_for(n / 4 + 3), kThreads, 0, stream, x, n);
  else
    launch_dependent(round_f16_kernel<1>, blocks_for(n), kThreads, 0, stream, x, n);
  return cudaGetLastError();
}

cudaError_t launch_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x || !y) return cudaErrorInvalidValue;
  if (aligned(x, 16) && aligned(y, 8))
    launch_dependent(f32_to_bf16_kernel<4>, blocks_for(n / 4 + 3), kThreads, 0, stream, x, y, n);
  else
    launch_dependent(f32_to_bf16_kernel<1>, blocks_for(n), kThreads, 0, stream, x, y, n);
  return cudaGetLastError();
}

cudaError_t launch_bf16_to_f32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x || !y) return cudaErrorInvalidValue;
  if (aligned(x, 8) && aligned(y, 16))
    launch_dependent(bf16_to_f32_kernel<4>, blocks_for(n / 4 + 3), kThreads, 0, stream, x, y, n);
  else
    launch_dependent(bf16_to_f32_kernel<1>, blocks_for(n), kThreads, 0, stream, x, y, n);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
