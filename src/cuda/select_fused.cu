// Fused decode selection (select_fused.cuh).
//
// Why: a decode step's selection was two kernels per layer, scoring (the representatives once,
// scores written) and top-k (the scores read again by four radix passes, a count and the
// compaction, each a sweep of global memory between cluster barriers). At 2 x 1M (Qwen2.5-7B
// shape, 8 lists of 65,536 chunks) ncu gave 38 µs of scoring and 25 µs of top-k per layer, for
// 67 MB of representatives (16 µs at the copy bandwidth). Here the block that scores a slice
// keeps its keys in shared memory, so the radix passes never leave the SM, and one launch
// replaces two.
//
// Scoring is score.cu's score_few_kernel arithmetic (bit-identical scores): a chunk's
// representative is read by D/8 lanes, 16 bytes (8 channels) each, U loads in flight per lane,
// q̄ in registers, the D/8 partial sums met by xor shuffles. The slice's physical page IDs are
// first read, coalesced, into the key array, and each is overwritten by its chunk's key once
// scored (the same warp reads and writes an entry, across a __syncwarp).
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "rep_read.cuh"
#include "select_fused.cuh"
#include "topk_radix.cuh"

namespace cisa::cuda::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kMaxCluster = 16;          // the non-portable cluster size limit of sm_90
constexpr int kMaxSliceKeys = 40 << 10;  // 160 KB of keys per block (+ 35 KB of radix state)

template <int D, bool kInt8>
__global__ void __launch_bounds__(kThreads, 1)
    select_fused_kernel(const ScoreStream* __restrict__ streams, const ListDesc* __restrict__ lists,
                        const int32_t* __restrict__ block_pages, const uint8_t* __restrict__ reps,
                        const int8_t* __restrict__ rep_exps, const float* __restrict__ qbar,
                        int num_kv_heads, float inv_sqrt_d, float* __restrict__ scores,
                        int32_t* __restrict__ pages, int32_t* __restrict__ chunks) {
  using RB = dev::RepBytes<kInt8>;
  constexpr int CH = RB::kChan;  // channels per lane
  constexpr int LPC = D / CH;    // lanes per chunk
  constexpr int CPL = 32 / LPC;  // chunks per warp-wide load
  constexpr int U = 16;          // 16-byte loads in flight per lane
  constexpr int WARPS = kThreads / 32;
  constexpr int PER_ROUND = WARPS * U * CPL;
  extern __shared__ uint32_t keys[];  // this block's slice: page IDs, then order keys
  __shared__ TopkShared<kThreads> sh;
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const ScoreStream S = streams[blockIdx.x / C];
  const int64_t li = S.first_list;
  const ListDesc L = lists[li];
  const int32_t n = L.elig_end - L.elig_begin;
  const auto lo = static_cast<int32_t>(static_cast<int64_t>(n) * rank / C);
  const auto hi = static_cast<int32_t>(static_cast<int64_t>(n) * (rank + 1) / C);
  const int cnt = hi - lo;
  const int32_t* table = block_pages + L.table_begin;
  {
    for (int i = threadIdx.x; i < cnt; i += kThreads)
      keys[i] = static_cast<uint32_t>(table[L.elig_begin + lo + i]);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPC, grp = lane / LPC;
    float q[CH];
    {
      const float4* qp = reinterpret_cast<const float4*>(qbar + li * D + sub * CH);
#pragma unroll
      for (int i = 0; i < CH / 4; ++i) {
        const float4 v = qp[i];
        q[4 * i] = v.x, q[4 * i + 1] = v.y, q[4 * i + 2] = v.z, q[4 * i + 3] = v.w;
      }
    }
    float* out = scores + L.score_begin + lo;
    __syncthreads();
    for (int r0 = 0; r0 < cnt; r0 += PER_ROUND) {
      uint4 v[U];
      int ex[U];  // kInt8: each chunk's exponent (read by the lane that writes its score)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = r0 + (warp * U + u) * CPL + grp;
        v[u] = make_uint4(0, 0, 0, 0);
        ex[u] = 0;
        if (c < cnt) {
          const int64_t rep = static_cast<int64_t>(keys[c]) * num_kv_heads + L.kv;
          v[u] = dev::load_rep_streaming(reps + rep * D * RB::kBytes + sub * 16);
          if constexpr (kInt8)
            if (sub == 0) ex[u] = dev::load_exp_resident(rep_exps + rep);
        }
      }
      __syncwarp();  // every lane has read its page IDs before sub 0 overwrites them with keys
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = r0 + (warp * U + u) * CPL + grp;
        float r[CH];
        dev::unpack16<kInt8>(v[u], r);
        float acc = dev::lane_score<false, CH>(q, r, nullptr);
#pragma unroll
        for (int o = LPC / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (sub == 0 && c < cnt) {
          const float s = dev::finish_score<kInt8>(acc, ex + u, 0, inv_sqrt_d);
          out[c] = s;
          keys[c] = order_key(s);
        }
      }
    }
    __syncthreads();
  }
  radix_topk_slice<kThreads, true>(
      L, lo, hi, rank, C, [lo](int32_t i) { return keys[i - lo]; },
      [](uint32_t key) { return key; }, table, pages, chunks, nullptr, sh);  // no reuse here
}

// A launch of `blocks` blocks of kThreads in clusters of `cluster` (cfg.attrs points at attr).
struct ClusterLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t cfg{};
  ClusterLaunch(int64_t blocks, int cluster, size_t smem, cudaStream_t stream) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(cluster);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.gridDim = dim3(static_cast<unsigned>(blocks));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

template <int D>
cudaError_t launch_d(const ScoreStream* streams, int64_t num_streams, int cluster, size_t smem,
                     const ListDesc* lists, const int32_t* block_pages, const RepArgs& reps,
                     const float* qbar, int num_kv_heads, float inv_sqrt_d, float* scores,
                     int32_t* pages, int32_t* chunks, cudaStream_t stream) {
  const ClusterLaunch l(num_streams * cluster, cluster, smem, stream);
  return cudaLaunchKernelEx(
      &l.cfg, reps.int8 ? select_fused_kernel<D, true> : select_fused_kernel<D, false>, streams,
      lists, block_pages, reps.data, reps.exps, qbar, num_kv_heads, inv_sqrt_d, scores, pages,
      chunks);
}

// Opts the kernel of head_dim into the largest slice and non-portable clusters. The attributes
// are the function's, not a launch's: set here before every occupancy query (a few host calls per
// plan, and only for plans that ask for the fused path), they hold for the launches that follow.
template <int D>
cudaError_t prepare_d() {
  cudaError_t err = cudaSuccess;
  for (auto* kernel : {select_fused_kernel<D, false>, select_fused_kernel<D, true>}) {
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kMaxSliceKeys * sizeof(uint32_t)));
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  return err;
}

template <int D>
int max_active_clusters(int cluster, size_t smem) {
  if (prepare_d<D>() != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const ClusterLaunch l(cluster, cluster, smem, nullptr);
  int n = 0;
  // Both element types have the same block shape and slice; the bf16 kernel stands for both.
  if (cudaOccupancyMaxActiveClusters(&n, select_fused_kernel<D, false>, &l.cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

size_t fused_select_smem(int64_t max_span, int cluster) {
  const int64_t slice = (max_span + cluster - 1) / std::max(1, cluster);
  return static_cast<size_t>(std::max<int64_t>(1, slice)) * sizeof(uint32_t);
}

int fused_select_cluster(int64_t num_lists, int64_t max_span, int head_dim, int sms) {
  if (num_lists < 1 || max_span < 1 || (head_dim != 64 && head_dim != 128 && head_dim != 256))
    return 0;
  int c = 1;
  while (c < kMaxCluster && num_lists * 2 * c <= sms) c *= 2;
  for (; c >= 1; c /= 2) {
    if ((max_span + c - 1) / c > kMaxSliceKeys) return 0;
    const size_t smem = fused_select_smem(max_span, c);
    const int active = head_dim == 64    ? max_active_clusters<64>(c, smem)
                       : head_dim == 128 ? max_active_clusters<128>(c, smem)
                                         : max_active_clusters<256>(c, smem);
    if (active > 0) return c;
  }
  return 0;
}

cudaError_t launch_select_fused(const ScoreStream* streams, int64_t num_streams, int cluster,
                                int64_t max_span, const ListDesc* lists, const int32_t* block_pages,
                                const RepArgs& reps, const float* qbar, int num_kv_heads,
                                int head_dim, float* scores, int32_t* pages, int32_t* chunks,
                                cudaStream_t stream) {
  if (num_streams <= 0) return cudaSuccess;
  if (reps.int8 && !reps.exps) return cudaErrorInvalidValue;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t smem = fused_select_smem(max_span, cluster);
  switch (head_dim) {
    case 64:
      return launch_d<64>(streams, num_streams, cluster, smem, lists, block_pages, reps, qbar,
                          num_kv_heads, inv_sqrt_d, scores, pages, chunks, stream);
    case 128:
      return launch_d<128>(streams, num_streams, cluster, smem, lists, block_pages, reps, qbar,
                           num_kv_heads, inv_sqrt_d, scores, pages, chunks, stream);
    case 256:
      return launch_d<256>(streams, num_streams, cluster, smem, lists, block_pages, reps, qbar,
                           num_kv_heads, inv_sqrt_d, scores, pages, chunks, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cisa::cuda::detail
