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
// registers and one stage of K+V at 64·(128+8)·2·2 B = 34.8 KB, two stages 70 KB (3 blocks/SM);
// at d = 256 two pages, so the O accumulator (128 registers) leaves room for S and Q.
template <int D> constexpr int kStageTokens = D >= 256 ? 32 : 64;
// Pipeline depth: v1 double-buffered (one 32 KB stage in flight per block while the other is
// consumed) and reached 2.72 TB/s on sparse decode; three stages keep two in flight. At d = 128:
// 3 × 34 KB = 104 KB per block, two blocks per SM (the register limit of the 4-warp kernel).
constexpr int kStages = 3;
// Page IDs and chunk indices staged in shared memory per pass (2 × 2 KB): a decode split
// (~128 pages) takes one pass; a prefill list of 4,225 pages nine.
constexpr int kSegPages = 512;
// Row padding of the shared K/V tiles, in bf16 elements: 16 bytes shifts consecutive token rows
// by 4 banks, so ldmatrix's 8 row reads hit 8 distinct 16-byte bank groups.
constexpr int kSmemPad = 8;
// Split-KV: aim for this many thread blocks per SM in total, and never give a split fewer than
// kMinSplitPages pages (below that the merge costs more than the parallelism gains).
constexpr int kBlocksPerSmTarget = 4;
constexpr int kMinSplitPages = 64;

// ---- scoring (score.cu) ----
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

// ---- top-k (topk.cu) ----
// One block per list; 1024 threads read the list's scores (≤ 256 KB, L2-resident) once per
// 8-bit radix pass (4 passes) and once more for the ordered compaction.
constexpr int kTopkThreads = 1024;

// ---- representatives, page lists, merge ----
constexpr int kRepThreads = 128;
constexpr int kAssembleThreads = 256;
constexpr int kMergeThreads = 128;

}  // namespace cisa::cuda::tiles
