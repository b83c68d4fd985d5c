// Radix select + ordered compaction, one block per list.
//
// Scores map to 32-bit keys whose unsigned order is the spec's order of values (NaN → 0, the
// lowest; −0 and +0 share one key, as they compare equal). Four 8-bit passes find the k-th
// largest key T and how many keys equal to T belong to the top k (need_eq). A final pass in
// index order keeps every key > T and the first need_eq keys == T: that is exactly "ties to the
// smaller index", and the kept indices come out ascending.
//
// Histograms are lane-private (bin b of lane j at hist[b·32 + j]): scores of similar magnitude
// share their top key byte, so with one shared histogram v1's first pass serialised ~65 K
// atomics on 2–4 addresses (decode top-k 0.069 ms for 16 lists). Lane-private counters put the
// 32 lanes of a warp on 32 distinct banks and addresses; the 32 copies are summed afterwards.
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "tile_sizes.cuh"
#include "topk.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kThreads = tiles::kTopkThreads;
constexpr int kItems = 8;  // consecutive scores per thread in the compaction pass
constexpr int kLoads = 8;  // independent score loads per thread before the histogram atomics

__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kThreads)
topk_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
            const float* __restrict__ scores, const int32_t* __restrict__ block_pages,
            int32_t* __restrict__ pages, int32_t* __restrict__ chunks) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256 * 32];
  __shared__ int pick_digit, pick_above;
  const ListDesc L = lists[sel[blockIdx.x]];
  const int32_t n = L.elig_end - L.elig_begin;
  const int32_t k = L.k;
  const float* s = scores + L.score_begin;
  const int32_t* table = block_pages + L.table_begin;
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
  const int tid = threadIdx.x, lane = tid % 32;

  uint32_t prefix = 0, mask = 0;
  int remaining = k;  // how many of the top k are still to be found among keys matching prefix
  bool take_all = k >= n;
  if (!take_all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256 * 32; i += kThreads) hist[i] = 0;
      __syncthreads();
      for (int32_t i0 = 0; i0 < n; i0 += kThreads * kLoads) {
        float f[kLoads];
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int32_t i = i0 + j * kThreads + tid;
          f[j] = i < n ? s[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const uint32_t key = order_key(f[j]);
          if (i0 + j * kThreads + tid < n && (key & mask) == prefix)
            atomicAdd(&hist[((key >> shift) & 255u) * 32 + lane], 1);
        }
      }
      __syncthreads();
      // Suffix sums over digits (thread t holds digit 255 − t): the chosen digit d is the one
      // where the count of keys with digit ≥ d first reaches `remaining`. Thread t starts its
      // sum of the 32 lane copies at copy t mod 32, so a warp's reads hit 32 distinct banks.
      int v = 0;
      if (tid < 256)
        for (int j = 0; j < 32; ++j) v += hist[(255 - tid) * 32 + ((j + tid) & 31)];
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

  int base = 0, eq_base = 0;
  for (int32_t i0 = 0; i0 < n; i0 += kThreads * kItems) {
    const int32_t first = i0 + tid * kItems;
    uint32_t key[kItems];
    int n_eq = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      key[j] = first + j < n ? order_key(s[first + j]) : 0u;
      n_eq += (first + j < n && key[j] == T) ? 1 : 0;
    }
    int eq_rank, eq_total;
    Scan(scan_tmp).ExclusiveSum(n_eq, eq_rank, eq_total);
    __syncthreads();
    bool take[kItems];
    int n_take = 0, r = eq_base + eq_rank;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const bool valid = first + j < n;
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
                        const float* scores, const int32_t* block_pages, int32_t* pages,
                        int32_t* chunks, cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  topk_kernel<<<static_cast<unsigned>(num_sel), kThreads, 0, stream>>>(lists, sel_lists, scores, block_pages,
                                                                     pages, chunks);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
