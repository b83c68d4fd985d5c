// How fast each SM streams from device memory while every SM does (PlanOptions::sm_rates): on
// an H100, 24 of the 132 SMs (two groups of 12, likely two smaller GPCs) finished the same
// decode attention work ~20 % sooner than the others in every launch
// (bench/results/decode_sm_balance_2026-12-07/). This probe's in-order streams do not show that
// spread: on the same model of H100 it measured every SM within ±4 % of the mean (call3_h100/).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cisa::cuda::detail {

// One launch of `blocks` blocks (measure_sm_rates: two an SM): block b reads `bytes_per_block`
// bytes of its own slice of `data` (16-byte loads) and writes its SM's ID and its duration (ns,
// globaltimer) to smid[b], ns[b]; ns has blocks + 1 entries (the last keeps the loads alive).
cudaError_t launch_sm_rate_probe(const uint4* data, int64_t bytes_per_block, int blocks,
                                 int32_t* smid, int64_t* ns, cudaStream_t stream);

}  // namespace cisa::cuda::detail
