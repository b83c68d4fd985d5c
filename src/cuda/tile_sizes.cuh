// Every tuning constant of the CUDA backend, with the reason for each.
#pragma once

namespace cisa::cuda::tiles {

// Page size the kernels are built for: one page = one 16-token step of the mma k dimension
// (m16n8k16), so a page never straddles two k-steps. SPEC's default B.
constexpr int kPageSize = 16;

// ---- attention (attention.cu) ----
// Rows of one warp: the M of mma.m16n8k16. A block has 4 or 8 warps → 64 or 128 query rows,
// so G·h_g = 128 rows (4:1 with G = 32, 32:1 with G = 4) share one read of every page.
constexpr int kRowsPerWarp = 16;
// Tokens per pipeline stage: 4 pages (64 tokens) at d ≤ 128 keeps S = 16×64 f32 per warp in 32
// registers and one stage of K+V at 64·128·2·2 B = 32 KB;
// at d = 256 two pages, so the O accumulator (128 registers) leaves room for S and Q.
template <int D>
constexpr int kStageTokens = D >= 256 ? 32 : 64;
// Pipeline depth: v1 double-buffered (one 32 KB stage in flight per block while the other is
// consumed) and reached 2.72 TB/s on sparse decode; three stages keep two in flight. At d = 128:
// 3 × 32 KB + 6 KB of page IDs = 102 KB per block, two blocks per SM.
constexpr int kStages = 3;
// Page IDs and chunk indices staged in shared memory per pass (2 × 2 KB): a decode split
// (~128 pages) takes one pass; a prefill list of 4,225 pages nine.
constexpr int kSegPages = 512;
// Shared K/V rows up to this head dim are unpadded with XOR-swizzled 16-byte chunks (attention.cu,
// v9: every 128-byte line of global memory lands in one 128-byte line of shared memory, which
// cp.async needs to fetch it in one request). Above it (d = 256: 255 registers, and the swizzle's
// two more spill) rows are padded by kSmemPad bf16 elements: 16 bytes shifts consecutive token
// rows by 4 banks, so ldmatrix's 8 row reads hit 8 distinct 16-byte bank groups.
constexpr int kSwizzleMaxHeadDim = 128;
constexpr int kSmemPad = 8;
// Lists of at most 16 (32) rows, 4 warps: the warps split each tile's 4 pages 4 (2) ways, each
// running the mma and softmax of 1 (2) pages, merged at the end (attention.cu). Up to d = 128:
// at d = 256 a tile holds 2 pages and the kernel has no registers to spare.
constexpr int kPageSplitMaxHeadDim = 128;
// Split-KV: aim for this many thread blocks per SM in total, and never give a split fewer than
// kMinSplitPages pages (below that the merge costs more than the parallelism gains).
constexpr int kBlocksPerSmTarget = 4;
constexpr int kMinSplitPages = 64;
// Page-split (decode) plans: splits = ⌊SMs · this / row tiles⌋, one wave of the decode kernel
// (2 blocks per SM, shared-memory bound). Measured v6 (H200, same session, new merge): 2 → 4:1
// 0.156 ms, 32:1 0.322, 32:2 0.297; 4 → 0.161 / 0.334 / 0.304; 6 and 8 slower still. v5 rounded
// splits up (32 lists × 17 = 544 tasks on 264 slots: a third wave of 16 tasks).
constexpr int kDecodeBlocksPerSm = 2;
// PlanOptions::batch_invariant: a list of one query position splits into one task per this many
// pages (whatever else the batch holds); lists of more positions never split.
constexpr int kInvariantSplitPages = 128;

// ---- attention on warpgroup MMA (attention_wgmma.cu, v4) ----
// Full row tiles (64 or 128 rows, no unions, no page-split warps) at d = 128 run Q·Kᵀ and P·V as
// wgmma (sm_90a): mma.sync peaked at ~236 TFLOP/s on prefill (v3); wgmma issues a 64-row
// warpgroup's MMA at once from registers (Q, P) and shared memory (K, V). Off: every launch
// uses the mma.sync kernel (also per plan: PlanOptions::attention_kernel = kMma, for A/B runs).
constexpr bool kWgmmaAttention = true;
// Keys per tile. Two warpgroups (128-row tiles, one 256-thread block per SM at ~230 registers):
// 128 keys, S = 64 × 128 f32 per warpgroup (64 registers per thread, m64n128 for Q·Kᵀ as for
// P·V), one stage of K+V = 64 KB; v4c ran 64 keys (m64n64) at 349 TFLOP/s dense. One warpgroup
// (64-row tiles): 64 keys, 32 KB per stage, so two blocks share an SM.
constexpr int kWgTileTokens2 = 128;
constexpr int kWgTileTokens1 = 64;
// Pipeline depth. The kernel reads two tiles at once (V of tile j, K of tile j + 1), so copies
// run ST − 2 tiles ahead. Two warpgroups: 3 × 64 KB = 192 KB (of 227). One warpgroup: 3 × 32 KB.
constexpr int kWgStages2 = 3;
constexpr int kWgStages1 = 3;
// v6: 128-row tiles run the warp-specialised kernel (attention_wgmma_ws.cu): a producer warp
// fills the stages, the two consumer warpgroups wait on per-stage mbarriers and take turns on
// the tensor cores (FlashAttention-3's structure). 288 threads, one block per SM (registers:
// 224 per thread). Off: the v4/v5 kernel above for 128-row tiles too.
constexpr bool kWgmmaWarpSpecialized = true;
constexpr int kWsTileTokens = 128;
// 3 × (32 KB K + 32 KB V) = 192 KB; a fourth stage would pass the 227 KB per block.
constexpr int kWsStages = 3;
// Producer warps that copy (of the producer warpgroup's 4), each 8 / this pages of a tile: one
// warp issues 128 16-byte cp.async per lane per tile on one scheduler.
constexpr int kWsCopyWarps = 4;
// Tiles of at most 64 rows (4:1 G = 16, 32:2 G = 4) on the same kernel, two tasks per block
// (one per consumer warpgroup, 64-key tiles, one ring each). Off: the v4 one-warpgroup kernel.
constexpr bool kWsPairedTiles = true;

// ---- scoring (score.cu, score_prefill.cu) ----
// Chunks per block: 64 representatives (16 KB at d = 128) are read once into shared memory and
// scored against up to 64 index queries at a time (4 chunks × 4 queries per thread: 8 shared
// loads per 16 FMAs).
// Up to 64 queries per pass: 4 query slots × 16 (QA = 1, 2 or 4 chosen by the largest stream, so
// a stream of 16 groups does not pay for 64).
constexpr int kScoreChunks = 64;
constexpr int kScoreThreads = 256;
// Streams with at most this many lists (decode: 1) use the few-lists kernel instead: there the
// tile kernel computed 63 empty query slots and ran 0.94 ms where reading the 0.27 GB of
// representatives takes ~0.07 ms.
constexpr int kScoreFewLists = 8;
// Chunks per block of the few-lists kernel: their page IDs (2 KB) are read in one coalesced
// sweep before any representative, so the block pays one block-table latency, not one per
// chunk; 512 chunks at d = 128 are 128 KB of representatives, 4 rounds of 8 loads per lane.
constexpr int kScoreFewChunks = 512;
// Tiles of kScoreFewChunks chunks a few-list block scores one after the other (blocks
// blockIdx.x + i·gridDim.x), paying its setup once per block (PlanOptions::score_tiles_per_block
// overrides it). Measured (H200, 2026-12-06, int8 decode scoring ms at 4:1 / 32:1 / 32:2, two
// runs each): 1 tile 0.054 / 0.104–0.105 / 0.097–0.098, 2 tiles 0.052 / 0.103 / 0.093–0.095,
// 4 tiles 0.059 / 0.100–0.103 / 0.093, 8 tiles 0.055–0.056 / 0.106–0.107 / 0.099, one wave of
// blocks (6 / 11 / 6 tiles) 0.054–0.056 / 0.103–0.105 / 0.094. The register bound below, not
// the loop, made most of the gain over the earlier kernel (0.065 / 0.126 / 0.118).
constexpr int kScoreFewTilesPerBlock = 2;
// Blocks per SM the few-list kernel asks of the register allocator for one list per stream (every
// decode list), at 256 threads: int8 at most 80 registers a thread (3 blocks; unbounded it took
// 112, two blocks an SM), bf16 at most 64 (4 blocks, as it had unbounded before the tile loop);
// no spills at any head dim. With the keep flag read after the other setup reads (score.cu) it
// took decode scoring from 0.065 to 0.054 ms (int8) and 0.087 to 0.078 (bf16) at 4:1 x 16
// (H200, 2026-12-06, bench/results/decode_h200_2026-12-06/).
constexpr int score_few_min_blocks(bool int8) {
  return int8 ? 3 : 4;
}

// Streams of more lists with mean representatives at d ≤ 128 (prefill) use score_regs_kernel:
// one chunk written per thread (kScoreThreads chunks per block), representatives held in
// registers (4 lanes × 4 chunks, D/2 registers per lane), index queries staged in shared memory
// this many at a time (32 KB at d = 128; 64 covers G = 8 and up in one pass, G = 4 in two).
constexpr int kScoreRegsQueries = 64;
// The same streams on bf16 tensor cores (score_mma_kernel, mma.sync with the index query split
// into three exact bf16 terms): the FMA kernel above is issue-bound at ~180 instructions per
// query per warp of 32 chunks (measured v5: G = 4 1.24 ms, G = 32 0.21 ms). Off: score_regs_kernel.
constexpr bool kScoreMma = true;
// Queries staged per pass, as three bf16 terms with 16 bytes of row padding: 26 KB at d = 128.
constexpr int kScoreMmaQueries = 32;
// Threads (and chunks) per block of the tensor-core kernel (blocks per SM: 512 / this, at 128
// registers). Measured (v5b, with the query split moved out of the blocks): 128-thread blocks,
// meant to interleave the blocks' load phases, were slower than 256 at G = 4 (score 0.73 → 0.84
// ms) and equal at G = 32 (0.167 / 0.165).
constexpr int kScoreMmaThreads = 256;

// ---- top-k (topk.cu) ----
// A cluster of kTopkCluster blocks per list, each owning 1/kTopkCluster of its scores (≤ 256 KB
// per list, L2-resident), 4 radix passes plus a count and an ordered compaction over its slice.
// Decode has 16–32 lists: 8 blocks each put 128–256 blocks on the 132 SMs instead of 16–32.
// 8 is the portable cluster size limit.
constexpr int kTopkClusterThreads = 512;
constexpr int kTopkCluster = 8;
// Cluster blocks an SM holds (the kernel's register bound: 64 a thread at 2). At one (103
// registers) a cluster of 8 took 8 SMs of one GPC, and ncu on an H100 counted 15 clusters at
// once (GPCs of 14-18 SMs): the 16 lists of a 4:1 x 16 decode step ran in two waves, the 32 of
// 32:1 in three (SMs active 48 % of the kernel's 41 µs, call5_h100_ncu of 2026-12-06).
constexpr int kTopkClusterBlocksPerSm = 2;
// Measured (H200, v3): clusters took decode top-k from 0.074 to 0.033 ms (16 lists) but prefill
// from 1.14 to 1.96 ms (2,048 lists) and 0.15 to 0.25 ms (256 lists): clusters only up to 64
// lists (512 blocks); beyond, one block of kTopkThreads per list.
constexpr int kTopkClusterMaxLists = 64;
// Short lists keep one block each too: with 8,192 scores per list (16 x 128K decode, 64 lists) a
// cluster block's slice is 1,024 scores, 2 per thread, and the passes are bound by the cluster
// barriers (47 µs per layer measured with ncu, 2026-12-02), where one 1,024-thread block sweeps
// its list in one load per pass. Clusters from this many scores of the longest list on.
constexpr int kTopkClusterMinScores = 16384;
constexpr int kTopkThreads = 1024;
// Keys per thread a cluster block holds in registers across its radix passes (topk_radix.cuh):
// 16 x 512 = 8,192, a 65,536-score list (2 x 1M decode) over a cluster of 8. The 1,024-thread
// blocks of one list each (64 registers a thread) keep none.
constexpr int kTopkCachedKeys = 16;
// Top-k v7 (topk_staged.cu, PlanOptions::topk_staged): one block of kTopkStagedThreads a list,
// the top 16 bits of each key staged in shared memory (2 bytes a key: at most kTopkStagedMaxKeys
// a list, 144 KB, with the candidate slots and the radix state ~200 KB, one block an SM), at most
// kTopkStagedCandidates keys tied with the threshold's top 16 bits resolved from their full keys
// (more: the list falls back to the radix select from global memory).
constexpr int kTopkStagedThreads = 1024;
constexpr int kTopkStagedMaxKeys = 73728;
constexpr int kTopkStagedCandidates = 4096;

// ---- KV-outer unions (unions.cu) ----
// Lists of at most 16 rows (one warp: 4:1 with G = 4) are attended in unions of up to this many
// consecutive QShare groups: one block, one warp per group, each page of the union read once.
// Adjacent groups share ~83 % of their pages in the benchmark (paper: 88 %), so 4 groups read
// ~1.5 lists' worth of pages instead of 4, and the block's 4 warps all compute (v2 ran one
// active warp of 4 on such lists: 65 TFLOP/s).
constexpr int kUnionGroups = 4;
// Unions only up to this head dim: at d = 256 the attention kernel is at 255 registers already.
constexpr int kUnionMaxHeadDim = 128;
constexpr int kUnionThreads = 512;
// The union kernel keeps a 4-bit member mask per chunk of the sequence in shared memory; longer
// sequences (over 3.1 M tokens) fall back to one block per list.
constexpr int kUnionMaxSmem = 96 * 1024;

// ---- representatives, page lists, merge ----
constexpr int kRepThreads = 128;
constexpr int kAssembleThreads = 256;
// Entries per thread of one assembly block (a block writes 2,048 entries of one list).
constexpr int kAssembleItems = 8;
// One warp per merged row (attention.cu); 4 rows per block.
constexpr int kMergeThreads = 128;

}  // namespace cisa::cuda::tiles
