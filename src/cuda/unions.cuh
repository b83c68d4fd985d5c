// KV-outer page unions (v3): merges the page lists of up to kUnionGroups consecutive QShare
// groups of one (entry, KV group) into one ascending list whose entries carry a bit per member
// group that chose the page. The attention kernel then reads each such page once for all the
// groups (one warp per group) instead of once per group.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"

namespace cisa::cuda::detail {

// Shared memory of the union kernel for a largest chunk index max_chunk (a 4-bit member mask
// per chunk).
inline size_t union_smem_bytes(int32_t max_chunk) {
  return (static_cast<size_t>(max_chunk) / 8 + 1) * 4;
}

// Reads the member lists (chunks at each list's out_begin, after run_select) and writes, per
// union u, counts[u] entries at unions[u].out_begin of upages (physical), uchunks (logical) and
// umask (bit w: member w chose the page), ascending by chunk.
cudaError_t launch_build_unions(const UnionDesc* unions, int64_t num_unions, size_t smem_bytes,
                                const ListDesc* lists, const int32_t* chunks,
                                const int32_t* block_pages, int32_t* upages, int32_t* uchunks,
                                int32_t* umask, int32_t* counts, cudaStream_t stream);

}  // namespace cisa::cuda::detail
