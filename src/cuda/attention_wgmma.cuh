// Paged attention on Hopper warpgroup MMA (wgmma, sm_90a) for full prefill row tiles: the same
// tasks, page lists, masking, LSE output and split-KV partials as attention.cuh, with Q·Kᵀ and
// P·V issued per warpgroup (64 query rows) instead of per warp. K/V pages are read in place by
// page ID (cp.async into a 128-byte-swizzled shared layout, no gather). 128-row tiles run the
// warp-specialised kernel (attention_wgmma_ws.cu: producer warps, mbarriers, two consumer
// warpgroups taking turns), 64-row tiles the warp-specialised kernel's paired form (two tasks per
// block), including union tasks (v10); the v4 kernel (attention_wgmma.cu) on request (v5_tiles).
// Head dim 128 only; other head dims and page-split decode keep the mma.sync kernel
// (attention.cuh), and so do union tasks in a plan of 128-row tiles or on the v4 kernel.
//
//   if (wgmma_attention_applies(d, page_warps, unions, warps, v5_tiles))
//     launch_attention_wgmma(args, tasks, warps, v5_tiles, /*ws_copy_warps=*/0, unions, stream);
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention.cuh"

namespace cisa::cuda::detail {

// True when the wgmma kernel can run a plan of this shape (see above).
bool wgmma_attention_applies(int head_dim, int page_warps, bool unions, int warps, bool v5_tiles);

// warps: 4 or 8 (row tile 64 or 128 = one or two warpgroups); same tasks as launch_attention.
// v5_tiles: every tile on the v4/v5 kernel instead of the warp-specialised one (A/B runs,
// AttentionKernel::kWgmmaV5); ws_copy_warps as PlanOptions::ws_copy_warps (0: the default);
// unions: the tasks include union tasks (only where wgmma_attention_applies says so). pdl: as
// launch_attention's.
cudaError_t launch_attention_wgmma(const AttentionArgs& a, int64_t num_tasks, int warps,
                                   bool v5_tiles, int ws_copy_warps, bool unions, bool pdl,
                                   cudaStream_t stream);

// The warp-specialised kernel (attention_wgmma_ws.cu; the same contract): 128-row tiles, or
// (paired) tiles of up to 64 rows, two tasks per block. copy_warps (unpaired tiles only): 1, or 0
// for tiles::kWsCopyWarps. unions (paired only): the tasks include union tasks.
cudaError_t launch_attention_wgmma_ws(const AttentionArgs& a, int64_t num_tasks, bool paired,
                                      int copy_warps, bool unions, bool pdl, cudaStream_t stream);

}  // namespace cisa::cuda::detail
