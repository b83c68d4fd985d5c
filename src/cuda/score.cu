// Scoring kernels. The score kernel gives each block kScoreChunks consecutive eligible chunks of
// one (entry, KV group) stream: their representatives are read from global memory once (16-byte
// loads, widened to f32 in shared memory) and scored against every list of the stream,
// 16·QA index queries at a time, with a 4 chunks × QA queries register tile per thread (quest
// representatives and d = 256); mean representatives at d ≤ 128 go to bf16 tensor cores
// (score_mma_kernel) or, with tiles::kScoreMma off, to an FMA kernel that keeps them in registers
// (score_regs_kernel); streams of few lists (decode) take a warp-per-chunk kernel.
#include <cmath>

#include "common.cuh"
#include "index_query.cuh"
#include "pdl.cuh"
#include "rep_read.cuh"
#include "score.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

__global__ void index_query_kernel(const ListDesc* __restrict__ lists,
                                   const int32_t* __restrict__ sel,
                                   const float* __restrict__ index_q, int num_kv_heads,
                                   int head_dim, float* __restrict__ qbar,
                                   uint16_t* __restrict__ qsplit) {
  dev::dependent_start();
  const int32_t li = sel[blockIdx.x];
  write_index_query(lists[li], li, index_q, num_kv_heads, head_dim, qbar, qsplit);
}

template <bool kQuest, int QA, bool kInt8>
__global__ void __launch_bounds__(tiles::kScoreThreads)
    score_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
                 const int32_t* __restrict__ block_pages, const uint8_t* __restrict__ reps,
                 const float* __restrict__ scales, const float* __restrict__ qbar, int num_kv_heads,
                 int head_dim, float inv_sqrt_d, float* __restrict__ scores,
                 const int32_t* __restrict__ keep) {
  dev::dependent_start();
  constexpr int NC = tiles::kScoreChunks, NQ = 16 * QA;
  const ScoreStream S = streams[blockIdx.y];
  // A decode list that keeps its earlier selection (reuse.cuh) is not scored.
  if (keep && keep[S.first_list]) return;
  const int32_t c0 = S.elig_begin + static_cast<int32_t>(blockIdx.x) * NC;
  if (c0 >= S.elig_end_max) return;
  const int nc = min(NC, S.elig_end_max - c0);
  const int rw = kQuest ? 2 * head_dim : head_dim;
  const int rstride = rw + 1;  // +1 float: chunk rows land on distinct banks
  const int qstride = head_dim + 1;
  extern __shared__ float smem[];
  float* rep_s = smem;                // [NC][rw + 1]
  float* q_s = rep_s + NC * rstride;  // [NQ][head_dim + 1]
  __shared__ int32_t end_s[NQ];
  __shared__ int64_t out_s[NQ];

  // Representatives of the tile's chunks: 8 bf16 or 16 int8 values per 16-byte load; int8 ones
  // times their scale (exact: a power of two), the values the CPU cache holds.
  using RB = dev::RepBytes<kInt8>;
  const int per_row = rw / RB::kChan;
  const int32_t* table = block_pages + S.table_begin;
  for (int e = threadIdx.x; e < NC * per_row; e += blockDim.x) {
    const int c = e / per_row, col = (e % per_row) * RB::kChan;
    float* dst = rep_s + c * rstride + col;
    float f[RB::kChan] = {};
    if (c < nc) {
      const int64_t rep = static_cast<int64_t>(table[c0 + c]) * num_kv_heads + S.kv;
      dev::unpack16<kInt8>(*reinterpret_cast<const uint4*>(reps + (rep * rw + col) * RB::kBytes),
                           f);
      if constexpr (kInt8) {
        const float sc = scales[rep];
#pragma unroll
        for (int h = 0; h < RB::kChan; ++h) f[h] *= sc;
      }
    }
#pragma unroll
    for (int h = 0; h < RB::kChan; ++h) dst[h] = f[h];
  }

  const int cq = threadIdx.x % 16, gq = threadIdx.x / 16;
  for (int q0 = 0; q0 < S.num_lists; q0 += NQ) {
    const int nq = min(NQ, S.num_lists - q0);
    __syncthreads();  // rep_s complete (first pass); q_s free (later passes)
    for (int e = threadIdx.x; e < NQ * head_dim; e += blockDim.x) {
      const int qi = e / head_dim, i = e % head_dim;
      q_s[qi * qstride + i] =
          qi < nq
              ? qbar[static_cast<int64_t>(S.first_list + (q0 + qi) * S.list_stride) * head_dim + i]
              : 0.0f;
    }
    for (int qi = threadIdx.x; qi < NQ; qi += blockDim.x) {
      if (qi < nq) {
        const ListDesc& L = lists[S.first_list + (q0 + qi) * S.list_stride];
        end_s[qi] = L.elig_end;
        out_s[qi] = L.score_begin - L.elig_begin;
      } else {
        end_s[qi] = 0;
        out_s[qi] = 0;
      }
    }
    __syncthreads();
    float acc[QA][4] = {};
    for (int i = 0; i < head_dim; ++i) {
      float q[QA], r[4];
#pragma unroll
      for (int a = 0; a < QA; ++a) q[a] = q_s[(gq + 16 * a) * qstride + i];
#pragma unroll
      for (int b = 0; b < 4; ++b) r[b] = rep_s[(cq + 16 * b) * rstride + i];
      if constexpr (kQuest) {
        float h[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) h[b] = rep_s[(cq + 16 * b) * rstride + head_dim + i];
#pragma unroll
        for (int a = 0; a < QA; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const float lo = q[a] * r[b], hi = q[a] * h[b];
            acc[a][b] += lo > hi ? lo : hi;
          }
      } else {
#pragma unroll
        for (int a = 0; a < QA; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(q[a], r[b], acc[a][b]);
      }
    }
#pragma unroll
    for (int a = 0; a < QA; ++a) {
      const int qi = gq + 16 * a;
      if (qi >= nq) continue;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int32_t c = c0 + cq + 16 * b;
        if (cq + 16 * b < nc && c < end_s[qi]) scores[out_s[qi] + c] = acc[a][b] * inv_sqrt_d;
      }
    }
  }
}

// Streams with at most kScoreFewLists lists (decode): each block takes kScoreFewChunks chunks.
// Their physical page IDs are read first, all at once and coalesced, into shared memory, so the
// representative loads that follow no longer wait on a block-table load each (v2 was latency-
// bound on that dependent pair: 1.0 TB/s). A chunk's representative is then read by D/kChan
// lanes, 16 bytes (8 bf16 or 16 int8 channels, rep_read.cuh) each, U loads in flight per lane
// before any arithmetic; q̄ lives in registers (kChan channels per lane per list) and the partial
// sums meet by xor shuffles.
template <int D, bool kQuest, int NL, bool kInt8>
__global__ void __launch_bounds__(tiles::kScoreThreads)
    score_few_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
                     const int32_t* __restrict__ block_pages, const uint8_t* __restrict__ reps,
                     const float* __restrict__ scales, const float* __restrict__ qbar,
                     const float* __restrict__ index_q, int num_kv_heads, float inv_sqrt_d,
                     float* __restrict__ scores, const int32_t* __restrict__ keep) {
  dev::dependent_start();
  using RB = dev::RepBytes<kInt8>;
  constexpr int CH = RB::kChan;      // channels per lane
  constexpr int LPC = D / CH;        // lanes per chunk
  constexpr int CPL = 32 / LPC;      // chunks per warp-wide load
  constexpr int U = kQuest ? 4 : 8;  // 16-byte loads in flight per lane (quest: 2 per chunk)
  constexpr int WARPS = tiles::kScoreThreads / 32;
  constexpr int NCB = tiles::kScoreFewChunks;
  constexpr int PER_ROUND = WARPS * U * CPL;  // chunks of the block per round
  static_assert(NCB % PER_ROUND == 0, "rounds must tile the block's chunks");
  __shared__ int32_t page_s[NCB];
  const ScoreStream S = streams[blockIdx.y];
  // A decode list that keeps its earlier selection (reuse.cuh) is not scored.
  if (keep && keep[S.first_list]) return;
  const int32_t c0 = S.elig_begin + static_cast<int32_t>(blockIdx.x) * NCB;
  if (c0 >= S.elig_end_max) return;
  const int nc = min(NCB, S.elig_end_max - c0);
  const int32_t* table = block_pages + S.table_begin + c0;
  for (int i = threadIdx.x; i < nc; i += blockDim.x) page_s[i] = table[i];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPC, grp = lane / LPC;
  const int nl = min(NL, S.num_lists);
  float q[NL][CH];
  int32_t end[NL];
  int64_t out[NL];
#pragma unroll
  for (int l = 0; l < NL; ++l) {
    const int64_t li = S.first_list + static_cast<int64_t>(min(l, nl - 1)) * S.list_stride;
    if (index_q) {  // q̄ from the index queries, as write_index_query computes it
      index_query_channels<CH>(lists[li], index_q, num_kv_heads, D, sub * CH, q[l]);
    } else {
      const float4* qp = reinterpret_cast<const float4*>(qbar + li * D + sub * CH);
#pragma unroll
      for (int i = 0; i < CH / 4; ++i) {
        const float4 v = qp[i];
        q[l][4 * i] = v.x;
        q[l][4 * i + 1] = v.y;
        q[l][4 * i + 2] = v.z;
        q[l][4 * i + 3] = v.w;
      }
    }
    end[l] = l < nl ? lists[li].elig_end : 0;
    out[l] = lists[li].score_begin - lists[li].elig_begin;
  }
  __syncthreads();
  const int64_t row_bytes = int64_t{kQuest ? 2 * D : D} * RB::kBytes;
  for (int r0 = 0; r0 < nc; r0 += PER_ROUND) {
    uint4 lo[U], hi[kQuest ? U : 1];
    float sc[kInt8 ? U : 1] = {};  // int8: each chunk's 2^e, loaded with its codes (sub 0 only)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = r0 + (warp * U + u) * CPL + grp;
      lo[u] = make_uint4(0, 0, 0, 0);
      if constexpr (kQuest) hi[u] = make_uint4(0, 0, 0, 0);
      if (c < nc) {
        const int64_t rep = static_cast<int64_t>(page_s[c]) * num_kv_heads + S.kv;
        const uint8_t* r = reps + rep * row_bytes + sub * 16;
        lo[u] = __ldg(reinterpret_cast<const uint4*>(r));
        if constexpr (kQuest) hi[u] = __ldg(reinterpret_cast<const uint4*>(r + D * RB::kBytes));
        if constexpr (kInt8)
          if (sub == 0) sc[u] = __ldg(scales + rep);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = r0 + (warp * U + u) * CPL + grp;
      float rl[CH], rh[CH];
      dev::unpack16<kInt8>(lo[u], rl);
      if constexpr (kQuest) dev::unpack16<kInt8>(hi[u], rh);
#pragma unroll
      for (int l = 0; l < NL; ++l) {
        if (l >= nl) break;
        float acc = dev::lane_score<kQuest, CH>(q[l], rl, rh);
#pragma unroll
        for (int o = LPC / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (sub == 0 && c < nc && c0 + c < end[l])
          scores[out[l] + c0 + c] = dev::finish_score<kInt8>(acc, sc, kInt8 ? u : 0, inv_sqrt_d);
      }
    }
  }
}

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
// 2^e before 1/√d; a representative with a non-finite value has a NaN scale (core/rep_quant.h),
// so its scores are NaN without the f32 fallback.
template <int D, bool kInt8>
__global__ void __launch_bounds__(tiles::kScoreMmaThreads, 512 / tiles::kScoreMmaThreads)
    score_mma_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
                     const int32_t* __restrict__ block_pages, const uint8_t* __restrict__ rep_bytes,
                     const float* __restrict__ scales, const float* __restrict__ qbar,
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
        my_page >= 0 ? __ldg(scales + static_cast<int64_t>(my_page) * num_kv_heads + S.kv) : 0.0f;

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

template <int D, bool kQuest, bool kInt8>
void launch_few(dim3 grid, int max_lists, const ScoreStream* streams, const ListDesc* lists,
                const int32_t* block_pages, const RepArgs& reps, const float* qbar,
                const float* index_q, int num_kv_heads, float inv_sqrt_d, float* scores,
                const int32_t* keep, cudaStream_t stream) {
  if (max_lists <= 1)
    launch_dependent(score_few_kernel<D, kQuest, 1, kInt8>, grid, tiles::kScoreThreads, 0, stream,
                     streams, lists, block_pages, reps.data, reps.scales, qbar, index_q,
                     num_kv_heads, inv_sqrt_d, scores, keep);
  else
    launch_dependent(score_few_kernel<D, kQuest, tiles::kScoreFewLists, kInt8>, grid,
                     tiles::kScoreThreads, 0, stream, streams, lists, block_pages, reps.data,
                     reps.scales, qbar, index_q, num_kv_heads, inv_sqrt_d, scores, keep);
}

template <int D>
void launch_few_d(dim3 grid, int max_lists, bool quest, const ScoreStream* streams,
                  const ListDesc* lists, const int32_t* block_pages, const RepArgs& reps,
                  const float* qbar, const float* index_q, int num_kv_heads, float inv_sqrt_d,
                  float* scores, const int32_t* keep, cudaStream_t stream) {
  auto* launch = quest ? (reps.int8 ? &launch_few<D, true, true> : &launch_few<D, true, false>)
                       : (reps.int8 ? &launch_few<D, false, true> : &launch_few<D, false, false>);
  launch(grid, max_lists, streams, lists, block_pages, reps, qbar, index_q, num_kv_heads,
         inv_sqrt_d, scores, keep, stream);
}

template <bool kQuest, int QA, bool kInt8>
cudaError_t launch_tiled(dim3 grid, const ScoreStream* streams, const ListDesc* lists,
                         const int32_t* block_pages, const RepArgs& reps, const float* qbar,
                         int num_kv_heads, int head_dim, float inv_sqrt_d, float* scores,
                         const int32_t* keep, cudaStream_t stream) {
  const int rw = kQuest ? 2 * head_dim : head_dim;
  const size_t smem = sizeof(float) * (static_cast<size_t>(tiles::kScoreChunks) * (rw + 1) +
                                       static_cast<size_t>(16 * QA) * (head_dim + 1));
  auto* kernel = score_kernel<kQuest, QA, kInt8>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  launch_dependent(kernel, grid, tiles::kScoreThreads, smem, stream, streams, lists, block_pages,
                   reps.data, reps.scales, qbar, num_kv_heads, head_dim, inv_sqrt_d, scores, keep);
  return cudaSuccess;
}

// launch_tiled with QA (queries per pass, 16 · QA) chosen at run time: 1, 2 or 4.
template <bool kQuest, bool kInt8>
cudaError_t launch_tiled_qa(int qa, dim3 grid, const ScoreStream* streams, const ListDesc* lists,
                            const int32_t* block_pages, const RepArgs& reps, const float* qbar,
                            int num_kv_heads, int head_dim, float inv_sqrt_d, float* scores,
                            const int32_t* keep, cudaStream_t stream) {
  auto* launch = qa == 1   ? &launch_tiled<kQuest, 1, kInt8>
                 : qa == 2 ? &launch_tiled<kQuest, 2, kInt8>
                           : &launch_tiled<kQuest, 4, kInt8>;
  return launch(grid, streams, lists, block_pages, reps, qbar, num_kv_heads, head_dim, inv_sqrt_d,
                scores, keep, stream);
}

template <int D>
void launch_mma(dim3 grid, const ScoreStream* streams, const ListDesc* lists,
                const int32_t* block_pages, const RepArgs& reps, const float* qbar,
                const uint32_t* qsplit, int num_kv_heads, float inv_sqrt_d, float* scores,
                const int32_t* keep, cudaStream_t stream) {
  launch_dependent(reps.int8 ? score_mma_kernel<D, true> : score_mma_kernel<D, false>, grid,
                   tiles::kScoreMmaThreads, 0, stream, streams, lists, block_pages, reps.data,
                   reps.scales, qbar, qsplit, num_kv_heads, inv_sqrt_d, scores, keep);
}

}  // namespace

cudaError_t launch_index_queries(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                 const float* index_q, int num_kv_heads, int head_dim, float* qbar,
                                 uint16_t* qsplit, cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  launch_dependent(index_query_kernel, static_cast<unsigned>(num_sel), head_dim, 0, stream, lists,
                   sel_lists, index_q, num_kv_heads, head_dim, qbar, qsplit);
  return cudaGetLastError();
}

bool score_takes_index_queries(int32_t max_lists, const float* index_q) {
  return max_lists <= tiles::kScoreFewLists && index_q &&
         reinterpret_cast<uintptr_t>(index_q) % 16 == 0;
}

cudaError_t launch_score(const ScoreStream* streams, int64_t num_streams, int32_t max_span,
                         int32_t max_lists, const ListDesc* lists, const int32_t* block_pages,
                         const RepArgs& reps, const float* qbar, const uint16_t* qsplit,
                         const float* index_q, int num_kv_heads, int head_dim, bool quest,
                         float* scores, const int32_t* keep, cudaStream_t stream) {
  if (index_q && !score_takes_index_queries(max_lists, index_q)) return cudaErrorInvalidValue;
  if (reps.int8 && !reps.scales) return cudaErrorInvalidValue;
  if (num_streams <= 0 || max_span <= 0) return cudaSuccess;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(head_dim));
  cudaError_t err = cudaSuccess;
  if (max_lists <= tiles::kScoreFewLists) {
    const dim3 grid(
        static_cast<unsigned>((max_span + tiles::kScoreFewChunks - 1) / tiles::kScoreFewChunks),
        static_cast<unsigned>(num_streams));
    auto* launch = head_dim == 64    ? &launch_few_d<64>
                   : head_dim == 128 ? &launch_few_d<128>
                   : head_dim == 256 ? &launch_few_d<256>
                                     : nullptr;
    if (!launch) return cudaErrorInvalidValue;
    launch(grid, max_lists, quest, streams, lists, block_pages, reps, qbar, index_q, num_kv_heads,
           inv_sqrt_d, scores, keep, stream);
    return cudaGetLastError();
  }
  if (!quest && (head_dim == 64 || head_dim == 128)) {
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
      launch_dependent(score_regs_kernel<128>, grid, tiles::kScoreThreads, 0, stream, streams,
                       lists, block_pages, bf16, qbar, num_kv_heads, inv_sqrt_d, scores, keep);
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>((max_span + tiles::kScoreChunks - 1) / tiles::kScoreChunks),
                  static_cast<unsigned>(num_streams));
  const int qa = max_lists <= 16 ? 1 : max_lists <= 32 ? 2 : 4;
  auto* launch = quest
                     ? (reps.int8 ? &launch_tiled_qa<true, true> : &launch_tiled_qa<true, false>)
                     : (reps.int8 ? &launch_tiled_qa<false, true> : &launch_tiled_qa<false, false>);
  err = launch(qa, grid, streams, lists, block_pages, reps, qbar, num_kv_heads, head_dim,
               inv_sqrt_d, scores, keep, stream);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
