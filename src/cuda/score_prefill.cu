// Prefill scoring (score.cu's launch_score sends streams of many lists with mean representatives
// at d = 64 or 128 here): bf16 tensor cores (score_mma_kernel, the default, and the only kernel
// for int8 representatives) or, with tiles::kScoreMma off, an FMA kernel that keeps the
// representatives in registers (score_regs_kernel).
#include <cstdint>

#include "common.cuh"
#include "pdl.cuh"
#include "rep_read.cuh"
#include "score_prefill.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

// Streams of many lists with mean representatives at d ≤ 128 (prefill: 16–128 QShare groups per
// stream). The tile kernel above kept representatives and queries in shared memory and paid 5
// shared loads per 4 FMAs at 16 lists (G = 32: 0.47 ms where the 0.27 GB of representatives take
// ~0.085 ms). Here the representatives stay in registers: four lanes (a quad) own four chunks,
// lane s holding channels 16j + 4s … 16j + 4s + 3 (j < D/16) of all four as packed bf16 (D/2
// registers), loaded straight from global memory, all at once, after one page-ID load per lane.
// The index queries are staged in shared memory; one 16-byte broadcast load (4 channels of one
// query, the quad's 4 addresses contiguous) feeds 16 FMAs (4 chunks × 4 channels). Each lane ends
// with partial sums over its quarter of the channels; a reduce-scatter of 3 shuffles per query
// leaves lane s with the full score of chunk s, so a warp writes 32 consecutive scores.
// Summation order: per lane sequential over its channels, then (p0 + p2) + (p1 + p3) for every
// chunk (commutative adds), so equal representatives give bit-equal scores wherever they sit.
template <int D>
__global__ void __launch_bounds__(tiles::kScoreThreads, 2)
    score_regs_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
                      const int32_t* __restrict__ block_pages, const uint16_t* __restrict__ reps,
                      const float* __restrict__ qbar, int num_kv_heads, float inv_sqrt_d,
                      float* __restrict__ scores, const int32_t* __restrict__ keep) {
  dev::dependent_start();
  constexpr int C = 4;                          // chunks per quad = lanes per quad
  constexpr int J = D / 16;                     // 16-channel steps, 4 channels per lane each
  constexpr int QG = 4;                         // queries per register pass
  constexpr int QP = tiles::kScoreRegsQueries;  // queries staged in shared memory at once
  constexpr int NCB = tiles::kScoreThreads;     // chunks per block: one written per lane
  static_assert(D % 16 == 0 && QP % QG == 0, "tile shape");
  __shared__ __align__(16) float q_s[QP * D];
  __shared__ int32_t end_s[QP];
  __shared__ int64_t out_s[QP];
  const ScoreStream S = streams[blockIdx.y];
  // A decode list that keeps its earlier selection (reuse.cuh) is not scored.
  if (keep && keep[S.first_list]) return;
  const int32_t c0 = S.elig_begin + static_cast<int32_t>(blockIdx.x) * NCB;
  if (c0 >= S.elig_end_max) return;
  const int lane = threadIdx.x % 32, s = lane % C;
  const int32_t mine = c0 + static_cast<int32_t>(threadIdx.x);  // the chunk this lane writes
  const int32_t my_page = mine < S.elig_end_max ? block_pages[S.table_begin + mine] : -1;

  uint2 rv[C][J];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int32_t page = __shfl_sync(0xffffffffu, my_page, (lane & ~(C - 1)) + c);
    const uint16_t* r =
        reps + (static_cast<int64_t>(page < 0 ? 0 : page) * num_kv_heads + S.kv) * D + 4 * s;
#pragma unroll
    for (int j = 0; j < J; ++j)
      rv[c][j] = page >= 0 ? __ldg(reinterpret_cast<const uint2*>(r + 16 * j)) : make_uint2(0, 0);
  }

  for (int q0 = 0; q0 < S.num_lists; q0 += QP) {
    const int nq = min(QP, S.num_lists - q0);
    const int nq_pad = (nq + QG - 1) / QG * QG;  // rows read by the last register pass
    __syncthreads();                             // q_s free (later passes)
    for (int e = threadIdx.x; e < nq_pad * (D / 4); e += blockDim.x) {
      const int qi = e / (D / 4), i4 = e % (D / 4);
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (qi < nq)
        v = reinterpret_cast<const float4*>(
            qbar + static_cast<int64_t>(S.first_list + (q0 + qi) * S.list_stride) * D)[i4];
      reinterpret_cast<float4*>(q_s)[e] = v;
    }
    for (int qi = threadIdx.x; qi < nq; qi += blockDim.x) {
      const ListDesc& L = lists[S.first_list + (q0 + qi) * S.list_stride];
      end_s[qi] = L.elig_end;
      out_s[qi] = L.score_begin - L.elig_begin;
    }
    __syncthreads();
    for (int a0 = 0; a0 < nq; a0 += QG) {
      float acc[QG][C] = {};
#pragma unroll
      for (int j = 0; j < J; ++j) {
        // Widened here, per query pass: the empty volatile asm stops the compiler from hoisting
        // all D/2 · 4 widened floats out of the a0 loop (that spilled: 128 f32 + 64 packed).
        float r[C][4];
#pragma unroll
        for (int c = 0; c < C; ++c) {
          uint32_t x = rv[c][j].x, y = rv[c][j].y;
          asm volatile("" : "+r"(x), "+r"(y));
          r[c][0] = __uint_as_float(x << 16);
          r[c][1] = __uint_as_float(x & 0xffff0000u);
          r[c][2] = __uint_as_float(y << 16);
          r[c][3] = __uint_as_float(y & 0xffff0000u);
        }
#pragma unroll
        for (int a = 0; a < QG; ++a) {
          const float4 q = *reinterpret_cast<const float4*>(q_s + (a0 + a) * D + 16 * j + 4 * s);
#pragma unroll
          for (int c = 0; c < C; ++c) {
            acc[a][c] = fmaf(q.x, r[c][0], acc[a][c]);
            acc[a][c] = fmaf(q.y, r[c][1], acc[a][c]);
            acc[a][c] = fmaf(q.z, r[c][2], acc[a][c]);
            acc[a][c] = fmaf(q.w, r[c][3], acc[a][c]);
          }
        }
      }
#pragma unroll
      for (int a = 0; a < QG; ++a) {
        // Reduce-scatter over the quad: lane s keeps the chunks of its half (bit 1 of s), adds its
        // xor-2 partner's halves, then keeps chunk s and adds its xor-1 partner's sum of it.
        const bool hi2 = (s & 2) != 0, hi1 = (s & 1) != 0;
        float k0 = hi2 ? acc[a][2] : acc[a][0], k1 = hi2 ? acc[a][3] : acc[a][1];
        const float t0 = hi2 ? acc[a][0] : acc[a][2], t1 = hi2 ? acc[a][1] : acc[a][3];
        k0 += __shfl_xor_sync(0xffffffffu, t0, 2);
        k1 += __shfl_xor_sync(0xffffffffu, t1, 2);
        float tot = hi1 ? k1 : k0;
        tot += __shfl_xor_sync(0xffffffffu, hi1 ? k0 : k1, 1);
        const int qi = a0 + a;
        if (qi < nq && mine < end_s[qi]) scores[out_s[qi] + mine] = tot * inv_sqrt_d;
      }
    }
  }
}

// True when either bf16 half of a packed pair is ±inf or NaN (exponent bits all ones).
__device__ __forceinline__ bool nonfinite_pair(uint32_t w) {
  return (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u;
}

// bf16 tensor-core scoring (mma.sync m16n8k16, f32 accumulation) for the same streams as
// score_regs_kernel. A = representatives (16 chunks × 16 channels, exact bf16, the packed words
// as loaded: no widening), B = index queries split exactly into three bf16 terms q = hi + mid + lo
// (by index_query_kernel; each product exact in f32; 3 × 8 mantissa bits cover f32's 24), so the
// only error against the f32 dot product is the order and rounding of the f32 accumulation (well
// inside the tests' d·2^-24·Σ|q_i r_i| bound). A warp owns 32 chunks (two m16 tiles); lane (g, t)
// holds words 16b + 4t … + 3 of chunks g and g + 8 of each tile (one 16-byte load per b) and uses
// word 16b + 4t + 2h (k-slot t) and + 1 (k-slot 4 + t) in k-step (b, h): a permutation of k that is
// the same for the queries, whose staged rows the lane reads with the same 16-byte offsets. 0 × inf
// is NaN on the tensor cores where the f32 path gives ±inf: a chunk with a non-finite
// representative value is scored by the sequential f32 loop instead (same result as the CPU's
// order of operations up to rounding; NaN stays NaN).
// int8 representatives (kInt8): a lane's 8 channels are 8 bytes, widened to bf16 in registers
// (exact: |code| ≤ 127 needs 7 bits), and each chunk's product is scaled by its representative's
// 2^e before 1/√d; a representative with a non-finite value has zero codes and the scale −inf
// (rep_read.cuh), so its scores are NaN without the f32 fallback.
template <int D, bool kInt8>
__global__ void __launch_bounds__(tiles::kScoreMmaThreads, 512 / tiles::kScoreMmaThreads)
    score_mma_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
                     const int32_t* __restrict__ block_pages, const uint8_t* __restrict__ rep_bytes,
                     const int8_t* __restrict__ exps, const float* __restrict__ qbar,
                     const uint32_t* __restrict__ qsplit, int num_kv_heads, float inv_sqrt_d,
                     float* __restrict__ scores, const int32_t* __restrict__ keep) {
  dev::dependent_start();
  constexpr int NB = D / 32;                    // 16-word blocks of a representative row
  constexpr int QP = tiles::kScoreMmaQueries;   // queries staged per pass
  constexpr int QW = D / 2 + 4;                 // words per staged query row (+16 B spreads banks)
  constexpr int NCB = tiles::kScoreMmaThreads;  // chunks per block: 32 per warp
  static_assert(D % 32 == 0 && QP % 8 == 0, "tile shape");
  __shared__ __align__(16) uint32_t q_s[3][QP * QW];  // lo, mid, hi terms as bf16 pairs
  __shared__ int32_t end_s[QP];
  __shared__ int64_t out_s[QP];
  const ScoreStream S = streams[blockIdx.y];
  // A decode list that keeps its earlier selection (reuse.cuh) is not scored.
  if (keep && keep[S.first_list]) return;
  const int32_t c0 = S.elig_begin + static_cast<int32_t>(blockIdx.x) * NCB;
  if (c0 >= S.elig_end_max) return;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int32_t wbase = c0 + static_cast<int32_t>(threadIdx.x / 32) * 32;
  const int32_t my_page =
      wbase + lane < S.elig_end_max ? block_pages[S.table_begin + wbase + lane] : -1;
  // kInt8: each chunk's 2^e, by the lane that read its page ID (shared memory: the loop below
  // has no registers to spare for the pointer).
  __shared__ float scale_s[kInt8 ? NCB : 1];
  if constexpr (kInt8)
    scale_s[threadIdx.x] =
        my_page >= 0
            ? dev::rep_scale(__ldg(exps + static_cast<int64_t>(my_page) * num_kv_heads + S.kv))
            : 0.0f;

  const uint16_t* reps = reinterpret_cast<const uint16_t*>(rep_bytes);  // bf16 only
  uint4 rv[2][2][NB];  // [m tile][row g / g + 8][b]
  int32_t page[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      page[mt][r] = __shfl_sync(0xffffffffu, my_page, mt * 16 + g + 8 * r);
      const int64_t pg = page[mt][r] < 0 ? 0 : page[mt][r];
      if constexpr (kInt8) {
        const uint8_t* base = rep_bytes + (pg * num_kv_heads + S.kv) * D + 8 * t;
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          const uint2 w = page[mt][r] >= 0 ? __ldg(reinterpret_cast<const uint2*>(base + 32 * b))
                                           : make_uint2(0, 0);
          float f[8];
          dev::unpack_int8x4(w.x, f);
          dev::unpack_int8x4(w.y, f + 4);
          rv[mt][r][b] = make_uint4(dev::pack_bf16x2(f[0], f[1]), dev::pack_bf16x2(f[2], f[3]),
                                    dev::pack_bf16x2(f[4], f[5]), dev::pack_bf16x2(f[6], f[7]));
        }
        // One row's codes widened before the next row's loads: with every load hoisted first,
        // the raw codes and the widened words together overflow the 128 registers.
        asm volatile("" ::: "memory");
      } else {
        const uint16_t* base = reps + (pg * num_kv_heads + S.kv) * D + 8 * t;
#pragma unroll
        for (int b = 0; b < NB; ++b)
          rv[mt][r][b] = page[mt][r] >= 0 ? __ldg(reinterpret_cast<const uint4*>(base + 32 * b))
                                          : make_uint4(0, 0, 0, 0);
      }
    }
  bool bad[2][2] = {};
  if constexpr (!kInt8) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        bool f = false;
#pragma unroll
        for (int b = 0; b < NB; ++b)
          f = f || nonfinite_pair(rv[mt][r][b].x) || nonfinite_pair(rv[mt][r][b].y) ||
              nonfinite_pair(rv[mt][r][b].z) || nonfinite_pair(rv[mt][r][b].w);
        f = __shfl_xor_sync(0xffffffffu, f, 1) || f;  // the 4 lanes of a row hold its 4 quarters
        f = __shfl_xor_sync(0xffffffffu, f, 2) || f;
        bad[mt][r] = f;
      }
  }

  for (int q0 = 0; q0 < S.num_lists; q0 += QP) {
    const int nq = min(QP, S.num_lists - q0);
    const int nq_pad = (nq + 7) / 8 * 8;
    __syncthreads();  // q_s free (later passes)
    // The three terms of each query (split once by index_query_kernel), 16 bytes at a time.
    for (int e = threadIdx.x; e < nq_pad * 3 * (D / 8); e += blockDim.x) {
      const int qi = e / (3 * (D / 8)), p = e / (D / 8) % 3, c4 = e % (D / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (qi < nq)
        v = reinterpret_cast<const uint4*>(
            qsplit +
            (static_cast<int64_t>(S.first_list + (q0 + qi) * S.list_stride) * 3 + p) * (D / 2))[c4];
      *reinterpret_cast<uint4*>(&q_s[p][qi * QW + 4 * c4]) = v;
    }
    for (int qi = threadIdx.x; qi < nq; qi += blockDim.x) {
      const ListDesc& L = lists[S.first_list + (q0 + qi) * S.list_stride];
      end_s[qi] = L.elig_end;
      out_s[qi] = L.score_begin - L.elig_begin;
    }
    __syncthreads();
    for (int n0 = 0; n0 < nq; n0 += 8) {
      float acc[2][4] = {};
#pragma unroll
      for (int p = 0; p < 3; ++p)  // smallest term first
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          const uint4 bq = *reinterpret_cast<const uint4*>(&q_s[p][(n0 + g) * QW + 16 * b + 4 * t]);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t b0 = h ? bq.z : bq.x, b1 = h ? bq.w : bq.y;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              const uint32_t a[4] = {
                  h ? rv[mt][0][b].z : rv[mt][0][b].x, h ? rv[mt][1][b].z : rv[mt][1][b].x,
                  h ? rv[mt][0][b].w : rv[mt][0][b].y, h ? rv[mt][1][b].w : rv[mt][1][b].y};
              dev::mma_bf16_16816(acc[mt], a, b0, b1);
            }
          }
        }
        // Lane (g, t) holds chunks g and g + 8 of each tile for queries n0 + 2t and n0 + 2t + 1.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int qi = n0 + 2 * t + j;
            const int32_t chunk = wbase + mt * 16 + g + 8 * r;
            if (qi >= nq || chunk >= end_s[qi]) continue;
            float v = acc[mt][2 * r + j];
            if constexpr (kInt8) v *= scale_s[chunk - c0];
            if (bad[mt][r]) {
              const uint16_t* rp =
                  reps + (static_cast<int64_t>(page[mt][r]) * num_kv_heads + S.kv) * D;
              const float* qp =
                  qbar + static_cast<int64_t>(S.first_list + (q0 + qi) * S.list_stride) * D;
              v = 0.0f;
              for (int i = 0; i < D; ++i) v = fmaf(qp[i], dev::bf16_to_f32(rp[i]), v);
            }
            scores[out_s[qi] + chunk] = v * inv_sqrt_d;
          }
    }
  }
}

template <int D>
void launch_mma(dim3 grid, const ScoreStream* streams, const ListDesc* lists,
                const int32_t* block_pages, const RepArgs& reps, const float* qbar,
                const uint32_t* qsplit, int num_kv_heads, float inv_sqrt_d, float* scores,
                const int32_t* keep, cudaStream_t stream) {
  launch_dependent(reps.int8 ? score_mma_kernel<D, true> : score_mma_kernel<D, false>, grid,
                   tiles::kScoreMmaThreads, 0, stream, streams, lists, block_pages, reps.data,
                   reps.exps, qbar, qsplit, num_kv_heads, inv_sqrt_d, scores, keep);
}

}  // namespace

void launch_score_prefill(const ScoreStream* streams, int64_t num_streams, int32_t max_span,
                          const ListDesc* lists, const int32_t* block_pages, const RepArgs& reps,
                          const float* qbar, const uint16_t* qsplit, int num_kv_heads, int head_dim,
                          float inv_sqrt_d, float* scores, const int32_t* keep,
                          cudaStream_t stream) {
  const dim3 grid(
      static_cast<unsigned>((max_span + tiles::kScoreThreads - 1) / tiles::kScoreThreads),
      static_cast<unsigned>(num_streams));
  const auto* qs = reinterpret_cast<const uint32_t*>(qsplit);
  const dim3 mgrid(
      static_cast<unsigned>((max_span + tiles::kScoreMmaThreads - 1) / tiles::kScoreMmaThreads),
      static_cast<unsigned>(num_streams));
  const auto* bf16 = reinterpret_cast<const uint16_t*>(reps.data);
  if ((tiles::kScoreMma || reps.int8) && head_dim == 64)  // int8: tensor cores only
    launch_mma<64>(mgrid, streams, lists, block_pages, reps, qbar, qs, num_kv_heads, inv_sqrt_d,
                   scores, keep, stream);
  else if (tiles::kScoreMma || reps.int8)
    launch_mma<128>(mgrid, streams, lists, block_pages, reps, qbar, qs, num_kv_heads, inv_sqrt_d,
                    scores, keep, stream);
  else if (head_dim == 64)
    launch_dependent(score_regs_kernel<64>, grid, tiles::kScoreThreads, 0, stream, streams, lists,
                     block_pages, bf16, qbar, num_kv_heads, inv_sqrt_d, scores, keep);
  else
    launch_dependent(score_regs_kernel<128>, grid, tiles::kScoreThreads, 0, stream, streams, lists,
                     block_pages, bf16, qbar, num_kv_heads, inv_sqrt_d, scores, keep);
}

}  // namespace cisa::cuda::detail
