// Scoring kernels. The score kernel gives each block kScoreChunks consecutive eligible chunks of
// one (entry, KV group) stream: their representatives are read from global memory once (16-byte
// loads, widened to f32 in shared memory) and scored against every list of the stream,
// 16·QA index queries at a time, with a 4 chunks × QA queries register tile per thread (quest
// representatives and d = 256); mean representatives at d ≤ 128 go to score_prefill.cu (bf16
// tensor cores, or an FMA kernel that keeps them in registers); streams of few lists (decode)
// take a warp-per-chunk kernel.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "index_query.cuh"
#include "pdl.cuh"
#include "rep_read.cuh"
#include "score.cuh"
#include "score_prefill.cuh"
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
                 const int8_t* __restrict__ exps, const float* __restrict__ qbar, int num_kv_heads,
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
        const float sc = dev::rep_scale(exps[rep]);
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

// Streams with at most kScoreFewLists lists (decode): a block takes tiles of kScoreFewChunks chunks
// of one stream, tiles blockIdx.x, blockIdx.x + gridDim.x, ... (launch_score's tiles_per_block of
// them at most), so its setup (the stream; then its lists, the keep flag and the first tile's page
// IDs, all issued before the flag is tested; then the index queries: three dependent reads before
// the first representative, four before the flag moved) is paid once for all of them. Each tile's
// physical page IDs are read at once, coalesced, into shared memory (the next tile's into registers
// while this tile is scored), so the representative loads that follow never wait on a block-table
// load each (v2 was latency-bound on that dependent pair: 1.0 TB/s). A chunk's representative is
// then read by D/kChan lanes, 16 bytes (8 bf16 or 16 int8 channels, rep_read.cuh) each, U loads in
// flight per lane before any arithmetic; q̄ lives in registers (kChan channels per lane per list)
// and the partial sums meet by xor shuffles. One list per stream (every decode list) bounds the
// registers for tiles::score_few_min_blocks blocks an SM: int8 took 112 registers, two blocks an
// SM.
template <int D, bool kQuest, int NL, bool kInt8>
__global__ void __launch_bounds__(tiles::kScoreThreads,
                                  NL == 1 ? tiles::score_few_min_blocks(kInt8) : 1)
    score_few_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
                     const int32_t* __restrict__ block_pages, const uint8_t* __restrict__ reps,
                     const int8_t* __restrict__ exps, const float* __restrict__ qbar,
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
  constexpr int PER_ROUND = WARPS * U * CPL;       // chunks of the block per round
  constexpr int PPT = NCB / tiles::kScoreThreads;  // page IDs per thread and tile
  static_assert(NCB % PER_ROUND == 0, "rounds must tile the block's chunks");
  static_assert(NCB % tiles::kScoreThreads == 0, "page IDs must tile the block's threads");
  __shared__ int32_t page_s[NCB];
  const ScoreStream S = streams[blockIdx.y];
  const int32_t span = S.elig_end_max - S.elig_begin;
  int32_t tile = static_cast<int32_t>(blockIdx.x);
  if (tile * NCB >= span) return;
  // Page IDs of tile t (of its first min(NCB, span − t·NCB) chunks) into registers.
  const int32_t* table = block_pages + S.table_begin + S.elig_begin;
  int32_t pid[PPT];
  const auto read_pages = [&](int32_t t) {
    const int32_t n = min(NCB, span - t * NCB);
#pragma unroll
    for (int j = 0; j < PPT; ++j) {
      const int i = j * tiles::kScoreThreads + static_cast<int>(threadIdx.x);
      pid[j] = i < n ? __ldg(table + t * NCB + i) : 0;
    }
  };
  read_pages(tile);
  // A decode list that keeps its earlier selection (reuse.cuh) is not scored. The flag is tested
  // after q̄'s reads below are issued, so that they overlap it.
  const bool kept = keep && keep[S.first_list];

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
  if (kept) return;
  const int64_t row_bytes = int64_t{kQuest ? 2 * D : D} * RB::kBytes;
  for (;;) {
    const int32_t c0 = S.elig_begin + tile * NCB;
    const int nc = min(NCB, span - tile * NCB);
    __syncthreads();  // the previous tile's rounds are done with page_s
#pragma unroll
    for (int j = 0; j < PPT; ++j) page_s[j * tiles::kScoreThreads + threadIdx.x] = pid[j];
    const int32_t next = tile + static_cast<int32_t>(gridDim.x);
    if (next * NCB < span) read_pages(next);
    __syncthreads();
    for (int r0 = 0; r0 < nc; r0 += PER_ROUND) {
      uint4 lo[U], hi[kQuest ? U : 1];
      int ex[kInt8 ? U : 1] = {};  // int8: each chunk's exponent (a register each: no byte packing)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = r0 + (warp * U + u) * CPL + grp;
        lo[u] = make_uint4(0, 0, 0, 0);
        if constexpr (kQuest) hi[u] = make_uint4(0, 0, 0, 0);
        if (c < nc) {
          const int64_t rep = static_cast<int64_t>(page_s[c]) * num_kv_heads + S.kv;
          const uint8_t* r = reps + rep * row_bytes + sub * 16;
          lo[u] = dev::load_rep_streaming(r);
          if constexpr (kQuest) hi[u] = dev::load_rep_streaming(r + D * RB::kBytes);
          if constexpr (kInt8)
            if (sub == 0) ex[u] = dev::load_exp_resident(exps + rep);
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
            scores[out[l] + c0 + c] = dev::finish_score<kInt8>(acc, ex, kInt8 ? u : 0, inv_sqrt_d);
        }
      }
    }
    if (next * NCB >= span) return;
    tile = next;
  }
}

template <int D, bool kQuest, bool kInt8>
void launch_few(dim3 grid, int max_lists, const ScoreStream* streams, const ListDesc* lists,
                const int32_t* block_pages, const RepArgs& reps, const float* qbar,
                const float* index_q, int num_kv_heads, float inv_sqrt_d, float* scores,
                const int32_t* keep, cudaStream_t stream) {
  if (max_lists <= 1)
    launch_dependent(score_few_kernel<D, kQuest, 1, kInt8>, grid, tiles::kScoreThreads, 0, stream,
                     streams, lists, block_pages, reps.data, reps.exps, qbar, index_q, num_kv_heads,
                     inv_sqrt_d, scores, keep);
  else
    launch_dependent(score_few_kernel<D, kQuest, tiles::kScoreFewLists, kInt8>, grid,
                     tiles::kScoreThreads, 0, stream, streams, lists, block_pages, reps.data,
                     reps.exps, qbar, index_q, num_kv_heads, inv_sqrt_d, scores, keep);
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
                   reps.data, reps.exps, qbar, num_kv_heads, head_dim, inv_sqrt_d, scores, keep);
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
                         int tiles_per_block, float* scores, const int32_t* keep,
                         cudaStream_t stream) {
  if (index_q && !score_takes_index_queries(max_lists, index_q)) return cudaErrorInvalidValue;
  if (reps.int8 && !reps.exps) return cudaErrorInvalidValue;
  if (num_streams <= 0 || max_span <= 0) return cudaSuccess;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(head_dim));
  cudaError_t err = cudaSuccess;
  if (max_lists <= tiles::kScoreFewLists) {
    const int64_t tiles = (int64_t{max_span} + tiles::kScoreFewChunks - 1) / tiles::kScoreFewChunks;
    const int64_t per_block = std::max(1, tiles_per_block);
    const dim3 grid(static_cast<unsigned>((tiles + per_block - 1) / per_block),
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
    launch_score_prefill(streams, num_streams, max_span, lists, block_pages, reps, qbar, qsplit,
                         num_kv_heads, head_dim, inv_sqrt_d, scores, keep, stream);
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
