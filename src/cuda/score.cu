// Scoring kernels. The score kernel gives each block kScoreChunks consecutive eligible chunks of
// one (entry, KV group) stream: their representatives are read from global memory once (16-byte
// loads, widened to f32 in shared memory) and scored against every list of the stream,
// kScoreQueries index queries at a time, with a 4 chunks × 4 queries register tile per thread.
#include <cmath>

#include "common.cuh"
#include "score.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

// Sequential sum in row order, then one multiply: the CPU's exact arithmetic (bit-identical q̄).
__global__ void index_query_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                                   const float* __restrict__ index_q, int num_kv_heads, int head_dim,
                                   float* __restrict__ qbar) {
  const int32_t li = sel[blockIdx.x];
  const ListDesc L = lists[li];
  const float inv = 1.0f / static_cast<float>(L.qbar_row1 - L.qbar_row0 + 1);
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t r = L.qbar_row0; r <= L.qbar_row1; ++r)
      acc = __fadd_rn(acc, index_q[(r * num_kv_heads + L.kv) * head_dim + i]);
    qbar[static_cast<int64_t>(li) * head_dim + i] = __fmul_rn(acc, inv);
  }
}

template <bool kQuest>
__global__ void __launch_bounds__(tiles::kScoreThreads)
score_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
             const int32_t* __restrict__ block_pages, const uint16_t* __restrict__ reps,
             const float* __restrict__ qbar, int num_kv_heads, int head_dim, float inv_sqrt_d,
             float* __restrict__ scores) {
  constexpr int NC = tiles::kScoreChunks, NQ = tiles::kScoreQueries;
  const ScoreStream S = streams[blockIdx.y];
  const int32_t c0 = S.elig_begin + static_cast<int32_t>(blockIdx.x) * NC;
  if (c0 >= S.elig_end_max) return;
  const int nc = min(NC, S.elig_end_max - c0);
  const int rw = kQuest ? 2 * head_dim : head_dim;
  const int rstride = rw + 1;        // +1 float: chunk rows land on distinct banks
  const int qstride = head_dim + 1;
  extern __shared__ float smem[];
  float* rep_s = smem;                       // [NC][rw + 1]
  float* q_s = rep_s + NC * rstride;         // [NQ][head_dim + 1]
  __shared__ int32_t end_s[NQ];
  __shared__ int64_t out_s[NQ];

  // Representatives of the tile's chunks: 8 bf16 per 16-byte load.
  const int per_row = rw / 8;
  const int32_t* table = block_pages + S.table_begin;
  for (int e = threadIdx.x; e < NC * per_row; e += blockDim.x) {
    const int c = e / per_row, col = (e % per_row) * 8;
    float* dst = rep_s + c * rstride + col;
    if (c < nc) {
      const int64_t page = table[c0 + c];
      const uint4 raw = *reinterpret_cast<const uint4*>(reps + (page * num_kv_heads + S.kv) * rw + col);
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        dst[2 * h] = __uint_as_float(w[h] << 16);
        dst[2 * h + 1] = __uint_as_float(w[h] & 0xffff0000u);
      }
    } else {
#pragma unroll
      for (int h = 0; h < 8; ++h) dst[h] = 0.0f;
    }
  }

  const int cq = threadIdx.x % 16, gq = threadIdx.x / 16;
  for (int q0 = 0; q0 < S.num_lists; q0 += NQ) {
    const int nq = min(NQ, S.num_lists - q0);
    __syncthreads();  // rep_s complete (first pass); q_s free (later passes)
    for (int e = threadIdx.x; e < NQ * head_dim; e += blockDim.x) {
      const int qi = e / head_dim, i = e % head_dim;
      q_s[qi * qstride + i] =
          qi < nq ? qbar[static_cast<int64_t>(S.first_list + (q0 + qi) * S.list_stride) * head_dim + i] : 0.0f;
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
    float acc[4][4] = {};
    for (int i = 0; i < head_dim; ++i) {
      float q[4], r[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) q[a] = q_s[(gq + 16 * a) * qstride + i];
#pragma unroll
      for (int b = 0; b < 4; ++b) r[b] = rep_s[(cq + 16 * b) * rstride + i];
      if constexpr (kQuest) {
        float h[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) h[b] = rep_s[(cq + 16 * b) * rstride + head_dim + i];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const float lo = q[a] * r[b], hi = q[a] * h[b];
            acc[a][b] += lo > hi ? lo : hi;
          }
      } else {
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(q[a], r[b], acc[a][b]);
      }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
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

}  // namespace

cudaError_t launch_index_queries(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                 const float* index_q, int num_kv_heads, int head_dim, float* qbar,
                                 cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  index_query_kernel<<<static_cast<unsigned>(num_sel), head_dim, 0, stream>>>(lists, sel_lists, index_q,
                                                                             num_kv_heads, head_dim, qbar);
  return cudaGetLastError();
}

cudaError_t launch_score(const ScoreStream* streams, int64_t num_streams, int32_t max_tiles,
                         const ListDesc* lists, const int32_t* block_pages, const uint16_t* reps,
                         const float* qbar, int num_kv_heads, int head_dim, bool quest, float* scores,
                         cudaStream_t stream) {
  if (num_streams <= 0 || max_tiles <= 0) return cudaSuccess;
  const int rw = quest ? 2 * head_dim : head_dim;
  const size_t smem = sizeof(float) * (static_cast<size_t>(tiles::kScoreChunks) * (rw + 1) +
                                       static_cast<size_t>(tiles::kScoreQueries) * (head_dim + 1));
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>(num_streams));
  cudaError_t err;
  if (quest) {
    err = cudaFuncSetAttribute(score_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    score_kernel<true><<<grid, tiles::kScoreThreads, smem, stream>>>(streams, lists, block_pages, reps, qbar,
                                                                     num_kv_heads, head_dim, inv_sqrt_d, scores);
  } else {
    err = cudaFuncSetAttribute(score_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    score_kernel<false><<<grid, tiles::kScoreThreads, smem, stream>>>(streams, lists, block_pages, reps, qbar,
                                                                      num_kv_heads, head_dim, inv_sqrt_d, scores);
  }
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
