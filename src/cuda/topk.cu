// Top-k per selecting list from a score array: a cluster of kTopkCluster blocks per list (few
// lists: topk_cluster.cuh's select on keys held in registers) or one block per list (many lists,
// or short ones: the radix select of topk_radix.cuh).
//
// v3 (few lists): block r of a list's cluster owns 1/kTopkCluster of its scores. v4: a cluster
// block reads its slice's keys once into registers instead of once per radix pass (2 x 1M
// decode: 25.9 → 20.4 µs per layer, ncu, H200, 2026-12-03). v5: such a slice is compacted from
// the registers, by ballots and one block scan, the kept keys' page IDs read before the scan
// (2 x 1M decode: 20.5 → 16.3 µs per layer, 2026-12-04). v6 (2026-12-06): 64 registers, two
// blocks an SM, so that 16 lists run as one wave of clusters (15 of 8 blocks fit at once at one
// block an SM). v8: the cluster's exchanges pushed into each block's shared memory, one block
// barrier and one cluster barrier a pass. v9: the exchanges by st.async, awaited on transaction
// barriers, with no cluster barrier after the first (topk_cluster.cuh). On an H100, 4:1 x 16
// decode top-k went 0.036 (v5) → 0.026-0.027 (v6) → 0.026 (v8) → 0.024 ms (v9), 32:1 x 32
// 0.050 → 0.041 → 0.038 → 0.034 (bench/results/topk_waves_2026-12-06). v1/v2 ran one
// 1024-thread block per list: 0.072 ms for the 16 lists of a decode step, 16 SMs busy and 5
// dependent sweeps of 65 K scores each. With many lists (prefill) the GPU is full anyway and the
// cluster barriers only cost (v3 measured top-k 1.7x slower at 2,048 lists), so there each list
// keeps one 1024-thread block (or topk_staged.cu's). Decode lists of one (sequence, KV group) each
// may instead be selected by select_fused.cu, which scores and selects in one kernel.

#include <algorithm>

#include "common.cuh"
#include "pdl.cuh"
#include "reuse_commit.cuh"
#include "tile_sizes.cuh"
#include "topk.cuh"
#include "topk_cluster.cuh"
#include "topk_radix.cuh"

namespace cisa::cuda::detail {
namespace {

// The list of this block's cluster and the block's slice [lo, hi) of its scores s (block r of
// kCluster owns the r-th of kCluster near-equal parts).
struct ListSlice {
  ListDesc L;
  int rank;
  int32_t lo, hi;
  const float* s;
};

template <int kCluster>
__device__ __forceinline__ ListSlice list_slice(const ListDesc* __restrict__ lists,
                                                const int32_t* __restrict__ sel,
                                                const float* __restrict__ scores) {
  ListSlice x;
  x.rank = kCluster > 1 ? static_cast<int>(cooperative_groups::this_cluster().block_rank()) : 0;
  x.L = lists[sel[blockIdx.x / kCluster]];
  const int64_t n = x.L.elig_end - x.L.elig_begin;
  x.lo = static_cast<int32_t>(n * x.rank / kCluster);
  x.hi = static_cast<int32_t>(n * (x.rank + 1) / kCluster);
  x.s = scores + x.L.score_begin;
  return x;
}

// One block of kThreads per list.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    topk_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                const float* __restrict__ scores, const int32_t* __restrict__ block_pages,
                int32_t* __restrict__ pages, int32_t* __restrict__ chunks,
                const int32_t* __restrict__ keep, TopkCommit commit) {
  dev::dependent_start();
  __shared__ TopkShared<kThreads> sh;
  const ListSlice x = list_slice<1>(lists, sel, scores);
  // A decode list that keeps its earlier selection (reuse.cuh) got its pages from the decision
  // kernel. (The flag is read after the list's descriptor is asked for, so that the two reads
  // overlap.)
  if (keep && keep[sel[blockIdx.x]]) return;
  int32_t* const state = topk_commit_target(commit, x.L, keep, sel[blockIdx.x], threadIdx.x == 0);
  const float* s = x.s;
  radix_topk_slice<kThreads, false>(
      x.L, x.lo, x.hi, x.rank, 1, [s](int32_t i) { return __float_as_uint(s[i]); },
      [](uint32_t bits) { return order_key(__uint_as_float(bits)); }, block_pages + x.L.table_begin,
      pages, chunks, state, sh);
}

// v9: kCluster blocks of kThreads per list, each holding its slice of the keys in registers
// (kCache a thread) for the passes of topk_cluster.cuh; a list too long for that, or one that
// keeps every key, takes the radix select of topk_radix.cuh from global memory in the same
// cluster. Dynamic shared memory: cluster_topk_smem().
template <int kCluster, int kThreads, int kCache>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads,
                                                                   tiles::kTopkClusterBlocksPerSm)
    topk_cluster_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                        const float* __restrict__ scores, const int32_t* __restrict__ block_pages,
                        int32_t* __restrict__ pages, int32_t* __restrict__ chunks,
                        const int32_t* __restrict__ keep, TopkCommit commit) {
  extern __shared__ __align__(16) unsigned char smem[];
  // The list descriptors are the plan's, uploaded before the step and written by no kernel: they
  // are read before the wait for the scoring kernel, so that a block launched early (pdl.cuh)
  // has them when the scores are ready.
  const ListSlice x = list_slice<kCluster>(lists, sel, scores);
  dev::dependent_start();
  // Every block of a list that keeps its selection leaves before the first cluster barrier.
  if (keep && keep[sel[blockIdx.x / kCluster]]) return;
  // Each block stores the entries it writes; the first block of the list, the slot's ReuseInfo.
  int32_t* const state = topk_commit_target(commit, x.L, keep, sel[blockIdx.x / kCluster],
                                            x.rank == 0 && threadIdx.x == 0);
  const float* s = x.s;
  const int32_t* table = block_pages + x.L.table_begin;
  // Uniform across the cluster: every block's slice holds at most ceil(n / kCluster) keys.
  const int64_t n = x.L.elig_end - x.L.elig_begin;
  if (x.L.k < n && (n + kCluster - 1) / kCluster <= int64_t{kThreads} * kCache)
    cluster_select<kThreads, kCluster, kCache>(
        x.L, x.lo, x.hi, x.rank, [s](int32_t i) { return s[i]; }, table, pages, chunks, state,
        *reinterpret_cast<ClusterTopkShared<kThreads, kCluster>*>(smem));
  else
    radix_topk_slice<kThreads, true>(
        x.L, x.lo, x.hi, x.rank, kCluster, [s](int32_t i) { return __float_as_uint(s[i]); },
        [](uint32_t bits) { return order_key(__uint_as_float(bits)); }, table, pages, chunks, state,
        *reinterpret_cast<TopkShared<kThreads>*>(smem));
}

constexpr size_t cluster_topk_smem() {
  constexpr int C = tiles::kTopkCluster, T = tiles::kTopkClusterThreads;
  return std::max(sizeof(ClusterTopkShared<T, C>), sizeof(TopkShared<T>));
}

}  // namespace

bool topk_register_clusters(int64_t num_sel, int64_t max_scores, int64_t cluster_min_scores) {
  return num_sel <= tiles::kTopkClusterMaxLists && max_scores >= cluster_min_scores;
}

int prepare_topk_clusters() {
  constexpr int C = tiles::kTopkCluster, T = tiles::kTopkClusterThreads, K = tiles::kTopkCachedKeys;
  auto* kernel = topk_cluster_kernel<C, T, K>;
  // The driver sizes the shared-memory carveout for the blocks an SM can hold; asking for the
  // largest one makes sure that the two blocks the register bound allows (~83 KB each) both fit.
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(cluster_topk_smem())) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(C);
  cfg.blockDim = dim3(T);
  cfg.dynamicSmemBytes = cluster_topk_smem();
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

cudaError_t launch_topk(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                        int64_t max_scores, int64_t cluster_min_scores, const float* scores,
                        const int32_t* block_pages, int32_t* pages, int32_t* chunks,
                        const int32_t* keep, const TopkCommit& commit, cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  constexpr int C = tiles::kTopkCluster, T = tiles::kTopkClusterThreads, K = tiles::kTopkCachedKeys;
  if (topk_register_clusters(num_sel, max_scores, cluster_min_scores))
    launch_dependent(topk_cluster_kernel<C, T, K>, static_cast<unsigned>(num_sel * C), T,
                     cluster_topk_smem(), stream, lists, sel_lists, scores, block_pages, pages,
                     chunks, keep, commit);
  else
    launch_dependent(topk_kernel<tiles::kTopkThreads>, static_cast<unsigned>(num_sel),
                     tiles::kTopkThreads, 0, stream, lists, sel_lists, scores, block_pages, pages,
                     chunks, keep, commit);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
