// How fast each SM streams from device memory while every SM does (PlanOptions::sm_rates): on
// an H100, 24 of the 132 SMs (two groups of 12, likely two smaller GPCs) finished the same
// decode attention work ~20 % sooner than the others in every launch
// (bench/results/decode_sm_balance_2026-12-07/).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cisa::cuda::detail {

// blocks_per_sm blocks an SM (one launch of sms · blocks_per_sm blocks) each read `bytes_per_block`
// bytes of `data` (its own slice, 16-byte loads, `data` holds sms · blocks_per_sm slices) and
// write their SM's ID and duration (ns, globaltimer) to smid[block], ns[block].
cudaError_t launch_sm_rate_probe(const uint4* data, int64_t bytes_per_block, int blocks,
                                 int32_t* smid, int64_t* ns, cudaStream_t stream);

}  // namespace cisa::cuda::detail
