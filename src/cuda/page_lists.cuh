// Page-list assembly (the setup stage): writes the parts of every list that do not depend on
// scores — the dense range or sinks before the selection, the window and tail after it — as
// physical page IDs read from the block table, with their logical chunk indices.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "plan_types.h"

namespace cisa::cuda::detail {

// lists: [num_lists] (device); max_fixed: the most fixed entries (dense range or sinks + window
// + tail) of any list; block_pages: concatenated block tables (device); pages, chunks: [total]
// page-list arrays (device, written).
cudaError_t launch_assemble_lists(const ListDesc* lists, int64_t num_lists, int64_t max_fixed,
                                  const int32_t* block_pages, int32_t* pages, int32_t* chunks,
                                  cudaStream_t stream);

}  // namespace cisa::cuda::detail
