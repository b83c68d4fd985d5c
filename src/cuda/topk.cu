// Radix select + ordered compaction; each list is handled by a cluster of kTopkCluster blocks.
//
// Scores map to 32-bit keys whose unsigned order is the spec's order of values (NaN → 0, the
// lowest; −0 and +0 share one key, as they compare equal). Four 8-bit passes find the k-th
// largest key T and how many keys equal to T belong to the top k (need_eq). A final pass in
// index order keeps every key > T and the first need_eq keys == T: that is exactly "ties to the
// smaller index", and the kept indices come out ascending.
//
// Work split (v3, few lists): block r of a list's cluster owns the contiguous slice [r·n/C,
// (r+1)·n/C) of its scores. Each radix pass counts the slice into a block histogram; after a
// cluster barrier every block sums the C histograms through distributed shared memory and picks the
// same digit. For the compaction every block publishes its counts of keys > T and == T; a block's
// output offset is the number of keys taken by the slices before it (the first need_eq equal keys
// in index order are taken, so slice r' takes min(n_eq(r'), need_eq − equal keys before r')). v1/v2
// ran one 1024-thread block per list: 0.072 ms for the 16 lists of a decode step, 16 SMs busy and 5
// dependent sweeps of 65 K scores each. With many lists (prefill) the GPU is full anyway and the
// cluster barriers only cost (v3 measured top-k 1.7x slower at 2,048 lists), so there each list
// keeps one 1024-thread block.
//
// Histograms are lane-private (bin b of lane j at hist[b·32 + j]): scores of similar magnitude
// share their top key byte, so one shared counter per bin would serialise most atomics of the
// first pass on 2–4 addresses. Lane-private counters put a warp's 32 lanes on distinct banks.
#include <cooperative_groups.h>

#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "tile_sizes.cuh"
#include "topk.cuh"

namespace cisa::cuda::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kItems = 8;  // consecutive scores per thread in the compaction pass
constexpr int kLoads = 8;  // independent score loads per thread before the histogram atomics

__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// kCluster blocks of kThreads per list (kCluster = 1: one block, no cluster barriers).
template <int kCluster, int kThreads>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    topk_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                const float* __restrict__ scores, const int32_t* __restrict__ block_pages,
                int32_t* __restrict__ pages, int32_t* __restrict__ chunks) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256 * 32];
  __shared__ int slice_hist[2][256];  // this block's histogram, double-buffered across passes
  __shared__ int slice_count[2];      // keys > T and keys == T in this block's slice
  __shared__ int pick_digit, pick_above;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const ListDesc L = lists[sel[blockIdx.x / kCluster]];
  const int32_t n = L.elig_end - L.elig_begin;
  const int32_t k = L.k;
  const float* s = scores + L.score_begin;
  const int32_t* table = block_pages + L.table_begin;
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
  const int tid = threadIdx.x, lane = tid % 32;
  const auto lo = static_cast<int32_t>(static_cast<int64_t>(n) * rank / kCluster);
  const auto hi = static_cast<int32_t>(static_cast<int64_t>(n) * (rank + 1) / kCluster);

  uint32_t prefix = 0, mask = 0;
  int remaining = k;  // how many of the top k are still to be found among keys matching prefix
  const bool take_all = k >= n;
  if (!take_all) {
    int buf = 0;
    for (int shift = 24; shift >= 0; shift -= 8, buf ^= 1) {
      for (int i = tid; i < 256 * 32; i += kThreads) hist[i] = 0;
      __syncthreads();
      for (int32_t i0 = lo; i0 < hi; i0 += kThreads * kLoads) {
        float f[kLoads];
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int32_t i = i0 + j * kThreads + tid;
          f[j] = i < hi ? s[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const uint32_t key = order_key(f[j]);
          if (i0 + j * kThreads + tid < hi && (key & mask) == prefix)
            atomicAdd(&hist[((key >> shift) & 255u) * 32 + lane], 1);
        }
      }
      __syncthreads();
      // Thread t sums the 32 lane copies of digit t, starting at copy t mod 32 so that a warp's
      // reads hit 32 distinct banks.
      if (tid < 256) {
        int c = 0;
        for (int j = 0; j < 32; ++j) c += hist[tid * 32 + ((j + tid) & 31)];
        slice_hist[buf][tid] = c;
      }
      // Every block's slice histogram is complete. (A block writes slice_hist[buf] again two
      // passes later, after the next barrier, which no block passes before it has finished
      // reading this pass's histograms.)
      if constexpr (kCluster > 1)
        cluster.sync();
      else
        __syncthreads();
      // Suffix sums over digits (thread t holds digit 255 − t): the chosen digit d is the one
      // where the count of keys with digit ≥ d first reaches `remaining`.
      int v = 0;
      if (tid < 256)
        for (int r = 0; r < kCluster; ++r)
          v += kCluster > 1 ? cluster.map_shared_rank(&slice_hist[buf][0], r)[255 - tid]
                            : slice_hist[buf][255 - tid];
      int incl;
      Scan(scan_tmp).InclusiveSum(v, incl);
      if (tid < 256 && incl >= remaining && incl - v < remaining) {
        pick_digit = 255 - tid;
        pick_above = incl - v;
      }
      __syncthreads();
      remaining -= pick_above;
      prefix |= static_cast<uint32_t>(pick_digit) << shift;
      mask |= 255u << shift;
      __syncthreads();  // scan_tmp and pick_* are reused by the next pass
    }
  }
  const uint32_t T = prefix;
  const int need_eq = remaining;

  // Counts of this slice, then the offsets implied by the slices before it.
  int n_gt = 0, n_eq_slice = 0;
  if (kCluster > 1 && !take_all) {
    for (int32_t i = lo + tid; i < hi; i += kThreads) {
      const uint32_t key = order_key(s[i]);
      n_gt += key > T ? 1 : 0;
      n_eq_slice += key == T ? 1 : 0;
    }
  }
  int base = 0, eq_base = 0;
  if constexpr (kCluster > 1) {
    if (tid == 0) slice_count[0] = slice_count[1] = 0;
    __syncthreads();
    if (n_gt) atomicAdd(&slice_count[0], n_gt);
    if (n_eq_slice) atomicAdd(&slice_count[1], n_eq_slice);
    cluster.sync();
    if (take_all) {
      base = lo;
    } else {
      for (int r = 0; r < rank; ++r) {
        const int* c = cluster.map_shared_rank(&slice_count[0], r);
        const int gt = c[0], eq = c[1];
        base += gt + min(eq, max(0, need_eq - eq_base));
        eq_base += eq;
      }
    }
    cluster.sync();  // no block leaves (freeing its shared memory) while another still reads it
  }

  for (int32_t i0 = lo; i0 < hi; i0 += kThreads * kItems) {
    const int32_t first = i0 + tid * kItems;
    uint32_t key[kItems];
    int n_eq = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      key[j] = first + j < hi ? order_key(s[first + j]) : 0u;
      n_eq += (first + j < hi && key[j] == T) ? 1 : 0;
    }
    int eq_rank, eq_total;
    Scan(scan_tmp).ExclusiveSum(n_eq, eq_rank, eq_total);
    __syncthreads();
    bool take[kItems];
    int n_take = 0, r = eq_base + eq_rank;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const bool valid = first + j < hi;
      const bool eq = valid && key[j] == T;
      take[j] = valid && (take_all || key[j] > T || (eq && r < need_eq));
      r += eq ? 1 : 0;
      n_take += take[j] ? 1 : 0;
    }
    int pos, total;
    Scan(scan_tmp).ExclusiveSum(n_take, pos, total);
    __syncthreads();
    pos += base;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (!take[j]) continue;
      const int32_t c = L.elig_begin + first + j;
      pages[out0 + pos] = table[c];
      chunks[out0 + pos] = c;
      ++pos;
    }
    base += total;
    eq_base += eq_total;
  }
}

}  // namespace

cudaError_t launch_topk(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                        int64_t max_scores, int64_t cluster_min_scores, const float* scores,
                        const int32_t* block_pages, int32_t* pages, int32_t* chunks,
                        cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  constexpr int C = tiles::kTopkCluster;
  if (num_sel <= tiles::kTopkClusterMaxLists && max_scores >= cluster_min_scores)
    topk_kernel<C, tiles::kTopkClusterThreads>
        <<<static_cast<unsigned>(num_sel * C), tiles::kTopkClusterThreads, 0, stream>>>(
            lists, sel_lists, scores, block_pages, pages, chunks);
  else
    topk_kernel<1, tiles::kTopkThreads>
        <<<static_cast<unsigned>(num_sel), tiles::kTopkThreads, 0, stream>>>(
            lists, sel_lists, scores, block_pages, pages, chunks);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
