// Deterministic pseudo-random bf16 fill (benchmarks): a counter-based hash per element, four
// uniforms summed into a roughly normal value (mean 0, standard deviation `scale`).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cisa::cuda::detail {

cudaError_t launch_fill_random_bf16(uint16_t* data, int64_t n, uint64_t seed, float scale,
                                    cudaStream_t stream);

}  // namespace cisa::cuda::detail
