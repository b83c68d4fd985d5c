// The reuse state of a decode list (reuse.cuh), on the device: its slot, whether a list's fresh
// selection becomes its sequence's S, and the commit that the top-k kernels make as they write
// the selection (TopkCommit: every check but `mass`, whose u0 needs sums over the list's scores
// after top-k, so that reuse_commit still runs there). Shared by reuse.cu and the top-k kernels.
#pragma once

#include <cstdint>

#include "cisa/cuda/reuse_state.h"
#include "plan_types.h"
#include "reuse.cuh"

namespace cisa::cuda::detail {

__device__ __forceinline__ int64_t state_slot(const ListDesc& L, const ReuseState& st, int H) {
  return (static_cast<int64_t>(L.reuse_seq) * st.num_layer_slots + st.layer_slot) * H + L.kv;
}

// A reuse candidate that selected afresh stores its selection: S ← its selected part, a0 = last
// use = its row (and under `mass` its u0).
__device__ __forceinline__ bool commits(const ListDesc& L, const ReuseState& st,
                                        const int32_t* keep, int32_t li) {
  return !st.repeat && L.reuse_seq >= 0 && !keep[li] && L.k <= st.k_stride;
}

__device__ __forceinline__ ReuseInfo fresh_info(const ListDesc& L, const ReuseParams& rp,
                                                double u0) {
  return ReuseInfo{L.first_pos, L.first_pos, rp.budget, rp.window, rp.sink_pages, u0};
}

// Where list li's fresh selection goes (entry i of its selected part to S[i]) when the top-k
// kernel commits it, else null. The caller's `writer` thread (one per list) stores the slot's
// ReuseInfo here, with u0 = 0.
__device__ __forceinline__ int32_t* topk_commit_target(const TopkCommit& c, const ListDesc& L,
                                                       const int32_t* keep, int32_t li,
                                                       bool writer) {
  if (!c.st.chunks || !keep || !commits(L, c.st, keep, li)) return nullptr;
  const int64_t slot = state_slot(L, c.st, c.num_kv_heads);
  if (writer) c.st.info[slot] = fresh_info(L, c.rp, 0.0);
  return c.st.chunks + slot * c.st.k_stride;
}

}  // namespace cisa::cuda::detail
