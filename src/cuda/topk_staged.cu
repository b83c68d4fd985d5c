// Top-k v7 (PlanOptions::topk_staged): one block a list, as topk.cu's one-block kernel, but the
// list's scores are read from global memory once instead of five times, and most keys are
// touched by a few instructions in shared memory instead of a full radix pass each.
//
// Why: the one-block kernel (2,048 lists of 65,536 scores at 4:1 x 16, G = 4: 1.33-1.51 ms on the
// H200) is bound by instructions, not memory: ncu (2026-12-05) shows DRAM at 9 % and SM
// throughput at 62 %, ~170 instructions a key over four radix passes and the compaction, each
// pass loading, converting and testing every key again.
//
// How (every step is the spec's order: the same lists, bit for bit, as topk_radix.cuh):
//   1. Stage: read each score once, convert it to its order key, keep its top 16 bits in shared
//      memory (2 bytes a key) and count its top 8 bits (radix pass 1) in the same loop.
//   2. Pass 2 counts bits 16-23 of the staged keys whose top byte is pass 1's digit: the top 16
//      bits of the threshold T are known.
//   3. The keys whose top 16 bits equal T's (the candidates: typically a few hundred) are
//      collected, their full keys read again from the scores, and passes 3 and 4 run on them
//      alone. More than kTopkStagedCandidates candidates (ties, many NaN) fall back to the radix
//      select from global memory (topk_radix.cuh) for the whole list.
//   4. The compaction walks the staged keys in index order, a warp per contiguous range, a lane
//      8 keys at a time: a key is above T when its top 16 bits are, and equal or above when they
//      tie and its full key (read again: only candidates) is. Warp scans give each kept key its
//      place; a first pass counts each warp's keys above and equal to T for the block's offsets.

#include "common.cuh"
#include "pdl.cuh"
#include "reuse_commit.cuh"
#include "tile_sizes.cuh"
#include "topk.cuh"
#include "topk_radix.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kThreads = tiles::kTopkStagedThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kCandidates = tiles::kTopkStagedCandidates;
constexpr int kCandPerThread = kCandidates / kThreads;
static_assert(kCandidates % kThreads == 0, "candidates are held kCandPerThread a thread");

// Staged keys a list of at most max_scores needs: a multiple of 8 (the compaction reads 16 bytes
// a lane).
int64_t staged_slots(int64_t max_scores) {
  return (max_scores + 7) / 8 * 8;
}

size_t staged_smem_bytes(int64_t max_scores) {
  return static_cast<size_t>(staged_slots(max_scores)) * sizeof(uint16_t) +
         static_cast<size_t>(kCandidates) * sizeof(int32_t);
}

__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  return v;
}

// The 8 staged keys at [i, i + 8) (i a multiple of 8) and a bit mask of those below n.
__device__ __forceinline__ uint4 staged8(const uint16_t* hi16, int32_t i, int32_t n,
                                         uint32_t* valid) {
  *valid = i >= n ? 0u : (i + 8 <= n ? 0xffu : (1u << (n - i)) - 1u);
  return *valid ? *reinterpret_cast<const uint4*>(hi16 + i) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ uint32_t half_of(const uint4& v, int j) {
  const uint32_t w = j < 4 ? (j < 2 ? v.x : v.y) : (j < 6 ? v.z : v.w);
  return (j & 1) ? w >> 16 : w & 0xffffu;
}

__global__ void __launch_bounds__(kThreads, 1)
    topk_staged_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                       const float* __restrict__ scores, const int32_t* __restrict__ block_pages,
                       int32_t* __restrict__ pages, int32_t* __restrict__ chunks,
                       const int32_t* __restrict__ keep, TopkCommit commit, int32_t slots) {
  dev::dependent_start();
  extern __shared__ uint4 staged_mem[];
  __shared__ TopkShared<kThreads> sh;
  __shared__ int n_cand;
  __shared__ int warp_gt[kWarps], warp_eq[kWarps];
  if (keep && keep[sel[blockIdx.x]]) return;
  const ListDesc L = lists[sel[blockIdx.x]];
  int32_t* const state = topk_commit_target(commit, L, keep, sel[blockIdx.x], threadIdx.x == 0);
  const int32_t n = L.elig_end - L.elig_begin, k = L.k;
  const float* __restrict__ s = scores + L.score_begin;
  const int32_t* table = block_pages + L.table_begin;
  uint16_t* hi16 = reinterpret_cast<uint16_t*>(staged_mem);
  int32_t* cand = reinterpret_cast<int32_t*>(hi16 + slots);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  auto block_barrier = [] { __syncthreads(); };
  auto own = [](int* p, int) -> const int* { return p; };
  auto key_at = [s](int32_t i) { return order_key(s[i]); };

  bool staged = k < n;  // k >= n keeps every key: topk_radix.cuh's take-all path
  if (staged) {
    // 1. Stage the top 16 bits of every key; radix pass 1 (bits 24-31) in the same loop.
    constexpr int kLoads = 8;
    clear_hist(sh);
    if (tid == 0) n_cand = 0;
    __syncthreads();
    for (int32_t i0 = 0; i0 < n; i0 += kThreads * kLoads) {
      float v[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int32_t i = i0 + j * kThreads + tid;
        v[j] = i < n ? s[i] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int32_t i = i0 + j * kThreads + tid;
        if (i >= n) continue;
        const uint32_t key = order_key(v[j]);
        hi16[i] = static_cast<uint16_t>(key >> 16);
        atomicAdd(&sh.hist[(key >> 24) * 32 + lane], 1);
      }
    }
    int remaining = k;
    const int2 d1 = pick_digit(sh, 0, 1, remaining, block_barrier, own);
    remaining -= d1.y;
    // 2. Radix pass 2 (bits 16-23) over the staged keys of pass 1's digit.
    clear_hist(sh);
    __syncthreads();
    for (int32_t i = tid * 8; i < n; i += kThreads * 8) {
      uint32_t valid;
      const uint4 h8 = staged8(hi16, i, n, &valid);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t h = half_of(h8, j);
        if ((valid >> j & 1u) && (h >> 8) == static_cast<uint32_t>(d1.x))
          atomicAdd(&sh.hist[(h & 255u) * 32 + lane], 1);
      }
    }
    const int2 d2 = pick_digit(sh, 1, 1, remaining, block_barrier, own);
    remaining -= d2.y;
    const uint32_t t_hi = static_cast<uint32_t>(d1.x) << 8 | static_cast<uint32_t>(d2.x);
    // 3. Collect the candidates (top 16 bits == T's), a warp-aggregated slot count.
    for (int32_t i = tid * 8; i - tid * 8 < n; i += kThreads * 8) {
      uint32_t valid;
      const uint4 h8 = staged8(hi16, i, n, &valid);
      uint32_t match = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if ((valid >> j & 1u) && half_of(h8, j) == t_hi) match |= 1u << j;
      const int c = __popc(match);
      const int incl = warp_inclusive_sum(c, lane);
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      int base = 0;
      if (lane == 31 && total > 0) base = atomicAdd(&n_cand, total);
      base = __shfl_sync(0xffffffffu, base, 31) + incl - c;
      for (int j = 0; j < 8; ++j)
        if (match >> j & 1u) {
          if (base < kCandidates) cand[base] = i + j;
          ++base;
        }
    }
    __syncthreads();
    const int nc = n_cand;
    staged = nc <= kCandidates;
    if (staged) {
      // Passes 3 and 4 (bits 8-15, 0-7) on the candidates' full keys.
      uint32_t ck[kCandPerThread];
#pragma unroll
      for (int j = 0; j < kCandPerThread; ++j) {
        const int c = j * kThreads + tid;
        ck[j] = c < nc ? key_at(cand[c]) : 0u;
      }
      clear_hist(sh);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kCandPerThread; ++j)
        if (j * kThreads + tid < nc) atomicAdd(&sh.hist[((ck[j] >> 8) & 255u) * 32 + lane], 1);
      const int2 d3 = pick_digit(sh, 0, 1, remaining, block_barrier, own);
      remaining -= d3.y;
      clear_hist(sh);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kCandPerThread; ++j)
        if (j * kThreads + tid < nc && ((ck[j] >> 8) & 255u) == static_cast<uint32_t>(d3.x))
          atomicAdd(&sh.hist[(ck[j] & 255u) * 32 + lane], 1);
      const int2 d4 = pick_digit(sh, 1, 1, remaining, block_barrier, own);
      remaining -= d4.y;
      const uint32_t T =
          t_hi << 16 | static_cast<uint32_t>(d3.x) << 8 | static_cast<uint32_t>(d4.x);
      const int need_eq = remaining;  // keys == T that belong to the top k, first in index order

      // 4. Ordered compaction: warp w owns [w·R, (w + 1)·R), a lane 8 keys a round.
      const int32_t R = ((n + kWarps - 1) / kWarps + 255) / 256 * 256;
      const int32_t w_lo = warp * R, w_hi = min(n, w_lo + R);
      // Bits j of *gt / *eq: key i + j is above / equal to T.
      auto classify = [&](int32_t i, uint32_t* gt, uint32_t* eq) {
        uint32_t valid;
        const uint4 h8 = staged8(hi16, i, w_hi, &valid);
        *gt = *eq = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (!(valid >> j & 1u)) continue;
          const uint32_t h = half_of(h8, j);
          if (h > t_hi) {
            *gt |= 1u << j;
          } else if (h == t_hi) {
            const uint32_t key = key_at(i + j);
            if (key > T) *gt |= 1u << j;
            if (key == T) *eq |= 1u << j;
          }
        }
      };
      int n_gt = 0, n_eq = 0;
      for (int32_t r0 = w_lo; r0 < w_hi; r0 += 256) {
        uint32_t gt, eq;
        classify(r0 + lane * 8, &gt, &eq);
        n_gt += __popc(gt);
        n_eq += __popc(eq);
      }
      n_gt = warp_inclusive_sum(n_gt, lane);
      n_eq = warp_inclusive_sum(n_eq, lane);
      if (lane == 31) {
        warp_gt[warp] = n_gt;
        warp_eq[warp] = n_eq;
      }
      __syncthreads();
      int gt_before = 0, eq_before = 0;  // keys of the warps before this one
      for (int w = 0; w < warp; ++w) {
        gt_before += warp_gt[w];
        eq_before += warp_eq[w];
      }
      const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
      for (int32_t r0 = w_lo; r0 < w_hi; r0 += 256) {
        uint32_t gt, eq;
        const int32_t i = r0 + lane * 8;
        classify(i, &gt, &eq);
        const int c_gt = __popc(gt), c_eq = __popc(eq);
        const int i_gt = warp_inclusive_sum(c_gt, lane), i_eq = warp_inclusive_sum(c_eq, lane);
        int g = gt_before + i_gt - c_gt, e = eq_before + i_eq - c_eq;
        for (int j = 0; j < 8; ++j) {
          const bool is_gt = gt >> j & 1u, is_eq = eq >> j & 1u;
          if (is_gt || (is_eq && e < need_eq)) {
            const int32_t at = g + min(e, need_eq);
            const int32_t c = L.elig_begin + i + j;
            pages[out0 + at] = table[c];
            chunks[out0 + at] = c;
            if (state) state[at] = c;
          }
          g += is_gt ? 1 : 0;
          e += is_eq ? 1 : 0;
        }
        gt_before += __shfl_sync(0xffffffffu, i_gt, 31);
        eq_before += __shfl_sync(0xffffffffu, i_eq, 31);
      }
    }
    __syncthreads();  // the fallback below reuses sh
  }
  if (!staged)
    radix_topk_slice<kThreads, false>(
        L, 0, n, 0, 1, [s](int32_t i) { return __float_as_uint(s[i]); },
        [](uint32_t bits) { return order_key(__uint_as_float(bits)); }, table, pages, chunks, state,
        sh);
}

}  // namespace

bool topk_staged_fits(int64_t max_scores) {
  return max_scores <= tiles::kTopkStagedMaxKeys;
}

cudaError_t prepare_topk_staged(int64_t max_scores) {
  if (!topk_staged_fits(max_scores)) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(topk_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(staged_smem_bytes(tiles::kTopkStagedMaxKeys)));
}

cudaError_t launch_topk_staged(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                               int64_t max_scores, const float* scores, const int32_t* block_pages,
                               int32_t* pages, int32_t* chunks, const int32_t* keep,
                               const TopkCommit& commit, cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  if (!topk_staged_fits(max_scores)) return cudaErrorInvalidValue;
  return launch_dependent(topk_staged_kernel, static_cast<unsigned>(num_sel), kThreads,
                          staged_smem_bytes(max_scores), stream, lists, sel_lists, scores,
                          block_pages, pages, chunks, keep, commit,
                          static_cast<int32_t>(staged_slots(max_scores)));
}

}  // namespace cisa::cuda::detail
