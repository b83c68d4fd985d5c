// Page-list assembly kernel: block (x, y) writes slice y of list x's fixed entries (its dense
// range or sinks, then its window and tail), kAssembleItems per thread. v1–v5 ran one block per
// list: a dense decode plan of 32 lists × 65,536 pages took 0.055 ms on 32 blocks.
#include "page_lists.cuh"
#include "pdl.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

__global__ void assemble_lists_kernel(const ListDesc* __restrict__ lists,
                                      const int32_t* __restrict__ block_pages,
                                      int32_t* __restrict__ pages, int32_t* __restrict__ chunks) {
  dev::dependent_start();
  const ListDesc L = lists[blockIdx.x];
  const int32_t* table = block_pages + L.table_begin;
  const int64_t n_pre = L.pre_end - L.pre_begin;
  const int64_t n = n_pre + (L.post_end - L.post_begin);
  const int64_t per_block = static_cast<int64_t>(blockDim.x) * tiles::kAssembleItems;
  const int64_t i0 = blockIdx.y * per_block, i1 = min(i0 + per_block, n);
#pragma unroll 4
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const bool pre = i < n_pre;
    const int32_t j = static_cast<int32_t>(pre ? L.pre_begin + i : L.post_begin + (i - n_pre));
    const int64_t o = L.out_begin + i + (pre ? 0 : L.k);  // the k selected chunks sit between
    pages[o] = table[j];
    chunks[o] = j;
  }
}

}  // namespace

cudaError_t launch_assemble_lists(const ListDesc* lists, int64_t num_lists, int64_t max_fixed,
                                  const int32_t* block_pages, int32_t* pages, int32_t* chunks,
                                  cudaStream_t stream) {
  if (num_lists <= 0 || max_fixed <= 0) return cudaSuccess;
  constexpr int64_t per_block = int64_t{tiles::kAssembleThreads} * tiles::kAssembleItems;
  const int64_t slices = (max_fixed + per_block - 1) / per_block;
  if (slices > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_lists), static_cast<unsigned>(slices));
  launch_dependent(assemble_lists_kernel, grid, tiles::kAssembleThreads, 0, stream, lists,
                   block_pages, pages, chunks);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
