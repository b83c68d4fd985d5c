// Paged attention on warpgroup MMA with warp specialisation (FlashAttention-3's structure) for
// prefill tiles at head dim 128 (v6). Same tasks, masks, LSE and split-KV partials as
// attention_wgmma.cu; what changes is who waits for what:
//   warps 8–11 (producers; CW of them copy, kWsCopyWarps): read the task's page IDs themselves
//     (32 at a time, one window ahead) and copy K and V of each tile in place by page ID
//     (cp.async, 128-byte swizzle) into a kWsStages-deep ring. Each stage has a "full" mbarrier
//     (one cp.async arrival per copying lane, fired when its copies land, plus one after the
//     tile's page starts) and an "empty" one (one arrival per consumer warp once its P·V has
//     read the stage). No block-wide barrier per tile.
//   warpgroups 0 and 1 (consumers, 64 rows each): per tile S = Q·Kᵀ, online softmax, O += P·V,
//     S of tile j + 1 issued with P·V of tile j.
// One task of up to 128 rows per block (PAIR = false, 128-key tiles): both warpgroups read one
// ring and take turns issuing their MMAs (named barriers 1 and 2): warpgroup g issues, hands the
// turn over and does its softmax while the other's MMAs run. In v4 both warpgroups met at one
// barrier per tile and issued at once, and ptxas put the wait for a warpgroup's own P·V before
// its exponentials (docs/cuda-notes.md, v4g–v4j), so the softmax overlapped nothing.
// Two tasks of up to 64 rows per block (PAIR = true, 64-key tiles): warpgroup g takes task
// 2b + g with its own ring and two of the copy warps; no turns (the tasks end at different tiles).
// Union tasks (UNI, paired only): a task reads the union of up to 4 adjacent small QShare groups'
// lists once, and warp w of its warpgroup takes member w's rows (all of them: ≤ 16); a page that
// member w did not choose is masked for that warp like a future page. The warpgroup's MMAs still
// cover all 64 rows of every page (wgmma is issued per warpgroup), as mma.sync's union tasks did
// per warp; what the union saves is the reads (docs/cuda-notes.md, v10).
//
//   launch_attention_wgmma_ws(args, num_tasks, /*paired=*/rows_per_tile <= 64, copy_warps,
//                             /*unions=*/plan has union tasks, stream);
#include <climits>

#include "attention_rows.cuh"
#include "attention_wgmma.cuh"
#include "attention_wgmma_tile.cuh"
#include "common.cuh"
#include "mbarrier.cuh"
#include "pdl.cuh"
#include "tile_sizes.cuh"
#include "wgmma.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kD = kWgHeadDim;
constexpr int B = tiles::kPageSize;
constexpr int ST = tiles::kWsStages;
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
// Registers per thread after setmaxnreg: a multiprocessor's four quarters each hold 16,384
// registers and 3 of the 12 warps (2 consumer warps + 1 producer warp): 2 · 224 · 32 + 56 · 32
// = 16,128. The launch bound (384 threads, 1 block) caps the kernel at 168 at entry. (A 9-warp
// block without setmaxnreg gets 168 too: one quarter holds three of its warps; it failed to
// launch at 224.) The producer spilled at 40.
constexpr int kConsumerRegs = 224;
constexpr int kProducerRegs = 56;
static_assert(ST >= 3, "tiles j, j + 1 are read while later ones land");
// Union tasks (UNI) carry each page's member mask in the low bits of its first position.
constexpr int32_t kMaskBits = B - 1;
constexpr int32_t kAllMembers = (1 << tiles::kUnionGroups) - 1;
static_assert(kAllMembers <= kMaskBits, "a page's member mask fits below its first position");

// PAIR = false: one task of up to 128 rows per block, 128-key tiles (S = m64n128), one ring of
// stages read by both consumer warpgroups, which take turns on the tensor cores. PAIR = true:
// two tasks of up to 64 rows per block (tasks 2b and 2b + 1, one per consumer warpgroup),
// 64-key tiles (m64n64), one ring per task filled by two of the copy warps, no turns (the two
// tasks end at different tiles). Both use 3 × 64 KB of stages.
template <bool PAIR>
struct WsShape {
  static constexpr int NT = PAIR ? tiles::kWsTileTokens / 2 : tiles::kWsTileTokens;
  static constexpr int NP = NT / B;
  static constexpr int RINGS = PAIR ? 2 : 1;
  static constexpr int kTileBytes = NT * kD * 2;  // K (or V) of one tile
  static constexpr uint32_t kHalfBytes = kWgHalfBytes<NT>;
  static constexpr int kMeta = NP + 2;  // page starts, valid flag, padding (8-byte multiple)
  static_assert(NT == 64 || NT == 128, "one m64n64 or m64n128 score tile");
  static_assert(NP <= 8, "the producer's page-ID window holds 32 / NP tiles of 32 lanes");
};

template <bool PAIR>
constexpr size_t ws_smem_bytes() {
  using S = WsShape<PAIR>;
  return S::RINGS * (size_t{2} * ST * S::kTileBytes + sizeof(int32_t) * ST * S::kMeta +
                     sizeof(uint64_t) * 2 * ST) +
         kSw128AtomBytes;
}

// The barrier receives this thread's arrival once all of its earlier cp.async copies have landed
// (noinc: the arrival is part of the count the barrier was initialised with).
__device__ __forceinline__ void mbar_arrive_on_copies(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(dev::smem_addr(b))
               : "memory");
}
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}

// CW: producer warps that copy; RW = CW / RINGS of them fill a ring, each NP / RW pages of every
// tile. num_tasks: tasks of the launch (PAIR: the last block may hold one). UNI: the launch holds
// union tasks (paired tiles only).
template <int CW, bool PAIR, bool UNI>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_ws_kernel(const AttentionArgs a, int64_t num_tasks) {
  dev::dependent_start();
  static_assert(!UNI || PAIR, "union tasks are 16-row lists: paired tiles");
  using S = WsShape<PAIR>;
  constexpr int NT = S::NT, NP = S::NP, kTileBytes = S::kTileBytes, kMeta = S::kMeta;
  constexpr uint32_t kHalfBytes = S::kHalfBytes;
  constexpr int RW = CW / S::RINGS;
  static_assert(CW >= 1 && CW <= 4 && RW >= 1 && NP % RW == 0,
                "copy warps split a ring's tile pages evenly");
  extern __shared__ __align__(128) uint8_t smem_w[];
  const uint32_t s0 = dev::smem_addr(smem_w);
  uint8_t* base = smem_w + (((s0 + kSw128AtomBytes - 1) & ~(kSw128AtomBytes - 1)) - s0);
  // Rings [RINGS] of K stages [ST][kTileBytes] then V stages; then meta [RINGS][ST][kMeta],
  // full [RINGS][ST], empty [RINGS][ST].
  int32_t* meta_all = reinterpret_cast<int32_t*>(base + S::RINGS * 2 * ST * kTileBytes);
  uint64_t* full_all = reinterpret_cast<uint64_t*>(meta_all + S::RINGS * ST * kMeta);
  uint64_t* empty_all = full_all + S::RINGS * ST;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4;  // 0, 1: consumers; 2: producers
  // Task, list and stage ring of a warp. Two tasks per block: computed after setmaxnreg (values
  // live across it were spilled at the entry's 168-register cap).
  const int hg = a.num_q_heads / a.num_kv_heads;
  int64_t task;
  AttnTask t;
  ListDesc L;
  uint8_t *ks, *vs;
  int32_t* meta;
  uint64_t *full, *empty;
  auto setup = [&](int ring) {
    task = PAIR ? 2 * static_cast<int64_t>(blockIdx.x) + ring : blockIdx.x;
    if (task >= num_tasks) return false;
    t = a.tasks[task];
    L = a.lists[t.list];
    ks = base + ring * 2 * ST * kTileBytes;
    vs = ks + ST * kTileBytes;
    meta = meta_all + ring * ST * kMeta;
    full = full_all + ring * ST;
    empty = empty_all + ring * ST;
    return true;
  };
  // One task per block: set up before the barrier, as v6 measured it (setting up after
  // setmaxnreg here made dense prefill 9 % slower in the same session, cause not found).
  if constexpr (!PAIR) setup(0);
  if (threadIdx.x == 0) {
    const int n_wg0 = PAIR ? 1 : a.tasks[blockIdx.x].rows > 64 ? 2 : 1;
    for (int s = 0; s < S::RINGS * ST; ++s) {
      dev::mbar_init(&full_all[s], 32 * RW + 1);
      dev::mbar_init(&empty_all[s], 4 * n_wg0);  // one arrival per consumer warp with rows
    }
    dev::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    // Warps past CW give their registers to the consumers only.
    const int pw = CW == 1 ? 0 : warp - kConsumerThreads / 32;
    if (warp - kConsumerThreads / 32 >= CW) return;
    if constexpr (PAIR) {
      if (!setup(pw / RW)) return;
    }
    // A union task reads its union's list; its last query is its last member's.
    const bool uni = UNI && t.members > 0;
    const int32_t tmax = task_last_pos(a, t, L, uni, hg);
    const int sub = CW == 1 ? 0 : pw % RW;  // this warp's share of the ring's tiles
    // ---- producer warps ----
    const int64_t n_pages = uni ? a.ucounts[t.union_id] : t.page1 - t.page0;
    const int64_t n_tiles = (n_pages + NP - 1) / NP;
    // Lane l holds page wbase + l of the current window (physical ID, first position or
    // INT_MAX / 2 past the task) and the same of the next window, loaded one window ahead. UNI:
    // the first position's low 4 bits (zero: B = 16) carry the page's member mask (all four for
    // a task that is not a union), and INT_MAX marks a page past the task. (The producer has 56
    // registers: the mask in registers of its own spilled.)
    auto load_ids = [&](int64_t first, int32_t& pid, int32_t& cs) {
      const int64_t pi = first + lane, e = t.page0 + pi;
      if (UNI && uni) {
        pid = pi < n_pages ? a.upages[e] : 0;
        cs = pi < n_pages ? a.uchunks[e] * B | a.umask[e] : INT_MAX;
      } else {
        pid = pi < n_pages ? a.pages[e] : 0;
        cs = pi < n_pages ? a.chunks[e] * B | (UNI ? kAllMembers : 0) : UNI ? INT_MAX : INT_MAX / 2;
      }
    };
    int64_t wbase = 0;
    int32_t pid_c, cs_c, pid_n, cs_n;
    load_ids(0, pid_c, cs_c);
    load_ids(32, pid_n, cs_n);
    // Piece i of a page for this lane: token lane / 16 + 2i, channels 8·(lane % 16) … +7, so a
    // warp's copy reads 512 contiguous bytes; its place in the swizzled tile is fixed per lane.
    const int c16 = lane % 16;
    const uint32_t so0 = (c16 / 8) * kHalfBytes;
    auto so = [&](int i) { return so0 + dev::sw128_offset(lane / 16 + 2 * i, c16 % 8); };
    const int64_t src_lane = (lane / 16) * kD + c16 * 8;
    for (int64_t j = 0;; ++j) {
      const int stage = static_cast<int>(j % ST);
      if (j >= ST) dev::mbar_wait(&empty[stage], static_cast<uint32_t>((j / ST - 1) & 1));
      const int64_t p0 = j * NP;
      if (p0 >= wbase + 32) {
        wbase += 32;
        pid_c = pid_n;
        cs_c = cs_n;
        load_ids(wbase + 32, pid_n, cs_n);
      }
      const int sl = static_cast<int>(p0 - wbase);
      // Pages ascend: a tile that starts after the task's last query ends the task.
      const bool valid =
          j < n_tiles && (__shfl_sync(0xffffffffu, cs_c, sl) & (UNI ? ~kMaskBits : ~0)) <= tmax;
      int32_t* mt = meta + stage * kMeta;
      if (valid) {
#pragma unroll
        for (int p = sub * (NP / RW); p < (sub + 1) * (NP / RW); ++p) {
          const int32_t pid = __shfl_sync(0xffffffffu, pid_c, sl + p);
          const int bytes = p0 + p < n_pages ? 16 : 0;  // zero-filled, masked by its page start
          const int64_t off =
              (static_cast<int64_t>(pid) * a.num_kv_heads + L.kv) * B * kD + src_lane;
          uint8_t* kd = ks + stage * kTileBytes + p * B * 128;
          uint8_t* vd = vs + stage * kTileBytes + p * B * 128;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            dev::cp_async16(kd + so(i), a.k + off + 2 * i * kD, bytes);
            dev::cp_async16(vd + so(i), a.v + off + 2 * i * kD, bytes);
          }
        }
        const int32_t cs = __shfl_sync(0xffffffffu, cs_c, sl + (lane % NP));
        if (sub == 0 && lane < NP) mt[lane] = cs;  // (UNI: with its member mask)
      }
      if (sub == 0 && lane == 0) mt[NP] = valid ? 1 : 0;
      __syncwarp();
      mbar_arrive_on_copies(&full[stage]);
      if (sub == 0 && lane == 0)
        dev::mbar_arrive(&full[stage]);  // after the page starts and the flag
      if (!valid) break;
    }
    dev::cp_async_wait<0>();
    return;
  }

  // ---- consumer warpgroups ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  // No rows (or no task): not counted by the empty barriers, takes no turns.
  if constexpr (PAIR) {
    if (!setup(wg)) return;
  }
  const int n_wg = PAIR ? 1 : t.rows > 64 ? 2 : 1;
  if (!PAIR && wg >= n_wg) return;
  const bool pingpong = !PAIR && n_wg == 2;
  const int gr = lane >> 2, tq = lane & 3;
  // Union task: warp w takes all rows of member w (warps past the members mask every page and
  // write nothing); else rows 16w … 16w + 15 of the task's tile.
  const int mw = warp % 4;
  const bool uni = UNI && t.members > 0;
  const bool writes = !uni || mw < t.members;  // warps past a union's members write nothing
  if (uni) L = a.lists[t.list + union_member_offset(t, mw)];
  const int row_base = uni ? 0 : (PAIR ? 0 : wg * 64) + mw * 16;
  const int rows = task_rows(t, L, uni, hg);
  int32_t pos[2];  // the two rows of this thread and Q as the register A operand
  uint32_t qf[kD / 16][4];
  load_q_rows<kD>(a, L, t.row0, row_base, rows, gr, tq, pos, qf);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
  const float sl2 = a.scale * kAttnLog2e;
  float s[NT / 2];          // scores of the tile being softmaxed, then its P (f32)
  uint32_t pa[NT / 16][4];  // P of the tile whose P·V is issued

  // S = Q·Kᵀ and O += P·V of the tile in `stage` (issued, not waited;
  // attention_wgmma_tile.cuh).
  auto issue_s = [&](int stage) { wg_issue_qk<NT>(s, qf, ks + stage * kTileBytes); };
  auto issue_pv = [&](int stage) { wg_issue_pv<NT>(o, pa, vs + stage * kTileBytes); };
  auto wait_full = [&](int j) {  // false: the producer ended the task at tile j
    dev::mbar_wait(&full[j % ST], static_cast<uint32_t>((j / ST) & 1));
    return meta[(j % ST) * kMeta + NP] != 0;
  };
  auto softmax = [&](int j) {
    int32_t cstart[NP];
#pragma unroll
    for (int p = 0; p < NP; ++p) {
      cstart[p] = meta[(j % ST) * kMeta + p];
      if constexpr (UNI)  // a page this warp's member did not choose is masked like a future one
        cstart[p] = (cstart[p] >> mw) & 1 ? cstart[p] & ~kMaskBits : INT_MAX / 2;
    }
    wg_softmax_step<NT, B, UNI>(s, cstart, pos, a.window, sl2, tq, m, l, corr);
  };
  auto release = [&](int j) {  // this warp's MMAs no longer read the stage of tile j
    __syncwarp();
    if (lane == 0) dev::mbar_arrive(&empty[j % ST]);
  };
  // Turns: warpgroup g waits on barrier 1 + g (its own 128 threads + the other's 128 arrivals)
  // and passes the turn by arriving on the other's. Warpgroup 1 lets warpgroup 0 go first.
  auto turn_wait = [&]() {
    if (pingpong) named_sync(1 + wg);
  };
  auto turn_pass = [&]() {
    if (pingpong) named_arrive(2 - wg);
  };
  if (pingpong && wg == 1) named_arrive(1);

  if (wait_full(0)) {
    dev::fence_proxy_async();  // the copies (generic proxy) are read by wgmma (async proxy)
    turn_wait();
    dev::wgmma_fence();
    issue_s(0);
    dev::wgmma_commit();
    turn_pass();
    dev::wgmma_wait<0>();
    dev::fence_regs(s);
    softmax(0);
    wg_rescale_pack<kD, NT>(o, corr, s, pa);
    int j = 0;
    for (;; ++j) {
      if (!wait_full(j + 1)) break;
      dev::fence_proxy_async();
      turn_wait();
      dev::fence_regs(o);
      dev::fence_regs(pa);  // O and P written before the MMAs that read them start
      dev::wgmma_fence();
      issue_s((j + 1) % ST);
      dev::wgmma_commit();
      issue_pv(j % ST);
      dev::wgmma_commit();
      turn_pass();
      dev::wgmma_wait<1>();  // S of tile j + 1 (P·V of tile j may still run)
      dev::fence_regs(s);
      softmax(j + 1);
      dev::fence_regs(s);
      dev::wgmma_wait<0>();
      dev::fence_regs(o);
      dev::fence_regs(pa);  // pa was read by the P·V until here
      release(j);
      wg_rescale_pack<kD, NT>(o, corr, s, pa);
    }
    turn_wait();  // P·V of the last tile
    dev::fence_regs(o);
    dev::fence_regs(pa);
    dev::wgmma_fence();
    issue_pv(j % ST);
    dev::wgmma_commit();
    turn_pass();
    dev::wgmma_wait<0>();
    dev::fence_regs(o);
    release(j);
  }
  if (!writes) return;
  store_rows<kD>(a, L, static_cast<int>(task), t.row0, row_base, rows, gr, tq, o, m, l);
}

template <int CW, bool PAIR, bool UNI = false>
cudaError_t launch_cw(const AttentionArgs& a, int64_t num_tasks, bool pdl, cudaStream_t stream) {
  constexpr size_t smem = ws_smem_bytes<PAIR>();
  cudaError_t err =
      cudaFuncSetAttribute(attention_wgmma_ws_kernel<CW, PAIR, UNI>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const int64_t blocks = PAIR ? (num_tasks + 1) / 2 : num_tasks;
  launch_kernel(attention_wgmma_ws_kernel<CW, PAIR, UNI>, static_cast<unsigned>(blocks), kThreads,
                smem, stream, pdl, a, num_tasks);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_attention_wgmma_ws(const AttentionArgs& a, int64_t num_tasks, bool paired,
                                      int copy_warps, bool unions, bool pdl, cudaStream_t stream) {
  if (num_tasks <= 0) return cudaSuccess;
  if (a.head_dim != kD || (unions && !paired)) return cudaErrorInvalidValue;
  if (paired)
    return unions ? launch_cw<4, true, true>(a, num_tasks, pdl, stream)
                  : launch_cw<4, true>(a, num_tasks, pdl, stream);
  // copy_warps = 1 copies with one producer warp (A/B runs of kWsCopyWarps).
  return copy_warps == 1 ? launch_cw<1, false>(a, num_tasks, pdl, stream)
                         : launch_cw<tiles::kWsCopyWarps, false>(a, num_tasks, pdl, stream);
}

}  // namespace cisa::cuda::detail
