// The per-row kernels of the transformer layers (model_ops.cuh): embedding lookup, RMSNorm, RoPE,
// head means, row gathers and the paged KV append; the flat element-wise ones are in
// model_ops_elementwise.cu.
//
// Every kernel is a grid-stride loop, so any size runs on any grid; a launcher validates its
// arguments (cudaErrorInvalidValue), launches nothing for empty work, and picks a vector width V
// (4 or 8 values per thread and access) when the sizes and every pointer allow 16-byte accesses,
// else V = 1. rms_norm's x and y may alias, so they carry no __restrict__: each element is read
// before it is written by the same thread.
#include <algorithm>

#include "model_ops.cuh"
#include "model_ops_vec.cuh"
#include "pdl.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

using namespace vec;

constexpr int kRowsPerWarpBlock = kThreads / 32;
constexpr int kWarpRowMax = 1024;  // rms_norm: rows up to this length take one warp each

// ---- embedding ----

template <int V>
__global__ void embed_kernel(const uint16_t* __restrict__ table, const int32_t* __restrict__ tokens,
                             int64_t rows, int64_t n, int64_t n_vocab, float scale,
                             float* __restrict__ x) {
  dev::dependent_start();
  const int64_t nv = n / V, total = rows * nv;
  for (int64_t t = first_index(); t < total; t += grid_stride()) {
    const int64_t r = t / nv, c = (t % nv) * V;
    const int64_t tok = tokens[r];
    Vec<V> e;
    if (n_vocab > 0 && (tok < 0 || tok >= n_vocab)) {
      for (int j = 0; j < V; ++j) e.v[j] = __int_as_float(0x7fc00000);  // a bad token reads as NaN
    } else {
      e = load_bf16<V>(table + tok * n + c);
      for (int j = 0; j < V; ++j) e.v[j] *= scale;
    }
    if constexpr (V == 8) {  // two 4-wide stores
      float4* o = reinterpret_cast<float4*>(x + r * n + c);
      o[0] = make_float4(e.v[0], e.v[1], e.v[2], e.v[3]);
      o[1] = make_float4(e.v[4], e.v[5], e.v[6], e.v[7]);
    } else {
      store_f32<V>(x + r * n + c, e);
    }
  }
}

// ---- RMSNorm ----

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Σ x² of one row by the threads lane, lane + step, … (each warp's lanes are consecutive). With
// `add` the row is first updated in place, x += add (the residual add), by the same threads that
// later scale it.
template <int V>
__device__ __forceinline__ float sum_squares(float* x, const float* add, int n, int lane,
                                             int step) {
  float ss = 0.0f;
  for (int i = lane * V; i < n; i += step * V) {
    Vec<V> a = load_f32<V>(x + i);
    if (add) {
      const Vec<V> b = load_f32<V>(add + i);
      for (int j = 0; j < V; ++j) a.v[j] += b.v[j];
      store_f32<V>(x + i, a);
    }
    for (int j = 0; j < V; ++j) ss = fmaf(a.v[j], a.v[j], ss);
  }
  return ss;
}

template <int V>
__device__ __forceinline__ void scale_row(const float* x, const float* w, float* y, uint16_t* yb,
                                          int n, float s, int lane, int step) {
  for (int i = lane * V; i < n; i += step * V) {
    Vec<V> a = load_f32<V>(x + i);
    if (w) {
      const Vec<V> g = load_f32<V>(w + i);
      for (int j = 0; j < V; ++j) a.v[j] = a.v[j] * s * g.v[j];  // (x · scale) · w, as the CPU
    } else {
      for (int j = 0; j < V; ++j) a.v[j] *= s;
    }
    store_f32<V>(y + i, a);
    if (yb) store_bf16<V>(yb + i, a);
  }
}

__device__ __forceinline__ float rms_scale(float ss, int n, float eps) {
  return 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
}

// One warp per row (n ≤ kWarpRowMax): the shuffles order the reads of x before the writes of y.
template <int V>
__global__ void rms_norm_warp_kernel(float* x, const float* add, const float* w, float* y,
                                     uint16_t* yb, int64_t rows, int n, float eps) {
  dev::dependent_start();
  const int lane = threadIdx.x % 32;
  for (int64_t r = int64_t(blockIdx.x) * kRowsPerWarpBlock + threadIdx.x / 32; r < rows;
       r += int64_t(gridDim.x) * kRowsPerWarpBlock) {
    const float s = rms_scale(
        warp_sum(sum_squares<V>(x + r * n, add ? add + r * n : nullptr, n, lane, 32)), n, eps);
    scale_row<V>(x + r * n, w, y + r * n, yb ? yb + r * n : nullptr, n, s, lane, 32);
  }
}

// One block per row: the barrier of the block sum orders the reads of x before the writes of y.
template <int V>
__global__ void rms_norm_block_kernel(float* x, const float* add, const float* w, float* y,
                                      uint16_t* yb, int64_t rows, int n, float eps) {
  // The weights (written by no kernel) are fetched into L2 before the wait for x: their HBM
  // latency then overlaps the kernel before this one instead of following the row sum.
  if (w)
    for (int i = threadIdx.x * 32; i < n; i += kThreads * 32)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w + i));
  dev::dependent_start();
  __shared__ float partial[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float part =
        warp_sum(sum_squares<V>(x + r * n, add ? add + r * n : nullptr, n, threadIdx.x, kThreads));
    if (lane == 0) partial[warp] = part;
    __syncthreads();
    const float ss = warp_sum(lane < kThreads / 32 ? partial[lane] : 0.0f);
    __syncthreads();  // partial is free for the next row
    scale_row<V>(x + r * n, w, y + r * n, yb ? yb + r * n : nullptr, n, rms_scale(ss, n, eps),
                 threadIdx.x, kThreads);
  }
}

// ---- RoPE ----

// One thread per rotated pair; blockIdx.y is the part (tensor). The products are __fmul_rn so
// that nothing fuses them: each output is fma(a, cos, −(b sin)) or fma(a, sin, b cos), bit for
// bit ops::rope_apply.
__global__ void rope_kernel(RopeParts parts, int64_t rows, int d, const float* __restrict__ cs,
                            const float* __restrict__ sn, bool neox) {
  dev::dependent_start();
  float* const x = parts.x[blockIdx.y];
  const int heads = parts.heads[blockIdx.y];
  const int half = d / 2;
  const int64_t total = rows * heads * half;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int64_t head = t / half, r = head / heads;
    float* v = x + head * d;
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float a = v[ia], b = v[ib], c = cs[r * half + i], s = sn[r * half + i];
    v[ia] = fmaf(a, c, -__fmul_rn(b, s));
    v[ib] = fmaf(a, s, __fmul_rn(b, c));
  }
}

// ---- per-row gathers ----

template <int V>
__global__ void mean_heads_kernel(const float* __restrict__ q, int64_t rows, int hq, int hkv, int d,
                                  float* __restrict__ out) {
  dev::dependent_start();
  const int gs = hq / hkv, dv = d / V;
  const float inv = 1.0f / static_cast<float>(gs);
  const int64_t total = rows * hkv * dv;
  for (int64_t t = first_index(); t < total; t += grid_stride()) {
    const int c = static_cast<int>(t % dv) * V;
    const int64_t rg = t / dv;  // r · hkv + g
    const int64_t r = rg / hkv, g = rg % hkv;
    const float* src = q + (r * hq + g * gs) * d + c;
    Vec<V> s = load_f32<V>(src);
    for (int h = 1; h < gs; ++h) {
      const Vec<V> a = load_f32<V>(src + int64_t(h) * d);
      for (int j = 0; j < V; ++j) s.v[j] += a.v[j];
    }
    for (int j = 0; j < V; ++j) s.v[j] *= inv;
    store_f32<V>(out + rg * d + c, s);
  }
}

template <int V>
__global__ void gather_rows_kernel(const float* __restrict__ x, const int64_t* __restrict__ rows,
                                   int64_t n, int64_t width, float* __restrict__ out) {
  dev::dependent_start();
  const int64_t wv = width / V, total = n * wv;
  for (int64_t t = first_index(); t < total; t += grid_stride()) {
    const int64_t i = t / wv, c = (t % wv) * V;
    store_f32<V>(out + i * width + c, load_f32<V>(x + rows[i] * width + c));
  }
}

template <int V>
__global__ void append_kv_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                 const int64_t* __restrict__ slots, int64_t rows, int num_kv_heads,
                                 int head_dim, uint16_t* __restrict__ k_pool,
                                 uint16_t* __restrict__ v_pool) {
  dev::dependent_start();
  constexpr int B = tiles::kPageSize;
  const int dv = head_dim / V;
  const int64_t total = rows * num_kv_heads * dv;
  for (int64_t t = first_index(); t < total; t += grid_stride()) {
    const int c = static_cast<int>(t % dv) * V;
    const int64_t rg = t / dv;  // r · num_kv_heads + g
    const int64_t r = rg / num_kv_heads, g = rg % num_kv_heads;
    const int64_t slot = slots[r];
    if (slot < 0) continue;  // a padding row: nothing stored
    const int64_t dst = ((slot / B * num_kv_heads + g) * B + slot % B) * head_dim + c;
    store_bf16<V>(k_pool + dst, load_f32<V>(k + rg * head_dim + c));
    store_bf16<V>(v_pool + dst, load_f32<V>(v + rg * head_dim + c));
  }
}

}  // namespace

// ---- launchers ----

cudaError_t launch_embed(const uint16_t* table, const int32_t* tokens, int64_t rows, int64_t n,
                         float scale, float* x, cudaStream_t stream, int64_t n_vocab) {
  if (rows < 0 || n < 0 || n_vocab < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  if (!table || !tokens || !x) return cudaErrorInvalidValue;
  const bool x16 = aligned(x, 16);
  if (n % 8 == 0 && x16 && aligned(table, 16))
    launch_dependent(embed_kernel<8>, blocks_for(rows * n / 8), kThreads, 0, stream, table, tokens,
                     rows, n, n_vocab, scale, x);
  else if (n % 4 == 0 && x16 && aligned(table, 8))
    launch_dependent(embed_kernel<4>, blocks_for(rows * n / 4), kThreads, 0, stream, table, tokens,
                     rows, n, n_vocab, scale, x);
  else
    launch_dependent(embed_kernel<1>, blocks_for(rows * n), kThreads, 0, stream, table, tokens,
                     rows, n, n_vocab, scale, x);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                            float eps, cudaStream_t stream, uint16_t* yb) {
  // Without `add` nothing writes x (the kernels take a mutable pointer for the fused form).
  return launch_add_rms_norm(const_cast<float*>(x), nullptr, w, y, rows, n, eps, stream, yb);
}

cudaError_t launch_add_rms_norm(float* x, const float* add, const float* w, float* y, int64_t rows,
                                int n, float eps, cudaStream_t stream, uint16_t* yb) {
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (n == 0 || !x || !y) return cudaErrorInvalidValue;
  const bool vec = n % 4 == 0 && aligned(x, 16) && aligned(y, 16) && (!w || aligned(w, 16)) &&
                   (!yb || aligned(yb, 8)) && (!add || aligned(add, 16));
  if (n <= kWarpRowMax) {
    const int64_t b = (rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
    const unsigned grid = static_cast<unsigned>(b > (1 << 20) ? (1 << 20) : b);
    if (vec)
      launch_dependent(rms_norm_warp_kernel<4>, grid, kThreads, 0, stream, x, add, w, y, yb, rows,
                       n, eps);
    else
      launch_dependent(rms_norm_warp_kernel<1>, grid, kThreads, 0, stream, x, add, w, y, yb, rows,
                       n, eps);
  } else {
    const unsigned grid = static_cast<unsigned>(rows > (1 << 20) ? (1 << 20) : rows);
    if (vec)
      launch_dependent(rms_norm_block_kernel<4>, grid, kThreads, 0, stream, x, add, w, y, yb, rows,
                       n, eps);
    else
      launch_dependent(rms_norm_block_kernel<1>, grid, kThreads, 0, stream, x, add, w, y, yb, rows,
                       n, eps);
  }
  return cudaGetLastError();
}

cudaError_t launch_rope(float* x, int64_t rows, int heads, int d, const float* cos,
                        const float* sin, bool neox, cudaStream_t stream) {
  RopeParts parts;
  parts.x[0] = x;
  parts.heads[0] = heads;
  parts.count = 1;
  return launch_rope_many(parts, rows, d, cos, sin, neox, stream);
}

cudaError_t launch_rope_many(const RopeParts& parts, int64_t rows, int d, const float* cos,
                             const float* sin, bool neox, cudaStream_t stream) {
  if (rows < 0 || d < 0 || d % 2 != 0 || parts.count < 0 || parts.count > kMaxRopeParts)
    return cudaErrorInvalidValue;
  int most = 0;
  for (int i = 0; i < parts.count; ++i) {
    if (parts.heads[i] < 0) return cudaErrorInvalidValue;
    if (parts.heads[i] > 0 && !parts.x[i]) return cudaErrorInvalidValue;
    most = std::max(most, parts.heads[i]);
  }
  if (rows == 0 || most == 0 || d == 0 || parts.count == 0) return cudaSuccess;
  if (!cos || !sin) return cudaErrorInvalidValue;
  const dim3 grid(blocks_for(rows * most * (d / 2)), static_cast<unsigned>(parts.count));
  launch_dependent(rope_kernel, grid, kThreads, 0, stream, parts, rows, d, cos, sin, neox);
  return cudaGetLastError();
}

cudaError_t launch_mean_heads(const float* q, int64_t rows, int hq, int hkv, int d, float* out,
                              cudaStream_t stream) {
  if (rows < 0 || hq < 0 || hkv < 0 || d < 0) return cudaErrorInvalidValue;
  if (rows == 0 || d == 0) return cudaSuccess;
  if (hkv == 0 || hq < hkv || hq % hkv != 0 || !q || !out) return cudaErrorInvalidValue;
  if (d % 4 == 0 && aligned(q, 16) && aligned(out, 16))
    launch_dependent(mean_heads_kernel<4>, blocks_for(rows * hkv * (d / 4)), kThreads, 0, stream, q,
                     rows, hq, hkv, d, out);
  else
    launch_dependent(mean_heads_kernel<1>, blocks_for(rows * hkv * d), kThreads, 0, stream, q, rows,
                     hq, hkv, d, out);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const float* x, const int64_t* rows, int64_t n, int64_t width,
                               float* out, cudaStream_t stream) {
  if (n < 0 || width < 0) return cudaErrorInvalidValue;
  if (n == 0 || width == 0) return cudaSuccess;
  if (!x || !rows || !out) return cudaErrorInvalidValue;
  if (width % 4 == 0 && aligned(x, 16) && aligned(out, 16))
    launch_dependent(gather_rows_kernel<4>, blocks_for(n * (width / 4)), kThreads, 0, stream, x,
                     rows, n, width, out);
  else
    launch_dependent(gather_rows_kernel<1>, blocks_for(n * width), kThreads, 0, stream, x, rows, n,
                     width, out);
  return cudaGetLastError();
}

namespace {

// ---- argmax ----

constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxLoads = 4;

// (v, i) beats (bv, bi): a NaN never beats anything, anything not NaN beats a NaN (the unset
// state is (NaN, n)), else the larger value, and on equal values the smaller index.
__device__ __forceinline__ bool argmax_better(float v, int64_t i, float bv, int64_t bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void argmax_rows_kernel(const float* __restrict__ x, int64_t rows, int64_t n,
                                   int32_t* __restrict__ out) {
  dev::dependent_start();
  __shared__ float s_v[kArgmaxThreads / 32];
  __shared__ int64_t s_i[kArgmaxThreads / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = x + r * n;
    float bv = __int_as_float(0x7fc00000);
    int64_t bi = n;
    const auto visit = [&](float v, int64_t i) {
      if (argmax_better(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    };
    // (value, index) is a total order under argmax_better, so the visiting order is free: 16-byte
    // loads, kArgmaxLoads of them in flight per thread (one load per trip was a DRAM latency per
    // trip: 70 µs for the 152,064 logits of a Qwen2.5 row), then the unaligned rest.
    const int64_t n4 = n % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0 ? n / 4 : 0;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t b = threadIdx.x; b < n4; b += kArgmaxLoads * blockDim.x) {
      float4 v[kArgmaxLoads];
#pragma unroll
      for (int u = 0; u < kArgmaxLoads; ++u)
        if (b + u * blockDim.x < n4) v[u] = row4[b + u * blockDim.x];
#pragma unroll
      for (int u = 0; u < kArgmaxLoads; ++u) {
        const int64_t i = 4 * (b + u * blockDim.x);
        if (i < n) {
          visit(v[u].x, i);
          visit(v[u].y, i + 1);
          visit(v[u].z, i + 2);
          visit(v[u].w, i + 3);
        }
      }
    }
    for (int64_t i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) visit(row[i], i);
    for (int off = 16; off > 0; off /= 2) {
      const float ov = __shfl_down_sync(0xffffffffu, bv, off);
      const int64_t oi = __shfl_down_sync(0xffffffffu, bi, off);
      if (argmax_better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    if (lane == 0) {
      s_v[warp] = bv;
      s_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
      const int warps = static_cast<int>(blockDim.x / 32);
      bv = lane < warps ? s_v[lane] : __int_as_float(0x7fc00000);
      bi = lane < warps ? s_i[lane] : n;
      for (int off = 16; off > 0; off /= 2) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, off);
        const int64_t oi = __shfl_down_sync(0xffffffffu, bi, off);
        if (argmax_better(ov, oi, bv, bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == 0) out[r] = n == 0 ? -1 : isnan(bv) ? 0 : static_cast<int32_t>(bi);
    }
    __syncthreads();  // the shared slots are reused by the next row
  }
}

}  // namespace

cudaError_t launch_argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out,
                               cudaStream_t stream) {
  if (rows < 0 || n < 0 || n > INT32_MAX) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (!out || (n > 0 && !x)) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(rows > 65535 ? 65535 : rows);
  launch_dependent(argmax_rows_kernel, grid, kArgmaxThreads, 0, stream, x, rows, n, out);
  return cudaGetLastError();
}

cudaError_t launch_append_kv(const float* k, const float* v, const int64_t* slots, int64_t rows,
                             int num_kv_heads, int head_dim, uint16_t* k_pool, uint16_t* v_pool,
                             cudaStream_t stream) {
  if (rows < 0 || num_kv_heads < 0 || head_dim < 0) return cudaErrorInvalidValue;
  if (rows == 0 || num_kv_heads == 0 || head_dim == 0) return cudaSuccess;
  if (!k || !v || !slots || !k_pool || !v_pool) return cudaErrorInvalidValue;
  const int64_t work = rows * num_kv_heads;
  if (head_dim % 4 == 0 && aligned(k, 16) && aligned(v, 16) && aligned(k_pool, 8) &&
      aligned(v_pool, 8))
    launch_dependent(append_kv_kernel<4>, blocks_for(work * (head_dim / 4)), kThreads, 0, stream, k,
                     v, slots, rows, num_kv_heads, head_dim, k_pool, v_pool);
  else
    launch_dependent(append_kv_kernel<1>, blocks_for(work * head_dim), kThreads, 0, stream, k, v,
                     slots, rows, num_kv_heads, head_dim, k_pool, v_pool);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
