// Paged attention mainloop on warpgroup MMA (sm_90a), head dim 128.
//
// Per block: rows [row0, row0 + rows) of one list (64 or 128 rows = 1 or 2 warpgroups); warp w
// of warpgroup g owns rows 64g + 16w … +15, and each thread rows lane/4 and lane/4 + 8 of those
// (the accumulator layout of wgmma.h). Per tile of kWgTileTokens keys and for each warpgroup:
//   S (64 × NT)  = Q (64 × 128, registers) · Kᵀ   8 wgmma m64n64k16, K K-major in shared memory
//   online softmax of S in f32 registers (exact masks, as in attention.cu)
//   O (64 × 128) += P (bf16, registers) · V        NT/16 wgmma m64n128k16, V MN-major (trans)
// K and V tiles come in by a kWgStages-deep cp.async pipeline into one shared layout that serves
// K as a K-major B operand and V as an MN-major one: [channel half (64 channels)][token][128 B],
// 128-byte swizzled (wgmma.cuh). v4a used the unswizzled core-matrix layout and ran slower than
// mma.sync (dense prefill 221 vs 236 TFLOP/s). Pages past the block's range are zero-filled and
// masked, like the mma.sync kernel.
#include <cfloat>
#include <climits>

#include "attention_rows.cuh"
#include "attention_wgmma.cuh"
#include "attention_wgmma_tile.cuh"
#include "common.cuh"
#include "pdl.cuh"
#include "tile_sizes.cuh"
#include "wgmma.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kD = kWgHeadDim;

// Tile shape per warpgroup count: keys per tile and pipeline stages (tile_sizes.cuh).
template <int WG>
constexpr int kNT = WG == 2 ? tiles::kWgTileTokens2 : tiles::kWgTileTokens1;
template <int WG>
constexpr int kST = WG == 2 ? tiles::kWgStages2 : tiles::kWgStages1;

// Stages first (1,024-aligned: the base is rounded up, hence the extra 1 KB), then the page IDs.
template <int WG>
constexpr size_t wgmma_smem_bytes() {
  return size_t{2} * kST<WG> * kNT<WG> * kD * 2 + sizeof(int32_t) * 2 * tiles::kSegPages +
         kSw128AtomBytes;
}

template <int WG>
__global__ void __launch_bounds__(WG * 128, 1) attention_wgmma_kernel(const AttentionArgs a) {
  dev::dependent_start();
  constexpr int B = tiles::kPageSize;
  constexpr int NT = kNT<WG>;
  constexpr int kTileBytes = NT * kD * 2;
  constexpr uint32_t kHalfBytes = kWgHalfBytes<NT>;
  constexpr int NP = NT / B;
  constexpr int THREADS = WG * 128;
  constexpr int ST = kST<WG>;
  static_assert(ST >= 3, "the pipeline reads tiles j and j + 1 while tile j + ST − 1 lands");
  constexpr int SEG = tiles::kSegPages;
  static_assert(NT == 64 || NT == 128, "the score tile is one m64n64 or m64n128 accumulator");
  extern __shared__ __align__(128) uint8_t smem_w[];
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_w));
  uint8_t* ks =
      smem_w + (((s0 + kSw128AtomBytes - 1) & ~(kSw128AtomBytes - 1)) - s0);  // [ST][kTileBytes]
  uint8_t* vs = ks + ST * kTileBytes;                                         // same
  int32_t* pid_s = reinterpret_cast<int32_t*>(vs + ST * kTileBytes);          // [kSegPages]
  int32_t* cid_s = pid_s + SEG;                                               // [kSegPages]

  const AttnTask t = a.tasks[blockIdx.x];
  const ListDesc L = a.lists[t.list];
  const int hg = a.num_q_heads / a.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane >> 2, tq = lane & 3;
  const int wg = warp / 4;
  const int row_base = wg * 64 + (warp % 4) * 16;
  const bool wg_active = wg * 64 < t.rows;

  int32_t pos[2];  // the two rows of this thread and Q as the register A operand
  uint32_t qf[kD / 16][4];
  load_q_rows<kD>(a, L, t.row0, row_base, t.rows, gr, tq, pos, qf);
  const int32_t tmax = L.first_pos + (t.row0 + t.rows - 1) / hg;

  const int64_t n_pages = t.page1 - t.page0;
  // Piece e of a tile: token e / 16, channels 8·(e % 16) … +7: 16 consecutive threads read one
  // token row (256 contiguous bytes) and fill its two swizzled 128-byte rows (no bank conflict).
  auto load_tile = [&](int stage, int tile, int seg_n) {
    constexpr int CPR = kD / 8;
#pragma unroll
    for (int e = threadIdx.x; e < NT * CPR; e += THREADS) {
      const int tok = e / CPR, c8 = e % CPR;
      const int pi = tile * NP + tok / B;
      const bool ok = pi < seg_n;
      const int64_t phys = ok ? pid_s[pi] : 0;
      const int64_t off = ((phys * a.num_kv_heads + L.kv) * B + tok % B) * kD + c8 * 8;
      const uint32_t so =
          stage * kTileBytes + (c8 / 8) * kHalfBytes + dev::sw128_offset(tok, c8 % 8);
      dev::cp_async16(ks + so, a.k + off, ok ? 16 : 0);
      dev::cp_async16(vs + so, a.v + off, ok ? 16 : 0);
    }
  };

  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = a.scale * kAttnLog2e;
  float s[NT / 2];          // scores of the tile being softmaxed, then its P (f32)
  uint32_t pa[NT / 16][4];  // P of the tile whose P·V is issued (read by the wgmma in flight)
  float corr[2];

  // S = Q·Kᵀ and O += P·V of the tile in `stage` (issued, not waited; attention_wgmma_tile.cuh).
  auto issue_s = [&](int stage) { wg_issue_qk<NT>(s, qf, ks + stage * kTileBytes); };
  auto issue_pv = [&](int stage) { wg_issue_pv<NT>(o, pa, vs + stage * kTileBytes); };
  // Online softmax of tile `tile` of the segment (attention_rows.cuh); P stays f32 in s until
  // the P·V in flight has finished: packing it into bf16 registers here let the compiler reuse
  // pa's registers, and ptxas then serialised every wgmma (C7513).
  auto softmax = [&](int tile, int seg_n) {
    int32_t cstart[NP];
#pragma unroll
    for (int j = 0; j < NP; ++j) {
      const int pi = tile * NP + j;
      cstart[j] = pi < seg_n ? cid_s[pi] * B : INT_MAX / 2;
    }
    wg_softmax_step<NT, B>(s, cstart, pos, a.window, sl2, tq, m, l, corr);
  };
  // After the P·V in flight has finished: O to the new maximum, next P becomes current.
  // Unconditional: skipping the multiplies when corr is 1 (v4f) measured no different (v4h).
  auto rescale_and_advance = [&]() { wg_rescale_pack<kD, NT>(o, corr, s, pa); };

  // Software pipeline per warpgroup (FlashAttention-3's intra-warpgroup overlap): iteration j
  // issues S of tile j + 1 and P·V of tile j back to back, then the copies of a later tile,
  // softmaxes tile j + 1 while P·V of tile j runs on the tensor cores, then rescales O. Copies
  // run ST − 2 tiles ahead: the copy issued in iteration j goes to the stage of tile j − 1, whose
  // P·V finished in iteration j − 1 (before this iteration's barrier); tiles j (V) and j + 1 (K)
  // are being read.
  bool done = false;
  for (int64_t seg0 = 0; seg0 < n_pages && !done; seg0 += SEG) {
    const int seg_n = static_cast<int>(n_pages - seg0 < SEG ? n_pages - seg0 : SEG);
    __syncthreads();  // the previous segment's IDs and stages are no longer read
    for (int i = threadIdx.x; i < seg_n; i += THREADS) {
      pid_s[i] = a.pages[t.page0 + seg0 + i];
      cid_s[i] = a.chunks[t.page0 + seg0 + i];
    }
    __syncthreads();
    const int n_tiles = (seg_n + NP - 1) / NP;
#pragma unroll
    for (int p = 0; p < ST - 1; ++p) {  // tiles 0 … ST − 2: one commit group each
      if (p < n_tiles) load_tile(p, p, seg_n);
      dev::cp_async_commit();
    }
    dev::cp_async_wait<ST - 2>();  // tile 0
    dev::fence_proxy_async();      // landed tiles are read by wgmma (async proxy)
    __syncthreads();
    if (cid_s[0] * B > tmax) break;  // pages ascend: the rest is in the future of every row
    if (wg_active) {
      dev::wgmma_fence();
      issue_s(0);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::fence_regs(s);
      softmax(0, seg_n);
      rescale_and_advance();
    }
    int j = 0;
    for (;; ++j) {
      // Groups committed so far: tiles 0 … j + ST − 2; tile j + 1 must have landed.
      dev::cp_async_wait<ST - 3>();
      dev::fence_proxy_async();
      __syncthreads();  // tile j + 1 visible to all; stage of tile j − 1 free
      const bool more = j + 1 < n_tiles;
      if (!more || cid_s[(j + 1) * NP] * B > tmax) {
        done = more;  // the rest of the list is in the future of every row
        break;
      }
      if constexpr (WG == 2) {
        if (j + ST - 1 < n_tiles) load_tile((j + ST - 1) % ST, j + ST - 1, seg_n);
        dev::cp_async_commit();
      }
      if (wg_active) {
        dev::fence_regs(o);
        dev::fence_regs(pa);  // O and P written before the MMAs that read them start
        dev::wgmma_fence();
        issue_s((j + 1) % ST);
        dev::wgmma_commit();
        issue_pv(j % ST);
        dev::wgmma_commit();
        // One warpgroup: the copies are issued while the tensor cores run (v4e: 64-row tiles
        // −4 %, 128-row tiles +3 %, so two warpgroups issue them before the MMAs).
        if constexpr (WG == 1) {
          if (j + ST - 1 < n_tiles) load_tile((j + ST - 1) % ST, j + ST - 1, seg_n);
          dev::cp_async_commit();
        }
        dev::wgmma_wait<1>();  // S of tile j + 1 (P·V of tile j may still run)
        dev::fence_regs(s);
        softmax(j + 1, seg_n);
        dev::fence_regs(s);    // keeps the softmax above the wait in the PTX (ptxas may still move
        dev::wgmma_wait<0>();  // the wait up: see docs/cuda-notes.md, v4g/v4h)
        dev::fence_regs(o);
        dev::fence_regs(pa);  // pa was read by the P·V until here
        rescale_and_advance();
      } else if constexpr (WG == 1) {
        if (j + ST - 1 < n_tiles) load_tile((j + ST - 1) % ST, j + ST - 1, seg_n);
        dev::cp_async_commit();
      }
    }
    if (wg_active) {  // P·V of the segment's last tile j (its stage is not overwritten)
      dev::fence_regs(o);
      dev::fence_regs(pa);
      dev::wgmma_fence();
      issue_pv(j % ST);
      dev::wgmma_commit();
      dev::wgmma_wait<0>();
      dev::fence_regs(o);
      dev::fence_regs(pa);
    }
  }
  dev::cp_async_wait<0>();
  if (!wg_active) return;
  store_rows<kD>(a, L, blockIdx.x, t.row0, row_base, t.rows, gr, tq, o, m, l);
}

template <int WG>
cudaError_t launch_typed(const AttentionArgs& a, int64_t num_tasks, bool pdl, cudaStream_t stream) {
  constexpr size_t smem = wgmma_smem_bytes<WG>();
  cudaError_t err =
      cudaFuncSetAttribute(attention_wgmma_kernel<WG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  launch_kernel(attention_wgmma_kernel<WG>, static_cast<unsigned>(num_tasks), WG * 128, smem,
                stream, pdl, a);
  return cudaGetLastError();
}

}  // namespace

bool wgmma_attention_applies(int head_dim, int page_warps, bool unions, int warps, bool v5_tiles) {
  // Union tasks run only on the warp-specialised kernel's paired (64-row) tiles.
  const bool unions_ok =
      !unions || (warps == 4 && !v5_tiles && tiles::kWgmmaWarpSpecialized && tiles::kWsPairedTiles);
  return tiles::kWgmmaAttention && head_dim == kD && page_warps == 1 && unions_ok;
}

cudaError_t launch_attention_wgmma(const AttentionArgs& a, int64_t num_tasks, int warps,
                                   bool v5_tiles, int ws_copy_warps, bool unions, bool pdl,
                                   cudaStream_t stream) {
  if (num_tasks <= 0) return cudaSuccess;
  if (a.head_dim != kD || (warps != 4 && warps != 8)) return cudaErrorInvalidValue;
  if (unions && !wgmma_attention_applies(kD, 1, true, warps, v5_tiles))
    return cudaErrorInvalidValue;
  // v5_tiles (AttentionKernel::kWgmmaV5) keeps every tile on the v4/v5 kernel (A/B runs).
  if (warps == 8)
    return tiles::kWgmmaWarpSpecialized && !v5_tiles
               ? launch_attention_wgmma_ws(a, num_tasks, false, ws_copy_warps, false, pdl, stream)
               : launch_typed<2>(a, num_tasks, pdl, stream);
  return tiles::kWsPairedTiles && !v5_tiles
             ? launch_attention_wgmma_ws(a, num_tasks, true, 0, unions, pdl, stream)
             : launch_typed<1>(a, num_tasks, pdl, stream);
}

}  // namespace cisa::cuda::detail
