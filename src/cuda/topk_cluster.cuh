// The radix select of a decode list by a cluster of blocks whose slices of the list's keys sit in
// registers (topk.cu's cluster kernel). The same select as topk_radix.cuh's — four 8-bit passes
// find the k-th largest order key T and how many keys equal to T are kept, and the kept keys are
// written in index order — with the cluster's exchanges pushed, not pulled, and awaited on
// transaction barriers instead of cluster barriers:
//
// - A pass's histogram: each block stores its slice's 256 bin counts into its own slot of every
//   block's shared memory (st.async, counted in bytes by the receiver's mbarrier of that pass
//   parity); each block waits for its 8 KB, sums the slots and finds the digit. v8 added the
//   counts into remote totals and waited at a cluster barrier, whose release took a GPU-wide
//   memory barrier (MEMBAR.ALL.GPU, ERRBAR: 19 % of the warps' samples in ncu). v3-v6 had every
//   block read the slice histograms of all blocks after a cluster barrier, then run a block scan
//   and three more block barriers.
// - The digit: every warp scans the 256 totals itself (8 bins a lane, one warp suffix scan).
// - The lane-private histograms and the slots are double-buffered across passes: a pass clears
//   the histogram the next pass counts into, and a block can only store into a slot of parity b
//   for pass p + 2 after it has received this block's counts of pass p + 1, which this block
//   sends after it has summed the slot for pass p.
// - The slice counts of the compaction: each block stores its counts of keys > T and == T in the
//   blocks ranked after it (another mbarrier), scans its own rows while they travel, and no block
//   reads another's shared memory.
//
// One cluster barrier remains, at the start (all blocks running, the mbarriers initialised); its
// arrival comes before the key loads, so it completes while they are in flight.
#pragma once

#include <cub/block/block_scan.cuh>

#include "mbarrier.cuh"
#include "plan_types.h"
#include "topk_radix.cuh"

namespace cisa::cuda::detail {

// The most keys per thread cluster_select holds in registers (kCache).
constexpr int kMaxCachedKeys = 16;

namespace cluster_dsm {

// The shared::cluster address of `p` (this block's shared memory) in the block of rank r.
__device__ __forceinline__ uint32_t addr_in(const void* p, int r) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(dev::smem_addr(p)), "r"(r));
  return remote;
}

// Stores to another block's shared memory (addr), counted in bytes by that block's mbarrier
// (bar, also a shared::cluster address).
__device__ __forceinline__ void store_async(uint32_t addr, int v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.s32 [%0], %1, [%2];" ::"r"(addr),
      "r"(v), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void store_async2(uint32_t addr, int a, int b, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.s32 [%0], {%1, %2}, [%3];" ::"r"(
          addr),
      "r"(a), "r"(b), "r"(bar)
      : "memory");
}

// The two halves of a cluster barrier: arrive publishes this thread's earlier writes (release),
// wait returns once every thread of the cluster has arrived and makes theirs visible (acquire).
__device__ __forceinline__ void arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace cluster_dsm

template <int kThreads, int kCluster>
struct ClusterTopkShared {
  int hist[2][256 * 32];            // lane-private counts (bin b of lane j at [b·32 + j])
  int slot[2][kCluster][256];       // each block's slice histogram of a pass, per pass parity
  alignas(16) int totals[256];      // the cluster's counts of the current pass
  int2 counts[kCluster];            // (keys > T, keys == T) of the slices ranked before this one
  alignas(8) uint64_t pass_bar[2];  // the slots' transaction barriers, per pass parity
  alignas(8) uint64_t counts_bar;   // counts' transaction barrier
  int slice_gt, slice_eq;
  // Per (key row, warp): the counts of keys == T (high 16 bits) and > T (low 16 bits), then
  // their exclusive prefix in index order.
  int row_counts[kMaxCachedKeys * (kThreads / 32)];
  typename cub::BlockScan<int, kThreads>::TempStorage scan_tmp;
};

// The digit d of a pass from the cluster's 256 bin totals: the one where the count of keys with
// digit >= d first reaches `remaining`; also the count of keys with a larger digit. Computed by
// every warp alike (lane l holds digits 8l..8l+7), so no barrier follows it.
__device__ __forceinline__ int2 pick_from_totals(const int* __restrict__ totals, int remaining) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int4 a = reinterpret_cast<const int4*>(totals)[lane * 2];
  const int4 b = reinterpret_cast<const int4*>(totals)[lane * 2 + 1];
  const int bins[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  int own = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) own += bins[j];
  int incl = own;  // keys with digit >= 8·lane
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int v = __shfl_down_sync(0xffffffffu, incl, off);
    if (lane + off < 32) incl += v;
  }
  // Lanes whose digits reach `remaining` form a prefix 0..L; the digit lies in lane L's eight.
  const uint32_t reach = __ballot_sync(0xffffffffu, incl >= remaining);
  const int L = 31 - __clz(static_cast<int>(reach));
  int digit = 0, above = 0;
  if (lane == L) {
    int acc = incl - own;  // keys with digit >= 8·(L + 1)
#pragma unroll
    for (int j = 7; j >= 0; --j) {
      if (acc + bins[j] >= remaining) {
        digit = 8 * L + j;
        above = acc;
        break;
      }
      acc += bins[j];
    }
  }
  return make_int2(__shfl_sync(0xffffffffu, digit, L), __shfl_sync(0xffffffffu, above, L));
}

// Selects list L's top L.k keys by the C = kCluster blocks of a cluster, block `rank` owning
// slice [lo, hi) of its eligible range (indices relative to L.elig_begin) and writing its kept
// keys' page IDs and chunk indices into the list's selected part (and the chunk indices into
// state, where it is not null: the reuse commit, reuse_commit.cuh). Preconditions, uniform across
// the cluster: L.k < the range's length, and every slice holds at most kThreads · kCache keys
// (key j of a thread is lo + j·kThreads + tid). load(i) reads score i. Every thread of every
// block of the cluster calls this.
template <int kThreads, int kCluster, int kCache, class Load>
__device__ __forceinline__ void cluster_select(const ListDesc& L, int32_t lo, int32_t hi, int rank,
                                               Load load, const int32_t* __restrict__ table,
                                               int32_t* __restrict__ pages,
                                               int32_t* __restrict__ chunks,
                                               int32_t* __restrict__ state,
                                               ClusterTopkShared<kThreads, kCluster>& sh) {
  namespace dsm = cluster_dsm;
  constexpr int W = kThreads / 32;
  static_assert(kCache <= kMaxCachedKeys && kCache * W <= kThreads, "one scan entry per row·warp");
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;

  constexpr int kPassBytes = kCluster * 256 * static_cast<int>(sizeof(int));
  if (tid == 0) {
    // One arrival a phase (this thread's, with the bytes it expects).
    dev::mbar_init(&sh.pass_bar[0], 1);
    dev::mbar_init(&sh.pass_bar[1], 1);
    dev::mbar_init(&sh.counts_bar, 1);
    dev::mbar_init_fence();
    // Passes 0 and 1, and the counts of the slices before this one (8 bytes each).
    dev::mbar_arrive_expect_tx(&sh.pass_bar[0], kPassBytes);
    dev::mbar_arrive_expect_tx(&sh.pass_bar[1], kPassBytes);
    dev::mbar_arrive_expect_tx(&sh.counts_bar, rank * static_cast<int>(sizeof(int2)));
    sh.slice_gt = sh.slice_eq = 0;
  }
  for (int i = tid; i < 256 * 32; i += kThreads) sh.hist[0][i] = 0;
  // Every block running and its barriers initialised before any block stores into another; the
  // barrier completes while the keys load.
  dsm::arrive();
  // All of a thread's reads are issued before the first conversion waits for one.
  float v[kCache];
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int32_t i = lo + j * kThreads + tid;
    v[j] = i < hi ? load(i) : 0.0f;
  }
  uint32_t key[kCache];  // entries past the slice hold 0; every use below tests the bound
#pragma unroll
  for (int j = 0; j < kCache; ++j) key[j] = order_key(v[j]);
  dsm::wait();

  uint32_t prefix = 0, mask = 0;
  int remaining = L.k;  // how many of the top k are still to be found among keys matching prefix
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int b = pass & 1, shift = 24 - 8 * pass;
#pragma unroll
    for (int j = 0; j < kCache; ++j)
      if (lo + j * kThreads + tid < hi && (key[j] & mask) == prefix)
        atomicAdd(&sh.hist[b][((key[j] >> shift) & 255u) * 32 + lane], 1);
    // The next pass's lane-private counts: last summed before this block's previous wait.
    for (int i = tid; i < 256 * 32; i += kThreads) sh.hist[b ^ 1][i] = 0;
    __syncthreads();  // every count of this pass is in hist[b]
    if (tid < 256) {
      int c = 0;
      for (int j = 0; j < 32; ++j) c += sh.hist[b][tid * 32 + ((j + tid) & 31)];
      for (int r = 0; r < kCluster; ++r)
        dsm::store_async(dsm::addr_in(&sh.slot[b][rank][tid], r), c,
                         dsm::addr_in(&sh.pass_bar[b], r));
    }
    dev::mbar_wait<true>(&sh.pass_bar[b], static_cast<uint32_t>(pass >> 1) & 1u);
    if (tid == 0 && pass + 2 < 4) dev::mbar_arrive_expect_tx(&sh.pass_bar[b], kPassBytes);
    if (tid < 256) {
      int t = 0;
#pragma unroll
      for (int r = 0; r < kCluster; ++r) t += sh.slot[b][r][tid];
      sh.totals[tid] = t;
    }
    __syncthreads();  // (the warps' picks of the previous pass read totals before the first)
    const int2 picked = pick_from_totals(sh.totals, remaining);
    remaining -= picked.y;
    prefix |= static_cast<uint32_t>(picked.x) << shift;
    mask |= 255u << shift;
  }
  const uint32_t T = prefix;
  const int need_eq = remaining;  // keys == T the list keeps, the first in index order

  // This slice's kept candidates: their page IDs (read now, so that the reads overlap the
  // exchange below) and per (row, warp) counts; the slice's totals.
  int32_t page[kCache];
  int warp_gt = 0, warp_eq = 0;
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int32_t i = lo + j * kThreads + tid;
    const bool valid = i < hi, gt = valid && key[j] > T, eq = valid && key[j] == T;
    page[j] = gt || eq ? table[L.elig_begin + i] : 0;
    const int n_gt = __popc(__ballot_sync(0xffffffffu, gt));
    const int n_eq = __popc(__ballot_sync(0xffffffffu, eq));
    if (lane == 0) sh.row_counts[j * W + warp] = n_eq << 16 | n_gt;
    warp_gt += n_gt;
    warp_eq += n_eq;
  }
  if (lane == 0) {
    if (warp_gt) atomicAdd(&sh.slice_gt, warp_gt);
    if (warp_eq) atomicAdd(&sh.slice_eq, warp_eq);
  }
  __syncthreads();
  // The slice's counts go to every block ranked after this one (kept keys are taken in index
  // order, and slices are in rank order).
  if (tid > rank && tid < kCluster)
    dsm::store_async2(dsm::addr_in(&sh.counts[rank], tid), sh.slice_gt, sh.slice_eq,
                      dsm::addr_in(&sh.counts_bar, tid));
  // The rows' offsets within the slice while the counts travel. At most kThreads · kCache ≤ 2^14
  // keys a slice: both counts fit their 16 bits.
  int row_prefix;
  cub::BlockScan<int, kThreads>(sh.scan_tmp)
      .ExclusiveSum(tid < kCache * W ? sh.row_counts[tid] : 0, row_prefix);
  __syncthreads();
  if (tid < kCache * W) sh.row_counts[tid] = row_prefix;
  __syncthreads();
  dev::mbar_wait<true>(&sh.counts_bar, 0);
  int base = 0, eq_base = 0;  // keys taken, and keys == T seen, in the slices before this one
  for (int r = 0; r < rank; ++r) {
    const int2 c = sh.counts[r];
    base += c.x + min(c.y, max(0, need_eq - eq_base));
    eq_base += c.y;
  }
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
  const int avail = max(0, need_eq - eq_base);  // keys == T this slice may still take
  const uint32_t before = (1u << lane) - 1u;    // the lanes before this one
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int32_t i = lo + j * kThreads + tid;
    const bool valid = i < hi, gt = valid && key[j] > T, eq = valid && key[j] == T;
    const uint32_t gt_mask = __ballot_sync(0xffffffffu, gt);
    const uint32_t eq_mask = __ballot_sync(0xffffffffu, eq);
    const int pre = sh.row_counts[j * W + warp];
    const int gt_before = (pre & 0xffff) + __popc(gt_mask & before);
    const int eq_before = (pre >> 16) + __popc(eq_mask & before);
    if (gt || (eq && eq_before < avail)) {
      const int32_t at = base + gt_before + min(eq_before, avail);
      pages[out0 + at] = page[j];
      chunks[out0 + at] = L.elig_begin + i;
      if (state) state[at] = L.elig_begin + i;
    }
  }
}

}  // namespace cisa::cuda::detail
