// Selection reuse across decode steps: the keep-or-select decision and the state update
// (reuse.cuh says where they run and why the check's scores equal the score kernel's).
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "index_query.cuh"
#include "pdl.cuh"
#include "rep_read.cuh"
#include "reuse.cuh"
#include "reuse_commit.cuh"
#include "topk_radix.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kDecideThreads = 256;
constexpr int kCheckUnroll = 4;  // check_scores' chunk slots per warp and round
constexpr int kCheckParts = 16;  // blocks per selecting list for the check and the commit's sums

// Bound i of `parts` near-equal slices of [0, n): slice p is [part_bound(n, p, parts),
// part_bound(n, p + 1, parts)).
__device__ __forceinline__ int32_t part_bound(int32_t n, int i, int parts) {
  return static_cast<int32_t>(static_cast<int64_t>(n) * i / parts);
}

__device__ __forceinline__ bool same_sets(const ReuseInfo& I, const ReuseParams& rp) {
  return I.budget == rp.budget && I.window == rp.window && I.sink_pages == rp.sink_pages;
}

// The check `mass`'s sums (core/plan.h), in fp64: Σ e^{s − m} over S, over N, over every chunk
// of the sample's stride in E_{a0} (S's included) and over S's chunks on that stride, with m the
// largest finite score the sums have seen (an online log-sum-exp, so partial sums of threads
// merge without a second pass over the representatives). The sample's sum is the third less the
// fourth: scoring the stride whole spares a membership test in S per chunk, and S's chunks on it
// are scored as part of S anyway. The commit uses the first and third for Σ_S and Σ_E.
enum MassClass { kInS = 0, kInN = 1, kInStride = 2, kSOnStride = 3 };
struct MassSums {
  double m;
  double s[4];
};

__device__ __forceinline__ MassSums no_mass() {
  return {-static_cast<double>(INFINITY), {0, 0, 0, 0}};
}

__device__ __forceinline__ void add_mass(MassSums& a, float x, int cls, bool on_stride) {
  if (!isfinite(x)) return;  // non-finite scores weigh nothing
  const double v = x;
  if (v > a.m) {  // from m = −inf the factor is 0 and the sums are 0
    const double f = exp(a.m - v);
#pragma unroll
    for (int i = 0; i < 4; ++i) a.s[i] *= f;
    a.m = v;
  }
  const double e = exp(v - a.m);
#pragma unroll
  for (int i = 0; i < 3; ++i)  // no index by a run-time value: the sums stay in registers
    if (i == cls) a.s[i] += e;
  if (on_stride) a.s[kSOnStride] += e;
}

__device__ __forceinline__ MassSums merge_mass(const MassSums& a, const MassSums& b) {
  const double m = fmax(a.m, b.m);
  if (m == -static_cast<double>(INFINITY)) return a;  // both empty
  const double fa = exp(a.m - m), fb = exp(b.m - m);
  MassSums r;
  r.m = m;
#pragma unroll
  for (int i = 0; i < 4; ++i) r.s[i] = a.s[i] * fa + b.s[i] * fb;
  return r;
}

// The block's sums, in thread 0 (every thread calls it; blockDim.x a multiple of 32, ≤ 1,024).
__device__ MassSums block_mass(MassSums a) {
  __shared__ MassSums warps[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MassSums b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
#pragma unroll
    for (int i = 0; i < 4; ++i) b.s[i] = __shfl_xor_sync(0xffffffffu, a.s[i], o);
    a = merge_mass(a, b);
  }
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = a;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) a = merge_mass(a, warps[w]);
  return a;
}

// The check's chunks [begin, end) of [0, total): c is S[c] for c < k, nb + (c − k) for c < k + nn
// (N), else the sample's stride, stride0 + kReuseMassStrideDevice · (c − k − nn) (`mass` only).
// D/8 lanes per chunk, kChan channels per lane (rep_read.cuh), then the lanes' partial sums by xor
// shuffles, times the scale (int8) and 1/√d: score_few_kernel's arithmetic. Leaves, in shared
// memory, the lowest order key of S and the highest of N, and with `mass` each thread's sums (S's
// chunk j is on the stride iff j ≡ stride0 (mod kReuseMassStrideDevice)).
template <int D, bool kQuest, bool kInt8>
__device__ __forceinline__ void check_scores(
    int kv, const int32_t* __restrict__ S, int32_t k, int32_t nb, int32_t nn, int64_t stride0,
    int32_t begin, int32_t end, const int32_t* __restrict__ table, const uint8_t* __restrict__ reps,
    const int8_t* __restrict__ exps,
    const float* qbar,  // this block's copy in shared memory
    int H, float inv_sqrt_d, uint32_t* lowest_kept, uint32_t* highest_new, bool mass,
    MassSums& sums) {
  using RB = dev::RepBytes<kInt8>;
  // Chunk slots per warp and round: quest int8 widens 32 values a slot and bf16 at d = 256 holds
  // 8 q̄ values a lane for one chunk a warp, so both take half (ptxas spilled at four).
  constexpr int UR = (kQuest && kInt8) || (D == 256 && !kInt8) ? kCheckUnroll / 2 : kCheckUnroll;
  constexpr int CH = RB::kChan, LPC = D / CH, CPL = 32 / LPC, WARPS = kDecideThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPC, grp = lane / LPC;
  const int64_t row_bytes = int64_t{kQuest ? 2 * D : D} * RB::kBytes;
  const int32_t on_stride = static_cast<int32_t>(stride0 % kReuseMassStrideDevice);
  float q[CH];
#pragma unroll
  for (int i = 0; i < CH; ++i) q[i] = qbar[sub * CH + i];
    // UR chunk slots per warp and round, their loads issued before any is used: each
    // chunk's representative sits behind two dependent loads (S[c] or nothing, then its page ID),
    // so a round waits for three memory latencies instead of three per slot.
#pragma unroll 1
  for (int base = begin + warp * CPL * UR; base < end;
       base += WARPS * CPL * UR) {  // uniform per warp
    int64_t chunk[UR];
    uint4 lo[UR], hi[UR];
#pragma unroll
    for (int u = 0; u < UR; ++u) {
      const int c = base + u * CPL + grp;
      chunk[u] = c >= end     ? -1
                 : c < k      ? S[c]
                 : c < k + nn ? nb + (c - k)
                              : stride0 + int64_t{kReuseMassStrideDevice} * (c - k - nn);
    }
    int32_t page[UR];
#pragma unroll
    for (int u = 0; u < UR; ++u) page[u] = chunk[u] >= 0 ? table[chunk[u]] : 0;
    int ex[kInt8 ? UR : 1] = {};  // int8: each chunk's exponent (a register each: no byte packing)
#pragma unroll
    for (int u = 0; u < UR; ++u) {
      lo[u] = hi[u] = make_uint4(0, 0, 0, 0);
      if (chunk[u] >= 0) {
        const int64_t rep = static_cast<int64_t>(page[u]) * H + kv;
        const uint8_t* r = reps + rep * row_bytes + sub * 16;
        lo[u] = *reinterpret_cast<const uint4*>(r);
        if constexpr (kQuest) hi[u] = *reinterpret_cast<const uint4*>(r + D * RB::kBytes);
        if constexpr (kInt8)
          if (sub == 0) ex[u] = exps[rep];
      }
    }
#pragma unroll
    for (int u = 0; u < UR; ++u) {
      const int c = base + u * CPL + grp;
      float rl[CH], rh[CH];
      dev::unpack16<kInt8>(lo[u], rl);
      if constexpr (kQuest) dev::unpack16<kInt8>(hi[u], rh);
      float acc = dev::lane_score<kQuest, CH>(q, rl, rh);
#pragma unroll
      for (int o = LPC / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (sub == 0 && c < end) {
        const float x = dev::finish_score<kInt8>(acc, ex, kInt8 ? u : 0, inv_sqrt_d);
        const uint32_t key = order_key(x);
        if (c < k)
          atomicMin(lowest_kept, key);
        else if (c < k + nn)
          atomicMax(highest_new, key);
        if (mass)
          add_mass(sums, x,
                   c < k        ? kInS
                   : c < k + nn ? kInN
                                : kInStride,
                   c < k && chunk[u] % kReuseMassStrideDevice == on_stride);
      }
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

// What a reuse candidate's row may do (the rule: core/plan.h), from its list and state: whether
// S may be kept at all, and whether the check scores anything. Computed alike by the check's
// blocks and the decision's block, from state neither of them has changed yet.
struct Candidate {
  ReuseInfo I;
  int64_t slot, nb, stride0;
  int32_t nn, total;  // the check's chunks: S, N, then (mass) the sample's stride
  bool ok, checked, mass;
  // An unchecked list's blocks copy their shares of S into it where this holds: `ok`, or, read
  // after the list's first block decided to keep S and moved its last use to the row, the same
  // rule with last use = row. Where it holds and `ok` does not (a row decided twice at one
  // position), the list selects afresh and top-k overwrites every entry copied.
  bool copy;
};

__device__ __forceinline__ Candidate candidate(const ListDesc& L, const ReuseState& st,
                                               const ReuseParams& rp, int H) {
  Candidate c{};
  c.slot = state_slot(L, st, H);
  c.I = st.info[c.slot];
  const int64_t a = L.first_pos;
  const int32_t k = L.k;
  c.ok = c.I.selected_at >= 0 && same_sets(c.I, rp) && k <= st.k_stride;
  if (st.repeat) {
    c.ok = c.ok && c.I.last_used == a;
    c.copy = c.ok;
  } else {
    const bool young = c.I.last_used >= c.I.selected_at && a - c.I.selected_at < rp.reuse_steps;
    c.copy = c.ok && young && (a == c.I.last_used + 1 || a == c.I.last_used);
    c.ok = c.ok && young && a == c.I.last_used + 1;
  }
  // newly_eligible (plan.h): [c(a0) − W, c(a) − W), from the sinks on.
  c.nb = max(rp.sink_pages, c.I.selected_at / 16 - rp.window);
  const int64_t ne = max(c.nb, a / 16 - rp.window);
  c.mass = rp.check_mass != 0;
  c.checked = c.ok && !st.repeat && k > 0 && (c.mass || (rp.check_new_chunks && ne > c.nb));
  // `mass`: the sample is E_{a0}'s chunks j ≡ a (mod stride) outside S, E_{a0} = [sinks, nb).
  c.stride0 =
      rp.sink_pages + ((a - rp.sink_pages) % kReuseMassStrideDevice + kReuseMassStrideDevice) %
                          kReuseMassStrideDevice;
  const int64_t on_stride =
      c.mass && c.stride0 < c.nb ? (c.nb - 1 - c.stride0) / kReuseMassStrideDevice + 1 : 0;
  c.nn = static_cast<int32_t>(ne - c.nb);
  c.total = k + c.nn + static_cast<int32_t>(on_stride);
  return c;
}

// One block's share of a check or of a commit's sums (reuse_partial_bytes per selecting list).
struct CheckPartial {
  MassSums ms;
  uint32_t lowest_kept, highest_new;
};

// A check partial as the deciding block reads it: from L2 (ld.cg), since the other blocks of the
// list wrote it in this launch.
__device__ __forceinline__ CheckPartial load_partial(const CheckPartial* p) {
  CheckPartial r;
  r.ms.m = __ldcg(&p->ms.m);
#pragma unroll
  for (int i = 0; i < 4; ++i) r.ms.s[i] = __ldcg(&p->ms.s[i]);
  r.lowest_kept = __ldcg(&p->lowest_kept);
  r.highest_new = __ldcg(&p->highest_new);
  return r;
}

// Entries [c0, c1) of S as chosen at a0, into the selected part of this row's list (sinks,
// window and tail are this row's own, written at plan time).
__device__ __forceinline__ void copy_share(const ListDesc& L, const Candidate& C,
                                           const ReuseState& st, const int32_t* __restrict__ table,
                                           int32_t* __restrict__ chunks,
                                           int32_t* __restrict__ pages, int32_t c0, int32_t c1) {
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin) + c0;
  copy_chunks(st.chunks + C.slot * st.k_stride + c0, c1 - c0, table, chunks + out0, pages + out0);
}

// The decision for one selecting list, by one block (every thread calls it): the list's index
// query (the index-query kernel's work, here instead: scoring reads it for lists that select),
// the keep flag, the counters, and for a kept list entries [c0, c1) of S's pages in its selected
// part. C was computed by this block before any block changed the list's state; p holds the
// list's check partials (null when the list runs no check), merged in part order
// (deterministic).
__device__ void decide_list(const ListDesc& L, int32_t li, const Candidate& C,
                            const CheckPartial* p, int parts, const int32_t* __restrict__ table,
                            const float* __restrict__ index_q, float* __restrict__ qbar,
                            uint16_t* __restrict__ qsplit, int H, int D, const ReuseParams& rp,
                            const ReuseState& st, int32_t* __restrict__ keep,
                            int32_t* __restrict__ pages, int32_t* __restrict__ chunks, int32_t c0,
                            int32_t c1) {
  __shared__ int32_t verdict;
  write_index_query(L, li, index_q, H, D, qbar, qsplit);
  if (threadIdx.x == 0) {
    bool ok = C.ok;
    if (p) {
      uint32_t lowest = 0xffffffffu, highest = 0u;
      MassSums ms = no_mass();
      for (int i = 0; i < parts; ++i) {
        const CheckPartial q = load_partial(p + i);
        lowest = min(lowest, q.lowest_kept);
        highest = max(highest, q.highest_new);
        if (C.mass) ms = merge_mass(ms, q.ms);
      }
      ok = !(highest > lowest);  // equal keys go to the kept chunk's smaller index
      if (C.mass && ok) {
        const double sample = fmax(0.0, ms.s[kInStride] - ms.s[kSOnStride]);
        const double out = ms.s[kInN] + kReuseMassStrideDevice * sample;
        const double u1 = ms.s[kInS] + out > 0 ? out / (ms.s[kInS] + out) : 0.0;
        ok = !(u1 > C.I.unselected_mass + rp.mass_slack);
      }
    }
    verdict = ok ? 1 : 0;
    keep[li] = verdict;
    if (!st.repeat) {
      auto* n = reinterpret_cast<unsigned long long*>(st.stats);
      atomicAdd(n + (ok ? 1 : 0), 1ull);  // reused : selected
      if (p) {
        atomicAdd(n + 2, 1ull);
        if (!ok) atomicAdd(n + 3, 1ull);
      }
      if (ok) st.info[C.slot].last_used = L.first_pos;
    }
  }
  __syncthreads();
  if (verdict != 0) copy_share(L, C, st, table, chunks, pages, c0, c1);
}

// The check and the decision in one launch, kCheckParts blocks per selecting list (the check of
// a list's ~8,200 chunks at 2 x 1M under `mass` took ~0.33 ms a layer on one block). Block
// (list, part) scores its slice of the check's chunks under the row's index query (computed
// here, bit for bit as write_index_query does) and writes its lowest S key, highest N key and
// sums to partials[list][part]; the list's last block to finish (a ticket per list, which wraps
// back to 0 for the next launch) merges them and decides. A list that runs no check (every
// kept step but the 1 in 16 where a page leaves the window) is decided by its first block at
// once while every block copies its share of S (k / kCheckParts entries: one round of loads
// instead of a block's k), and one that is no candidate gets its index query and keep = 0
// there. The decider of a checked list is the last block to arrive, so every block has read
// the list's state before it changes; an unchecked list's other blocks, whether they read it
// before or after its change, find no check to run (Candidate::copy says which copy).
template <int D, bool kQuest, bool kInt8>
__global__ void __launch_bounds__(kDecideThreads)
    reuse_decide_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                        const int32_t* __restrict__ block_pages, const uint8_t* __restrict__ reps,
                        const int8_t* __restrict__ exps, const float* __restrict__ index_q,
                        float* __restrict__ qbar, uint16_t* __restrict__ qsplit, int H,
                        float inv_sqrt_d, ReuseParams rp, ReuseState st,
                        CheckPartial* __restrict__ partials, uint32_t* __restrict__ tickets,
                        int32_t* __restrict__ keep, int32_t* __restrict__ pages,
                        int32_t* __restrict__ chunks) {
  __shared__ ListDesc L;  // in shared memory: the check's registers are not held for the decision
  __shared__ Candidate C;
  __shared__ float q_s[D];
  __shared__ uint32_t lowest_kept, highest_new;
  __shared__ bool last;
  // The plan's list descriptors are written by no kernel: read before the wait (pdl.cuh), so
  // that they arrive while the kernel before this one finishes.
  const int32_t li = sel[blockIdx.x];
  const int parts = static_cast<int>(gridDim.y), part = static_cast<int>(blockIdx.y);
  if (threadIdx.x == 0) L = lists[li];
  dev::dependent_start();
  if (threadIdx.x == 0) {
    if (L.reuse_seq >= 0) C = candidate(L, st, rp, H);
    lowest_kept = 0xffffffffu;
    highest_new = 0u;
  }
  __syncthreads();
  const int32_t* table = block_pages + L.table_begin;
  if (L.reuse_seq < 0) {
    if (part != 0) return;
    write_index_query(L, li, index_q, H, D, qbar, qsplit);
    if (threadIdx.x == 0) keep[li] = 0;
    return;
  }
  if (!C.checked) {  // uniform: C is shared
    // The first block decides; every block copies its share of S where the list may keep it
    // (Candidate::copy: the first block's decision may already have moved the last use).
    const int32_t c0 = part_bound(L.k, part, parts);
    const int32_t c1 = part_bound(L.k, part + 1, parts);
    if (part == 0)
      decide_list(L, li, C, nullptr, parts, table, index_q, qbar, qsplit, H, D, rp, st, keep, pages,
                  chunks, c0, c1);
    else if (C.copy)
      copy_share(L, C, st, table, chunks, pages, c0, c1);
    return;
  }
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float qi[1];
    index_query_channels<1>(L, index_q, H, D, i, qi);
    q_s[i] = qi[0];
  }
  __syncthreads();
  const int32_t begin = part_bound(C.total, part, parts);
  const int32_t end = part_bound(C.total, part + 1, parts);
  MassSums ms = no_mass();
  check_scores<D, kQuest, kInt8>(
      L.kv, st.chunks + C.slot * st.k_stride, L.k, static_cast<int32_t>(C.nb), C.nn, C.stride0,
      begin, end, table, reps, exps, q_s, H, inv_sqrt_d, &lowest_kept, &highest_new, C.mass, ms);
  __syncthreads();
  if (C.mass) ms = block_mass(ms);  // thread 0's result
  CheckPartial* const mine = partials + static_cast<int64_t>(blockIdx.x) * parts;
  if (threadIdx.x == 0) {
    mine[part] = CheckPartial{ms, lowest_kept, highest_new};
    __threadfence();  // the partial is visible before the ticket says so
    last = atomicInc(tickets + blockIdx.x, static_cast<unsigned>(parts - 1)) ==
           static_cast<unsigned>(parts - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  decide_list(L, li, C, mine, parts, table, index_q, qbar, qsplit, H, D, rp, st, keep, pages,
              chunks, 0, L.k);
}

// Under `mass`, a candidate that selected afresh: S ← the selected part of its list, a0 = last
// use = its row, u0 = 1 − Σ_S / Σ_E over the list's scores (under the other checks the top-k
// kernels commit: reuse_commit.cuh).
constexpr int kCommitThreads = 256;

// Under `mass`, before the commit: block (list, part) sums e^s over its slice of the list's
// scores (class kInStride: all of E) and of its fresh selection's chunks (kInS) into
// partials[list][part]; one block per list took ~65,000 fp64 exponentials a list at 1M.
__global__ void __launch_bounds__(kCommitThreads)
    reuse_commit_sums_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel,
                             ReuseState st, const int32_t* __restrict__ keep,
                             const int32_t* __restrict__ chunks, const float* __restrict__ scores,
                             CheckPartial* __restrict__ partials) {
  dev::dependent_start();
  const int32_t li = sel[blockIdx.x];
  const ListDesc L = lists[li];
  if (!commits(L, st, keep, li)) return;
  const int parts = static_cast<int>(gridDim.y), part = static_cast<int>(blockIdx.y);
  const int32_t n = L.elig_end - L.elig_begin;
  const int32_t e0 = part_bound(n, part, parts);
  const int32_t e1 = part_bound(n, part + 1, parts);
  const int32_t s0 = part_bound(L.k, part, parts);
  const int32_t s1 = part_bound(L.k, part + 1, parts);
  // The chunks of S are absolute; the list's scores start at elig_begin.
  const float* sc = scores + L.score_begin;
  const int32_t* picked = chunks + L.out_begin + (L.pre_end - L.pre_begin);
  MassSums ms = no_mass();
  for (int32_t i = e0 + threadIdx.x; i < e1; i += kCommitThreads)
    add_mass(ms, sc[i], kInStride, false);
  for (int32_t i = s0 + threadIdx.x; i < s1; i += kCommitThreads)
    add_mass(ms, sc[picked[i] - L.elig_begin], kInS, false);
  ms = block_mass(ms);
  if (threadIdx.x == 0) partials[static_cast<int64_t>(blockIdx.x) * parts + part] = {ms, 0u, 0u};
}

__global__ void __launch_bounds__(kCommitThreads)
    reuse_commit_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ sel, int H,
                        ReuseParams rp, ReuseState st, const int32_t* __restrict__ keep,
                        const int32_t* __restrict__ chunks, int parts,
                        const CheckPartial* __restrict__ partials) {
  dev::dependent_start();
  const int32_t li = sel[blockIdx.x];
  const ListDesc L = lists[li];
  if (!commits(L, st, keep, li)) return;
  const int64_t slot = state_slot(L, st, H);
  int32_t* S = st.chunks + slot * st.k_stride;
  const int64_t out0 = L.out_begin + (L.pre_end - L.pre_begin);
  copy_chunks(chunks + out0, L.k, nullptr, S, nullptr);
  if (threadIdx.x != 0) return;
  MassSums ms = no_mass();  // the partials of reuse_commit_sums, in part order
  for (int i = 0; i < parts; ++i)
    ms = merge_mass(ms, partials[static_cast<int64_t>(blockIdx.x) * parts + i].ms);
  const double u0 = ms.s[kInStride] > 0 ? 1.0 - ms.s[kInS] / ms.s[kInStride] : 0.0;
  st.info[slot] = fresh_info(L, rp, u0);
}

}  // namespace

size_t reuse_partial_bytes(int64_t num_sel) {
  return static_cast<size_t>(std::max<int64_t>(1, num_sel)) * kCheckParts * sizeof(CheckPartial);
}

cudaError_t launch_reuse_decide(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                const int32_t* block_pages, const RepArgs& reps, bool quest,
                                const float* index_q, float* qbar, uint16_t* qsplit,
                                int num_kv_heads, int head_dim, const ReuseParams& rp,
                                const ReuseState& st, void* partials, uint32_t* tickets,
                                int32_t* keep, int32_t* pages, int32_t* chunks,
                                cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  if ((reps.int8 && !reps.exps) || !partials || !tickets) return cudaErrorInvalidValue;
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return cudaErrorInvalidValue;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(head_dim));
  using Kernel = void (*)(const ListDesc*, const int32_t*, const int32_t*, const uint8_t*,
                          const int8_t*, const float*, float*, uint16_t*, int, float, ReuseParams,
                          ReuseState, CheckPartial*, uint32_t*, int32_t*, int32_t*, int32_t*);
  Kernel kernels[3][2][2] = {
      {{reuse_decide_kernel<64, false, false>, reuse_decide_kernel<64, false, true>},
       {reuse_decide_kernel<64, true, false>, reuse_decide_kernel<64, true, true>}},
      {{reuse_decide_kernel<128, false, false>, reuse_decide_kernel<128, false, true>},
       {reuse_decide_kernel<128, true, false>, reuse_decide_kernel<128, true, true>}},
      {{reuse_decide_kernel<256, false, false>, reuse_decide_kernel<256, false, true>},
       {reuse_decide_kernel<256, true, false>, reuse_decide_kernel<256, true, true>}}};
  const int di = head_dim == 64 ? 0 : head_dim == 128 ? 1 : 2;
  return launch_dependent(kernels[di][quest ? 1 : 0][reps.int8 ? 1 : 0],
                          dim3(static_cast<unsigned>(num_sel), kCheckParts), kDecideThreads, 0,
                          stream, lists, sel_lists, block_pages, reps.data, reps.exps, index_q,
                          qbar, qsplit, num_kv_heads, inv_sqrt_d, rp, st,
                          static_cast<CheckPartial*>(partials), tickets, keep, pages, chunks);
}

cudaError_t launch_reuse_commit(const ListDesc* lists, const int32_t* sel_lists, int64_t num_sel,
                                int num_kv_heads, const ReuseParams& rp, const ReuseState& st,
                                const int32_t* keep, const int32_t* chunks, const float* scores,
                                void* partials, cudaStream_t stream) {
  if (num_sel <= 0) return cudaSuccess;
  if (!rp.check_mass || !scores || !partials) return cudaErrorInvalidValue;
  auto* part = static_cast<CheckPartial*>(partials);
  const cudaError_t err =
      launch_dependent(reuse_commit_sums_kernel, dim3(static_cast<unsigned>(num_sel), kCheckParts),
                       kCommitThreads, 0, stream, lists, sel_lists, st, keep, chunks, scores, part);
  if (err != cudaSuccess) return err;
  return launch_dependent(reuse_commit_kernel, static_cast<unsigned>(num_sel), kCommitThreads, 0,
                          stream, lists, sel_lists, num_kv_heads, rp, st, keep, chunks,
                          int{kCheckParts}, static_cast<const CheckPartial*>(part));
}

}  // namespace cisa::cuda::detail
