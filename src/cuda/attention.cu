// Paged attention kernel (FlashAttention-2 style on mma.sync) and the split-KV merge.
//
// Per block: rows [row0, row0 + rows) of one list; warp w owns rows 16w … 16w+15, each thread
// rows g = lane/4 and g + 8 of them (the mma fragment layout). The list's pages are consumed
// kStageTokens tokens at a time through a kStages-deep cp.async pipeline into swizzled shared
// tiles (swz below); a page past the block's range is zero-filled and masked, so garbage never
// meets P·V.
// Scores are kept in log2 units (scale·log2 e folded in) so the softmax uses exp2.
#include <cfloat>
#include <climits>

#include "attention.cuh"
#include "attention_rows.cuh"
#include "common.cuh"
#include "pdl.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

// Whether head dim D uses swizzled rows (swz below) or padded ones (tile_sizes.cuh), and the
// shared row length in bf16 elements: D swizzled, or D + kSmemPad.
template <int D>
constexpr bool kSwizzled = D <= tiles::kSwizzleMaxHeadDim;
template <int D>
constexpr int kSmemRow = kSwizzled<D> ? D : D + tiles::kSmemPad;

template <int D>
constexpr size_t attention_smem_bytes() {
  return sizeof(uint16_t) * 2 /*K,V*/ * tiles::kStages * tiles::kStageTokens<D> * kSmemRow<D> +
         sizeof(int32_t) * 3 * tiles::kSegPages;
}

// Shared K/V tiles are unpadded [token][D] rows whose 16-byte chunks are XOR-swizzled by the
// token's low 3 bits inside each 128-byte group: chunk c of token t sits at chunk swz(t, c).
// ldmatrix reads 8 consecutive tokens at one logical chunk, which land in 8 distinct bank groups
// (what v1–v8's 16-byte row padding did), and every 128-byte line of global memory lands in one
// aligned 128-byte line of shared memory. With the padding it did not: ncu (v9) counted 1.5x the
// K/V bytes crossing L2 → SM (805 M sectors in 352 M requests for 537 M sectors of data), because
// cp.async splits a line whose shared destination straddles two 128-byte lines; dense decode read
// 4.1 TB/s where cuDNN and FlashAttention, with whole lines, read 4.5. (Padded rows, d = 256:
// swz is the identity.)
template <int D>
__device__ __forceinline__ int swz(int tok, int chunk) {
  return kSwizzled<D> ? chunk ^ (tok & 7) : chunk;
}

// Merged row r of merge task M on one warp (merge_kernel, and the fused merge at the end of
// attention_kernel). Lane s reads the LSE of split s (32 splits per pass); lane c owns channels
// 4c … 4c + 3 (+128 for d = 256) and reads them as one 16-byte load per split, every split's load
// issued before the first use, weights broadcast from lane s by shuffle. CG: the partials were
// written by other blocks of the same launch, so they are read from L2 (ld.global.cg), not
// through this SM's L1; the values, and so the result bits, are the same.
template <int D, bool CG>
__device__ __forceinline__ void merge_row(const AttentionArgs& a, const MergeTask& M, int r,
                                          int lane) {
  constexpr int NC = D / 4 > 32 ? 2 : 1;  // float4 groups per lane
  const ListDesc L = a.lists[M.list];
  const int hg = a.num_q_heads / a.num_kv_heads;
  const float* plse = a.partial_lse + M.partial + r;  // split s at plse[s · rows]
  const auto lse_of = [&](int s) {
    const float* p = plse + static_cast<int64_t>(s) * M.rows;
    return CG ? __ldcg(p) : *p;
  };
  float mx = -INFINITY;
  for (int s = lane; s < M.splits; s += 32) mx = fmaxf(mx, lse_of(s));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float4 acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const bool has = lane * 4 < D;  // d = 64: lanes 16 … 31 hold no channels
  float sum = 0.0f;
  if (mx != -INFINITY) {
    for (int s0 = 0; s0 < M.splits; s0 += 32) {
      const int s = s0 + lane;
      const float w = s < M.splits ? expf(lse_of(s) - mx) : 0.0f;
      sum += w;
      const int n = min(32, M.splits - s0);
      const float4* po = reinterpret_cast<const float4*>(
          a.partial_out + (M.partial + static_cast<int64_t>(s0) * M.rows + r) * D);
      const int64_t step = static_cast<int64_t>(M.rows) * (D / 4);  // one split, in float4
#pragma unroll 16
      for (int j = 0; j < n; ++j) {
        const float wj = __shfl_sync(0xffffffffu, w, j);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (!has) continue;
          const float4* pv = po + j * step + lane + 32 * c;
          const float4 v = CG ? __ldcg(pv) : *pv;
          acc[c].x = fmaf(wj, v.x, acc[c].x);
          acc[c].y = fmaf(wj, v.y, acc[c].y);
          acc[c].z = fmaf(wj, v.z, acc[c].z);
          acc[c].w = fmaf(wj, v.w, acc[c].w);
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  const int lr = M.row0 + r, p = lr / hg, head = L.kv * hg + lr % hg;
  const int64_t hr = (L.q_row + p) * a.num_q_heads + head;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  float* dst = a.out + hr * D;
  const bool vec = (reinterpret_cast<uintptr_t>(a.out) & 15) == 0;  // callers may pass any float*
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    if (!has) continue;
    const float4 v = make_float4(acc[c].x * inv, acc[c].y * inv, acc[c].z * inv, acc[c].w * inv);
    float* d4 = dst + 4 * (lane + 32 * c);
    if (vec) {
      *reinterpret_cast<float4*>(d4) = v;
    } else {
      d4[0] = v.x;
      d4[1] = v.y;
      d4[2] = v.z;
      d4[3] = v.w;
    }
  }
  if (a.lse && lane == 0) a.lse[hr] = mx == -INFINITY ? -INFINITY : mx + logf(sum);
}

// PW > 1 (few rows per list: decode): the warps split each tile's pages as well as its rows.
// Warp w takes rows 16·(w mod RW) … +15 and pages [ph·NP/PW, (ph+1)·NP/PW) of every tile, where
// ph = w / RW and RW = WARPS / PW; the PW partial softmax states of a row meet at the end by
// log-sum-exp in shared memory. With one warp of rows (4:1 decode), v2/v3 ran the mma and softmax
// of all 64 tokens of a tile on one warp while three only copied.
// UNI: the launch holds union tasks. Launches without them use an instantiation without the
// union masks (v3 measured the union logic costing ~10 % on full-tile prefill: 243 vs 229
// registers at d = 128).
// FM (PlanOptions::fused_merge, PW > 1 only): a task with a merge takes a ticket after storing
// its partials, and the merge task's last split block merges them (merge_row), so no merge
// launch follows. The ticket wraps back to zero as the last block takes it.
template <int D, int WARPS, int PW, bool UNI, bool FM, bool SH>
__device__ __forceinline__ void attention_task(const AttentionArgs a, const int task) {
  constexpr int B = tiles::kPageSize;
  constexpr int NT = tiles::kStageTokens<D>;
  constexpr int NP = NT / B;
  constexpr int RW = WARPS / PW;  // warps across rows
  constexpr int NTW = NT / PW;    // tokens of a tile per warp
  constexpr int NPW = NP / PW;    // pages of a tile per warp
  static_assert(NPW >= 1 && RW >= 1, "page split must leave each warp a page");
  constexpr int LD = kSmemRow<D>;
  constexpr int THREADS = WARPS * 32;
  constexpr int ST = tiles::kStages;
  constexpr int SEG = tiles::kSegPages;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* ks = smem;                 // [ST][NT][LD]
  uint16_t* vs = smem + ST * NT * LD;  // [ST][NT][LD]

  const AttnTask t = a.tasks[task];
  if (SH && t.rows == 0) return;  // an unused slot (PlanOptions::even_shares)
  const int hg = a.num_q_heads / a.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane >> 2, tq = lane & 3;
  const int rt = warp % RW, ph = warp / RW;  // row tile and page phase of this warp
  // Union task: warp w owns all rows of member w's list; else warp w owns rows 16w … 16w + 15.
  // (d = 256 has no registers to spare for it: the planner forms no unions there.)
  constexpr bool kUnions = UNI && D <= tiles::kUnionMaxHeadDim && PW == 1;
  const bool uni = kUnions && t.members > 0;
  const ListDesc L = a.lists[t.list + (uni ? union_member_offset(t, warp) : 0)];
  const int row_base = uni ? 0 : rt * 16;
  const int rows_w = task_rows(t, L, uni, hg);

  // The two rows of this thread and their Q fragments (attention_rows.cuh).
  int32_t pos[2];
  uint32_t qf[D / 16][4];
  load_q_rows<D>(a, L, t.row0, row_base, rows_w, gr, tq, pos, qf);
  const int32_t tmax = task_last_pos(a, t, L, uni, hg);  // of the block
  bool warp_active = uni ? warp < t.members : rt * 16 < t.rows;

  // Page IDs and logical chunks of the task are staged in shared memory, kSegPages at a time
  // (one coalesced read each), so neither the K/V copies nor the masks wait on a dependent
  // global load per tile (v1 read both from global memory inside the pipeline).
  int32_t* pid_s = reinterpret_cast<int32_t*>(vs + ST * NT * LD);  // [kSegPages]
  int32_t* cid_s = pid_s + SEG;                                    // [kSegPages]
  int32_t* mid_s = cid_s + SEG;                                    // [kSegPages] union masks
  const int64_t n_pages = uni ? a.ucounts[t.union_id] : t.page1 - t.page0;
  auto load_tile = [&](int stage, int tile, int seg_n) {
    constexpr int CPR = D / 8;  // 16-byte pieces per token row
#pragma unroll
    for (int e = threadIdx.x; e < NT * CPR; e += THREADS) {
      const int tok = e / CPR, c8 = (e % CPR) * 8;
      const int pi = tile * NP + tok / B;
      const bool ok = pi < seg_n;
      const int64_t phys = ok ? pid_s[pi] : 0;
      const int64_t off = ((phys * a.num_kv_heads + L.kv) * B + tok % B) * D + c8;
      const int so = (stage * NT + tok) * LD + swz<D>(tok, c8 / 8) * 8;
      dev::cp_async16(ks + so, a.k + off, ok ? 16 : 0);
      dev::cp_async16(vs + so, a.v + off, ok ? 16 : 0);
    }
  };

  // ldmatrix lanes (K and V alike): lane L gives the address of row L & 15 of a 16-token step at
  // logical chunk 2·k + (L >> 4), which the swizzle puts at chunk (2·k) ^ x, x = (L >> 4) ^ (L &
  // 7). k and k + 4 differ by chunk 8, outside x's bits, so four lane addresses kaddr[k & 3] (stage
  // 0, token 0 of the stage) serve every k with immediate offsets: each tile adds its stage offset
  // to the four once, and every ldmatrix of K and V (V's pool is a constant further) is then
  // [register + immediate]. (v9 first XOR-ed each address, (row + 32·k) ^ 16·x: two more
  // instructions per ldmatrix, and union prefill tiles, 64 ldmatrix per warp and tile, slowed 8 %.)
  uint32_t kaddr[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    kaddr[j] = static_cast<uint32_t>(__cvta_generic_to_shared(ks + (lane & 15) * LD)) +
               16u * ((2 * j) ^ ((lane >> 4) ^ (lane & 7)));

  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = a.scale * kAttnLog2e;

  bool done = false;
  for (int64_t seg0 = 0; seg0 < n_pages && !done; seg0 += SEG) {
    const int seg_n = static_cast<int>(n_pages - seg0 < SEG ? n_pages - seg0 : SEG);
    __syncthreads();  // the previous segment's IDs and stages are no longer read
    for (int i = threadIdx.x; i < seg_n; i += THREADS) {
      const int64_t e = t.page0 + seg0 + i;
      pid_s[i] = uni ? a.upages[e] : a.pages[e];
      cid_s[i] = uni ? a.uchunks[e] : a.chunks[e];
      if constexpr (kUnions) mid_s[i] = uni ? a.umask[e] : -1;
    }
    __syncthreads();
    const int n_tiles = (seg_n + NP - 1) / NP;
    // ST-stage pipeline: ST − 1 tiles in flight while one is consumed. Every iteration commits
    // one group (empty at the end), so "tile it has landed" is always wait_group(ST − 2).
#pragma unroll
    for (int p = 0; p < ST - 1; ++p) {
      if (p < n_tiles) load_tile(p, p, seg_n);
      dev::cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
      dev::cp_async_wait<ST - 2>();
      __syncthreads();  // tile it visible to all; stage (it − 1) % ST free for the next copy
      if (it + ST - 1 < n_tiles) load_tile((it + ST - 1) % ST, it + ST - 1, seg_n);
      dev::cp_async_commit();
      // Pages ascend: once a tile starts after the tile's last query, the rest is in the future.
      if (cid_s[it * NP] * B > tmax) {
        done = true;
        break;
      }
      if (!warp_active) continue;
      const int stage = it % ST;
      // A page the warp's list did not choose (union tasks) is masked like a future page.
      int32_t cstart[NPW];
      bool any = false;
#pragma unroll
      for (int j = 0; j < NPW; ++j) {
        const int pi = it * NP + ph * NPW + j;
        const bool mine = pi < seg_n && (!kUnions || ((mid_s[pi] >> warp) & 1));
        cstart[j] = mine ? cid_s[pi] * B : INT_MAX / 2;
        any |= mine;
      }
      if (kUnions && !any) continue;
      // Byte offset of the warp's tokens of this stage from stage 0, token 0.
      const uint32_t toff = (stage * NT + ph * NTW) * LD * 2;
      float s[NTW / 8][4];
#pragma unroll
      for (int j = 0; j < NTW / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < NTW / 16; ++np) {
          uint32_t b[4];
          if constexpr (kSwizzled<D>) {
            // b[0], b[1]: channels 16·kk … +7 of tokens 0–7, 8–15; b[2], b[3]: channels +8 … +15.
            dev::ldmatrix_x4_at(b, kaddr[kk & 3] + toff + (kk >> 2) * 128 + np * 16 * LD * 2);
            dev::mma_bf16_16816(s[2 * np], qf[kk], b[0], b[2]);
            dev::mma_bf16_16816(s[2 * np + 1], qf[kk], b[1], b[3]);
          } else {  // padded rows (d = 256): the v1–v8 addressing, which fits its 255 registers
            const uint16_t* kst = ks + (stage * NT + ph * NTW) * LD;
            dev::ldmatrix_x4(b, kst + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 +
                                    ((lane >> 3) & 1) * 8);
            dev::mma_bf16_16816(s[2 * np], qf[kk], b[0], b[1]);
            dev::mma_bf16_16816(s[2 * np + 1], qf[kk], b[2], b[3]);
          }
        }
      }
      // Mask by absolute position (causal, optional window), scale, online softmax.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < NTW / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          const int32_t sp = cstart[j / 2] + (j % 2) * 8 + tq * 2 + (e & 1);
          const bool vis = sp <= pos[h] && (a.window == 0 || sp > pos[h] - a.window);
          s[j][e] = vis ? s[j][e] * sl2 : -INFINITY;
          mx[h] = fmaxf(mx[h], s[j][e]);
        }
      float base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h]);
        base[h] = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2f(m[h] - base[h]);
        l[h] *= corr;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          o[j][2 * h] *= corr;
          o[j][2 * h + 1] *= corr;
        }
        m[h] = m_new;
      }
#pragma unroll
      for (int j = 0; j < NTW / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] = exp2f(s[j][e] - base[e >> 1]);
          l[e >> 1] += s[j][e];
        }
#pragma unroll
      for (int kt = 0; kt < NTW / 16; ++kt) {
        const uint32_t pa[4] = {dev::pack_bf16x2(s[2 * kt][0], s[2 * kt][1]),
                                dev::pack_bf16x2(s[2 * kt][2], s[2 * kt][3]),
                                dev::pack_bf16x2(s[2 * kt + 1][0], s[2 * kt + 1][1]),
                                dev::pack_bf16x2(s[2 * kt + 1][2], s[2 * kt + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          if constexpr (kSwizzled<D>) {
            dev::ldmatrix_x4_trans_at(
                b, kaddr[dp & 3] + toff + ST * NT * LD * 2 + (dp >> 2) * 128 + kt * 16 * LD * 2);
          } else {
            const uint16_t* vst = vs + (stage * NT + ph * NTW) * LD;
            dev::ldmatrix_x4_trans(b,
                                   vst + (kt * 16 + (lane & 15)) * LD + dp * 16 + (lane >> 4) * 8);
          }
          dev::mma_bf16_16816(o[2 * dp], pa, b[0], b[1]);
          dev::mma_bf16_16816(o[2 * dp + 1], pa, b[2], b[3]);
        }
      }
    }
  }
  dev::cp_async_wait<0>();
  if constexpr (PW > 1) {
    // Page phases 1 … PW−1 hand (m, l, o) to phase 0 of the same rows through shared memory
    // (the K/V stages are free now), laid out [value][warp][lane] so a warp's stores hit 32 banks.
    constexpr int NV = 4 + D / 2;  // m[2], l[2], o[D/8][4] per lane
    static_assert(sizeof(float) * NV * WARPS * 32 <= sizeof(uint16_t) * 2 * ST * NT * LD,
                  "merge buffer");
    float* xs = reinterpret_cast<float*>(smem);
    __syncthreads();  // every warp has left the main loop: the stages are no longer read
    auto at = [&](int v, int w) -> float& { return xs[(v * WARPS + w) * 32 + lane]; };
    if (ph > 0) {
      at(0, warp) = m[0];
      at(1, warp) = m[1];
      at(2, warp) = l[0];
      at(3, warp) = l[1];
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) at(4 + 4 * j + e, warp) = o[j][e];
    }
    __syncthreads();
    if (ph == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mt = m[h];
#pragma unroll
        for (int q = 1; q < PW; ++q) mt = fmaxf(mt, at(h, rt + q * RW));
        if (mt == -INFINITY) continue;  // no visible key in any phase: l stays 0
        const float c0 = exp2f(m[h] - mt);
        l[h] *= c0;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          o[j][2 * h] *= c0;
          o[j][2 * h + 1] *= c0;
        }
#pragma unroll
        for (int q = 1; q < PW; ++q) {
          const int w = rt + q * RW;
          const float c = exp2f(at(h, w) - mt);
          l[h] += c * at(2 + h, w);
#pragma unroll
          for (int j = 0; j < D / 8; ++j) {
            o[j][2 * h] += c * at(4 + 4 * j + 2 * h, w);
            o[j][2 * h + 1] += c * at(4 + 4 * j + 2 * h + 1, w);
          }
        }
        m[h] = mt;
      }
    }
    warp_active = warp_active && ph == 0;
  }
  if constexpr (!FM) {
    if (!warp_active) return;
    store_rows<D>(a, L, task, t.row0, row_base, rows_w, gr, tq, &o[0][0], m, l);
  } else {
    if (warp_active) store_rows<D>(a, L, task, t.row0, row_base, rows_w, gr, tq, &o[0][0], m, l);
    const int32_t mi = __ldg(&a.tasks[task].merge);  // block-uniform
    if (mi < 0) return;
    __shared__ bool last;
    __threadfence();  // this thread's partials are visible before the ticket says so
    __syncthreads();
    if (threadIdx.x == 0) {
      const auto splits = static_cast<unsigned>(a.merges[mi].splits);
      last = atomicInc(a.merge_tickets + mi, splits - 1) == splits - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const MergeTask M = a.merges[mi];
    for (int r = warp; r < M.rows; r += WARPS) merge_row<D, true>(a, M, r, lane);
  }
}

// AttentionArgs::sm_claims: the slot this block runs, one of its SM's if one is free, else the
// first free slot of another SM (a block that found its SM's slots taken: an SM that ran more
// blocks than its slots because others were busy at the launch). Launches have exactly
// num_sms · slots_per_sm blocks, so every slot is taken once. Counters past slots_per_sm only
// grow until the reset.
__device__ __forceinline__ int claim_sm_slot(const AttentionArgs& a) {
  __shared__ int slot_s;
  if (threadIdx.x == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    int slot = -1;
    if (static_cast<int>(sm) < a.num_sms) {
      const uint32_t k = atomicAdd(a.sm_claims + sm, 1u);
      if (k < static_cast<uint32_t>(a.slots_per_sm))
        slot = static_cast<int>(sm) * a.slots_per_sm + static_cast<int>(k);
    }
    for (int s = 0; slot < 0 && s < a.num_sms; ++s) {
      if (__ldcg(a.sm_claims + s) >= static_cast<uint32_t>(a.slots_per_sm)) continue;
      const uint32_t k = atomicAdd(a.sm_claims + s, 1u);
      if (k < static_cast<uint32_t>(a.slots_per_sm))
        slot = s * a.slots_per_sm + static_cast<int>(k);
    }
    slot_s = slot >= 0 ? slot : static_cast<int>(blockIdx.x);  // (unreachable: grid = slots)
  }
  __syncthreads();
  return slot_s;
}

// The last block of the launch to finish zeroes the claim counters for the next launch.
__device__ __forceinline__ void release_sm_slots(const AttentionArgs& a) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  uint32_t* done = a.sm_claims + a.num_sms;
  __threadfence();
  if (atomicAdd(done, 1u) != gridDim.x - 1) return;
  for (int s = 0; s < a.num_sms; ++s) a.sm_claims[s] = 0;
  *done = 0;
  __threadfence();
}

// Task blockIdx.x, or (SH: page-split launches of PlanOptions::even_shares, their own
// instantiation so that the others keep their code) tasks [slot · n, … + n) one after the
// other, n = AttentionArgs::tasks_per_block, where a block's share of pages can end one list
// and start the next; slot = blockIdx.x, or with sm_claims the slot the block claimed. A task's
// return is the end of that task.
// SH launches with a.block_clock (measure_sm_rates, which plans even shares): the block writes
// its SM and its start and end times; the other instantiations have no clock code.
template <int D, int WARPS, int PW, bool UNI, bool FM, bool SH>
__global__ void __launch_bounds__(WARPS * 32, 1) attention_kernel(const AttentionArgs a) {
  dev::dependent_start();
  if constexpr (SH) {
    __shared__ uint64_t t0;  // (shared: no register held across the tasks)
    if (a.block_clock && threadIdx.x == 0) {
      uint64_t t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      t0 = t;
    }
    const int n = a.tasks_per_block > 1 ? a.tasks_per_block : 1;
    const int slot = a.sm_claims ? claim_sm_slot(a) : static_cast<int>(blockIdx.x);
    for (int j = 0; j < n; ++j) attention_task<D, WARPS, PW, UNI, FM, SH>(a, slot * n + j);
    if (a.sm_claims) release_sm_slots(a);
    if (!a.block_clock) return;
    __syncthreads();  // every warp of the block is done
    if (threadIdx.x != 0) return;
    uint64_t t1;
    uint32_t sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    int64_t* c = a.block_clock + 3 * static_cast<int64_t>(blockIdx.x);
    c[0] = static_cast<int64_t>(sm);
    c[1] = static_cast<int64_t>(t0);
    c[2] = static_cast<int64_t>(t1);
  } else {
    attention_task<D, WARPS, PW, UNI, FM, SH>(a, static_cast<int>(blockIdx.x));
  }
}

// One warp per merged row: block (x, y) takes rows y·W … y·W + W − 1 of merge task x (W warps),
// so a decode merge of 32 rows × 17 splits runs on 32 warps, not 4 (v3–v5: one block per task,
// each warp walking 8 rows one after another, ~7 dependent L2 round trips per row); each warp
// runs merge_row.
template <int D>
__global__ void merge_kernel(const AttentionArgs a) {
  dev::dependent_start();
  const MergeTask M = a.merges[blockIdx.x];
  const int r = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= M.rows) return;
  merge_row<D, false>(a, M, r, threadIdx.x % 32);
}

template <int D, int WARPS, int PW, bool UNI, bool FM = false, bool SH = false>
cudaError_t launch_typed(const AttentionArgs& a, int64_t num_tasks, bool pdl, cudaStream_t stream) {
  constexpr size_t smem = attention_smem_bytes<D>();
  cudaError_t err =
      cudaFuncSetAttribute(attention_kernel<D, WARPS, PW, UNI, FM, SH>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  launch_kernel(attention_kernel<D, WARPS, PW, UNI, FM, SH>, static_cast<unsigned>(num_tasks),
                WARPS * 32, smem, stream, pdl, a);
  return cudaGetLastError();
}

// Page-split launches (PW warps a tile's pages): the instantiation for the merge inside the
// launch (fm: a.merge_tickets) and for blocks running slots (sh: even shares, SM claims, clock).
template <int D, int PW>
cudaError_t launch_page_split(const AttentionArgs& a, int64_t num_tasks, bool pdl,
                              cudaStream_t stream) {
  const bool fm = a.merge_tickets != nullptr;
  const bool sh = a.tasks_per_block > 1 || a.sm_claims != nullptr || a.block_clock != nullptr;
  return fm && sh ? launch_typed<D, 4, PW, false, true, true>(a, num_tasks, pdl, stream)
         : fm     ? launch_typed<D, 4, PW, false, true>(a, num_tasks, pdl, stream)
         : sh     ? launch_typed<D, 4, PW, false, false, true>(a, num_tasks, pdl, stream)
                  : launch_typed<D, 4, PW, false>(a, num_tasks, pdl, stream);
}

template <int D>
cudaError_t launch_dim(const AttentionArgs& a, int64_t num_tasks, int warps, int page_warps,
                       bool unions, bool pdl, cudaStream_t stream) {
  if constexpr (D <= tiles::kUnionMaxHeadDim) {
    if (unions)
      return warps == 8 ? launch_typed<D, 8, 1, true>(a, num_tasks, pdl, stream)
                        : launch_typed<D, 4, 1, true>(a, num_tasks, pdl, stream);
  }
  if (warps == 8) return launch_typed<D, 8, 1, false>(a, num_tasks, pdl, stream);
  if constexpr (D <= tiles::kPageSplitMaxHeadDim) {
    if (page_warps == 4) return launch_page_split<D, 4>(a, num_tasks, pdl, stream);
    if (page_warps == 2) return launch_page_split<D, 2>(a, num_tasks, pdl, stream);
  }
  return launch_typed<D, 4, 1, false>(a, num_tasks, pdl, stream);
}

}  // namespace

cudaError_t launch_attention(const AttentionArgs& a, int64_t num_tasks, int warps, int page_warps,
                             bool unions, bool pdl, cudaStream_t stream) {
  if (num_tasks <= 0) return cudaSuccess;
  switch (a.head_dim) {
    case 64:
      return launch_dim<64>(a, num_tasks, warps, page_warps, unions, pdl, stream);
    case 128:
      return launch_dim<128>(a, num_tasks, warps, page_warps, unions, pdl, stream);
    case 256:
      return launch_dim<256>(a, num_tasks, warps, page_warps, unions, pdl, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_merge(const AttentionArgs& a, int64_t num_merges, int max_rows,
                         cudaStream_t stream) {
  if (num_merges <= 0) return cudaSuccess;
  constexpr int W = tiles::kMergeThreads / 32;
  const dim3 grid(static_cast<unsigned>(num_merges), static_cast<unsigned>((max_rows + W - 1) / W));
  switch (a.head_dim) {
    case 64:
      launch_dependent(merge_kernel<64>, grid, tiles::kMergeThreads, 0, stream, a);
      break;
    case 128:
      launch_dependent(merge_kernel<128>, grid, tiles::kMergeThreads, 0, stream, a);
      break;
    case 256:
      launch_dependent(merge_kernel<256>, grid, tiles::kMergeThreads, 0, stream, a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
