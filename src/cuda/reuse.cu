// Selection reuse across decode steps: the keep-or-select decision and the state update
// (reuse.cuh says where they run and why the check's scores equal the score kernel's).
#include <cmath>

#include "common.cuh"
#include "index_query.cuh"
#include "pdl.cuh"
#include "reuse.cuh"
#include "topk_radix.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kDecideThreads = 256;

__device__ __forceinline__ bool same_sets(const ReuseInfo& I, const ReuseParams& rp) {
  return I.budget == rp.budget && I.window == rp.window && I.sink_pages == rp.sink_pages;
}

__device__ __forceinline__ int64_t state_slot(const ListDesc& L, const ReuseState& st, int H) {
  return (static_cast<int64_t>(L.reuse_seq) * st.num_layer_slots + st.layer_slot) * H + L.kv;
}

// Scores of the check: chunk c of [0, total) is S[c] for c < k, else nb + (c − k). D/8 lanes
// per chunk, 8 channels per lane (dev::lane_score), then the lanes' partial sums by xor shuffles,
// times 1/√d: score_few_kernel's arithmetic. Returns, in shared memory, the lowest order key of S
// and the highest of N.
template <int D, bool kQuest>
__device__ __forceinline__ void check_keys(
    int kv, const int32_t* __restrict__ S, int32_t k, int32_t nb, int32_t total,
    const int32_t* __restrict__ table, const uint16_t* __restrict__ reps,
    const float* qbar,  // written by this block: no non-coherent loads
    int H, float inv_sqrt_d, uint32_t* lowest_kept, uint32_t* highest_new) {
  constexpr int LPC = D / 8, CPL = 32 / LPC, WARPS = kDecideThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPC, grp = lane / LPC;
  const int rw = kQuest ? 2 * D : D;
  float q[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = qbar[sub * 8 + i];
#pragma unroll 1
  for (int base = warp * CPL; base < total; base += WARPS * CPL) {  // uniform per warp
    const int c = base + grp;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = make_uint4(0, 0, 0, 0);
    if (c < total) {
      const int32_t chunk = c < k ? S[c] : nb + (c - k);
      const uint16_t* r = reps + (static_cast<int64_t>(table[chunk]) * H + kv) * rw + sub * 8;
      lo = *reinterpret_cast<const uint4*>(r);
      if constexpr (kQuest) hi = *reinterpret_cast<const uint4*>(r + D);
    }
    float rl[8], rh[8];
    dev::unpack_bf16x8(lo, rl);
    if constexpr (kQuest) dev::unpack_bf16x8(hi, rh);
    float acc = dev::lane_score<kQuest>(q, rl, rh);
#pragma unroll
    for (int o = LPC / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (sub == 0 && c < total) {
      const uint32_t key = order_key(acc * inv_sqrt_d);
      if (c < k)
        atomicMin(lowest_kept, key);
      else
        atomicMax(highest_new, key);
    }
  }
}

// dst[i] = src[i] (and dst_pages[i] = table[src[i]] when table is given) for i < n, by the whole
// block: kCopyUnroll independent loads per thread before any is used, so a selection of k = 4,096
// chunks takes two rounds of memory latency per block instead of one per 256 entries (a decode
// step runs one block per list: 8 blocks at 2 x 1M, each copying its whole S).
constexpr int kCopyUnroll = 8;
__device__ __forceinline__ void copy_chunks(const int32_t* src, int32_t n,
                                            const int32_t* __restrict__ table, int32_t* dst,
                                            int32_t* dst_pages) {
  for (int32_t i0 = threadIdx.x; i0 < n; i0 += blockDim.x * kCopyUnroll) {
    int32_t c[kCopyUnroll], p[kCopyUnroll] = {};
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int32_t i = i0 + u * static_cast<int32_t>(blockDim.x);
      c[u] = i < n ? src[i] : 0;
    }
    if (table) {
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int32_t i = i0 + u * static_cast<int32_t>(blockDim.x);
        p[u] = i < n ? table[c[u]] : 0;
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int32_t i = i0 + u * static_cast<int32_t>(blockDim.x);
      if (i >= n) break;
      dst[i] = c[u];
      if (table) dst_pages[i] = p[u];
    }
  }
}

template <int D, bool kQuest>
__global__ void __launch_bounds__(kDecideThreads)
    reuse_decide_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                        const int32_t* __restrict__ block_pages, const uint16_t* __restrict__ reps,
                        const float* __restrict__ index_q, float* __restrict__ qbar,
                        uint16_t* __restrict__ qsplit, int H, float inv_sqrt_d, ReuseParams rp,
                        ReuseState st, int32_t* __restrict__ keep, int32_t* __restrict__ pages,
                        int32_t* __restrict__ chunks) {
  dev::dependent_start();
  __shared__ ReuseInfo I;
  __shared__ uint32_t lowest_kept, highest_new;
  const int32_t li = sel[blockIdx.x];
  const ListDesc L = lists[li];
  // The list's index query (the index-query kernel's work, in this launch instead): scoring
  // reads it for lists that select, the check below for kept ones.
  write_index_query(L, li, index_q, H, D, qbar, qsplit);
  if (L.reuse_seq < 0) {
    if (threadIdx.x == 0) keep[li] = 0;
    return;
  }
  const int64_t slot = state_slot(L, st, H);
  const int32_t* S = st.chunks + slot * st.k_stride;
  const int32_t* table = block_pages + L.table_begin;
  if (threadIdx.x == 0) {
    I = st.info[slot];
    lowest_kept = 0xffffffffu;
    highest_new = 0u;
  }
  __syncthreads();  // also makes this block's q̄ visible to all its threads
  const int64_t a = L.first_pos;
  const int32_t k = L.k;
  bool ok = I.selected_at >= 0 && same_sets(I, rp) && k <= st.k_stride;
  if (st.repeat)
    ok = ok && I.last_used == a;
  else
    ok = ok && I.last_used >= I.selected_at && a == I.last_used + 1 &&
         a - I.selected_at < rp.reuse_steps;
  // newly_eligible (plan.h): [c(a0) − W, c(a) − W), from the sinks on.
  const int64_t nb = max(rp.sink_pages, I.selected_at / 16 - rp.window);
  const int64_t ne = max(nb, a / 16 - rp.window);
  const bool checked = ok && !st.repeat && rp.check_new_chunks && ne > nb && k > 0;
  if (checked) {
    check_keys<D, kQuest>(L.kv, S, k, static_cast<int32_t>(nb), k + static_cast<int32_t>(ne - nb),
                          table, reps, qbar + static_cast<int64_t>(li) * D, H, inv_sqrt_d,
                          &lowest_kept, &highest_new);
    __syncthreads();
    ok = !(highest_new > lowest_kept);  // equal keys go to the kept chunk's smaller index
  }
  if (threadIdx.x == 0) {
    keep[li] = ok ? 1 : 0;
    if (!st.repeat) {
      auto* n = reinterpret_cast<unsigned long long*>(st.stats);
      atomicAdd(n + (ok ? 1 : 0), 1ull);  // reused : selected
      if (checked) {
        atomicAdd(n + 2, 1ull);
        if (!ok) atomicAdd(n + 3, 1ull);
      }
      if (ok) st.info[slot].last_used = a;
    }
  }
  if (!ok) return;
  // S as chosen at a0, into the selected part of this row's list (sinks, window and tail are
  // this row's own, written at plan time).
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
  copy_chunks(S, k, table, chunks + out0, pages + out0);
}

// A candidate that selected afresh: S ← the selected part of its list, a0 = last use = its row.
__global__ void reuse_commit_kernel(const ListDesc* __restrict__ lists,
                                    const int32_t* __restrict__ sel, int H, ReuseParams rp,
                                    ReuseState st, const int32_t* __restrict__ keep,
                                    const int32_t* __restrict__ chunks) {
  dev::dependent_start();
  const int32_t li = sel[blockIdx.x];
  const ListDesc L = lists[li];
  if (st.repeat || L.reuse_seq < 0 || keep[li] || L.k > st.k_stride) return;
  const int64_t slot = state_slot(L, st, H);
  int32_t* S = st.chunks + slot * st.k_stride;
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
  copy_chunks(chunks + out0, L.k, nullptr, S, nullptr);
  if (threadIdx.x == 0)
    st.info[slot] = ReuseInfo{L.first_pos, L.first_pos, rp.budget, rp.window, rp.sink_pages};
}

template <int D>
cudaError_t decide_d(const ListDesc* lists, const int32_t* sel, int64_t num_sel,
                     const int32_t* block_pages, const uint16_t* reps, bool quest,
                     const float* index_q, float* qbar, uint16_t* qsplit, int H,
                     const ReuseParams& rp, const ReuseState& st, int32_t* keep, int32_t* pages,
                     int32_t* chunks, cudaStream_t stream) {
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  const auto grid = static_cast<unsigned>(num_sel);
  if (quest)
    return launch_dependent(reuse_decide_kernel<D, true>, grid, kDecideThreads, 0, stream, lists,
                            sel, block_pages, reps, index_q, qbar, qsplit, H, inv_sqrt_d, rp, st,
                            keep, pages, chunks);
  return launch_dependent(reuse_decide_kernel<D, false>, grid, kDecideThreads, 0, stream, lists,
                          sel, block_pages, reps, index_q, qbar, qsplit, H, inv_sqrt_d, rp, st,
                          keep, pages, chunks);
}

}  // namespace

cudaError_t launch_reuse_decide(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                const int32_t* block_pages, const uint16_t* reps, bool quest,
                                const float* index_q, float* qbar, uint16_t* qsplit,
                                int num_kv_heads, int head_dim, const ReuseParams& rp,
                                const ReuseState& st, int32_t* keep, int32_t* pages,
                                int32_t* chunks, cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  switch (head_dim) {
    case 64:
      return decide_d<64>(lists, sel_lists, num_sel, block_pages, reps, quest, index_q, qbar,
                          qsplit, num_kv_heads, rp, st, keep, pages, chunks, stream);
    case 128:
      return decide_d<128>(lists, sel_lists, num_sel, block_pages, reps, quest, index_q, qbar,
                           qsplit, num_kv_heads, rp, st, keep, pages, chunks, stream);
    case 256:
      return decide_d<256>(lists, sel_lists, num_sel, block_pages, reps, quest, index_q, qbar,
                           qsplit, num_kv_heads, rp, st, keep, pages, chunks, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_reuse_commit(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                int num_kv_heads, const ReuseParams& rp, const ReuseState& st,
                                const int32_t* keep, const int32_t* chunks, cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  return launch_dependent(reuse_commit_kernel, static_cast<unsigned>(num_sel), 256, 0, stream,
                          lists, sel_lists, num_kv_heads, rp, st, keep, chunks);
}

}  // namespace cisa::cuda::detail
