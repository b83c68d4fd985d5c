// The radix select + ordered compaction of one list's slice, shared by the top-k kernels (topk.cu,
// and topk_staged.cu's fallback: scores read from global memory) and the fused decode selection
// (select_fused.cu, keys kept in shared memory by the block that scored them). topk_staged.cu
// also runs its passes' digit choice (pick_digit).
//
// Scores map to 32-bit keys whose unsigned order is the spec's order of values (NaN → 0, the
// lowest; −0 and +0 share one key, as they compare equal). Four 8-bit passes find the k-th
// largest key T and how many keys equal to T belong to the top k (need_eq). A final pass in
// index order keeps every key > T and the first need_eq keys == T: that is exactly "ties to the
// smaller index", and the kept indices come out ascending.
//
// Work split: block r of a list's C blocks (a thread block cluster, or C = 1) owns the contiguous
// slice [lo, hi) of its scores. Each radix pass counts the slice into a block histogram; after a
// cluster barrier every block sums the C histograms through distributed shared memory and picks
// the same digit. For the compaction every block publishes its counts of keys > T and == T; a
// block's output offset is the number of keys taken by the slices before it (the first need_eq
// equal keys in index order are taken, so slice r' takes min(n_eq(r'), need_eq − equal keys
// before r')).
//
// Histograms are lane-private (bin b of lane j at hist[b·32 + j]): scores of similar magnitude
// share their top key byte, so one shared counter per bin would serialise most atomics of the
// first pass on 2–4 addresses. Lane-private counters put a warp's 32 lanes on distinct banks.
#pragma once

#include <cooperative_groups.h>

#include <cub/block/block_scan.cuh>

#include "plan_types.h"

namespace cisa::cuda::detail {

__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The shared memory of radix_topk_slice (declared __shared__ by the kernel).
template <int kThreads>
struct TopkShared {
  typename cub::BlockScan<int, kThreads>::TempStorage scan_tmp;
  int hist[256 * 32];
  int slice_hist[2][256];  // this block's histogram, double-buffered across passes
  int slice_count[2];      // keys > T and keys == T in this block's slice
  int pick_digit, pick_above;
};

// Zeroes the lane-private histogram (every thread of the block calls this; a barrier follows
// before the first count).
template <int kThreads>
__device__ __forceinline__ void clear_hist(TopkShared<kThreads>& sh) {
  for (int i = threadIdx.x; i < 256 * 32; i += kThreads) sh.hist[i] = 0;
}

// The digit of one radix pass, once every thread has counted its keys into sh.hist: the 32 lane
// copies of each bin are summed into slice_hist[buf] (thread t sums digit t, starting at copy
// t mod 32 so that a warp's reads hit 32 distinct banks); after `barrier` (a cluster barrier when
// C > 1) the C blocks' slice histograms are summed through `remote`; the digit d is the one where
// the count of keys with digit >= d first reaches `remaining`. Returns d (x) and the count of keys
// with a larger digit (y), the same in every thread. (A block writes slice_hist[buf] again two
// passes later, after the next barrier, which no block passes before it has finished reading
// this pass's histograms.)
template <int kThreads, class Barrier, class Remote>
__device__ __forceinline__ int2 pick_digit(TopkShared<kThreads>& sh, int buf, int C, int remaining,
                                           Barrier barrier, Remote remote) {
  const int tid = threadIdx.x;
  __syncthreads();  // every count of this pass is in sh.hist
  if (tid < 256) {
    int c = 0;
    for (int j = 0; j < 32; ++j) c += sh.hist[tid * 32 + ((j + tid) & 31)];
    sh.slice_hist[buf][tid] = c;
  }
  barrier();
  // Suffix sums over digits (thread t holds digit 255 - t).
  int v = 0;
  if (tid < 256)
    for (int r = 0; r < C; ++r) v += remote(&sh.slice_hist[buf][0], r)[255 - tid];
  int incl;
  cub::BlockScan<int, kThreads>(sh.scan_tmp).InclusiveSum(v, incl);
  if (tid < 256 && incl >= remaining && incl - v < remaining) {
    sh.pick_digit = 255 - tid;
    sh.pick_above = incl - v;
  }
  __syncthreads();
  const int2 picked = make_int2(sh.pick_digit, sh.pick_above);
  __syncthreads();  // scan_tmp and pick_* are reused by the next pass
  return picked;
}

// Radix select over the list's keys, then the ordered compaction of this block's slice
// [lo, hi) (indices relative to L.elig_begin) into the list's selected part. The order key of
// score i (i in [lo, hi)) is to_key(load(i)): load reads the 32 bits behind it, to_key converts
// them; both are called again in every pass and must give the same key each time. They are two
// calls so that a pass issues its kLoads reads before it converts any (a read followed by its
// conversion under the bounds check made each read wait for the one before: top-k at 2 x 1M
// took 37 instead of 25 µs per layer). kClustered: the C blocks of the list form a cluster
// (C = 1 needs no barrier between blocks). state: null, or where entry i of the selected part
// is also stored (the reuse commit, reuse_commit.cuh). Every thread of the block calls this. (A
// cluster whose slices fit its registers selects by topk_cluster.cuh instead.)
template <int kThreads, bool kClustered, class Load, class ToKey>
__device__ __forceinline__ void radix_topk_slice(
    const ListDesc& L, int32_t lo, int32_t hi, int rank, int C, Load load, ToKey to_key,
    const int32_t* __restrict__ table, int32_t* __restrict__ pages, int32_t* __restrict__ chunks,
    int32_t* __restrict__ state, TopkShared<kThreads>& sh) {
  namespace cg = cooperative_groups;
  using Scan = cub::BlockScan<int, kThreads>;
  constexpr int kItems = 8;  // consecutive scores per thread in the compaction pass
  constexpr int kLoads = 8;  // independent key reads per thread before the histogram atomics
  const int32_t n = L.elig_end - L.elig_begin;
  const int32_t k = L.k;
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
  const int tid = threadIdx.x, lane = tid % 32;
  auto barrier = [] {
    if constexpr (kClustered)
      cg::this_cluster().sync();
    else
      __syncthreads();
  };
  auto remote = [](int* p, int r) -> const int* {
    if constexpr (kClustered)
      return cg::this_cluster().map_shared_rank(p, r);
    else
      return p;
  };

  uint32_t prefix = 0, mask = 0;
  int remaining = k;  // how many of the top k are still to be found among keys matching prefix
  const bool take_all = k >= n;
  if (!take_all) {
    int buf = 0;
    for (int shift = 24; shift >= 0; shift -= 8, buf ^= 1) {
      clear_hist(sh);
      __syncthreads();
      for (int32_t i0 = lo; i0 < hi; i0 += kThreads * kLoads) {
        uint32_t raw[kLoads];
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int32_t i = i0 + j * kThreads + tid;
          raw[j] = i < hi ? load(i) : 0u;
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const uint32_t key = to_key(raw[j]);
          if (i0 + j * kThreads + tid < hi && (key & mask) == prefix)
            atomicAdd(&sh.hist[((key >> shift) & 255u) * 32 + lane], 1);
        }
      }
      const int2 picked = pick_digit(sh, buf, C, remaining, barrier, remote);
      remaining -= picked.y;
      prefix |= static_cast<uint32_t>(picked.x) << shift;
      mask |= 255u << shift;
    }
  }
  const uint32_t T = prefix;
  const int need_eq = remaining;

  // Counts of this slice, then the offsets implied by the slices before it.
  int base = 0, eq_base = 0;
  if (C > 1) {
    int n_gt = 0, n_eq_slice = 0;
    if (!take_all) {
      for (int32_t i = lo + tid; i < hi; i += kThreads) {
        const uint32_t key = to_key(load(i));
        n_gt += key > T ? 1 : 0;
        n_eq_slice += key == T ? 1 : 0;
      }
    }
    if (tid == 0) sh.slice_count[0] = sh.slice_count[1] = 0;
    __syncthreads();
    if (n_gt) atomicAdd(&sh.slice_count[0], n_gt);
    if (n_eq_slice) atomicAdd(&sh.slice_count[1], n_eq_slice);
    barrier();
    if (take_all) {
      base = lo;
    } else {
      for (int r = 0; r < rank; ++r) {
        const int* c = remote(&sh.slice_count[0], r);
        const int gt = c[0], eq = c[1];
        base += gt + min(eq, max(0, need_eq - eq_base));
        eq_base += eq;
      }
    }
    barrier();  // no block leaves (freeing its shared memory) while another still reads it
  }

  for (int32_t i0 = lo; i0 < hi; i0 += kThreads * kItems) {
    const int32_t first = i0 + tid * kItems;
    uint32_t key[kItems];
    int n_eq = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      key[j] = first + j < hi ? to_key(load(first + j)) : 0u;
      n_eq += (first + j < hi && key[j] == T) ? 1 : 0;
    }
    int eq_rank, eq_total;
    Scan(sh.scan_tmp).ExclusiveSum(n_eq, eq_rank, eq_total);
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
    Scan(sh.scan_tmp).ExclusiveSum(n_take, pos, total);
    __syncthreads();
    pos += base;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (!take[j]) continue;
      const int32_t c = L.elig_begin + first + j;
      pages[out0 + pos] = table[c];
      chunks[out0 + pos] = c;
      if (state) state[pos] = c;
      ++pos;
    }
    base += total;
    eq_base += eq_total;
  }
}

}  // namespace cisa::cuda::detail
