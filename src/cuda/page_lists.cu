// Page-list assembly kernel: one block per list, threads stride over its fixed chunk ranges.
#include "page_lists.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda::detail {
namespace {

__global__ void assemble_lists_kernel(const ListDesc* __restrict__ lists, const int32_t* __restrict__ block_pages,
                                      int32_t* __restrict__ pages, int32_t* __restrict__ chunks) {
  const ListDesc L = lists[blockIdx.x];
  const int32_t* table = block_pages + L.table_begin;
  const int32_t n_pre = L.pre_end - L.pre_begin;
  for (int32_t i = threadIdx.x; i < n_pre; i += blockDim.x) {
    const int32_t j = L.pre_begin + i;
    pages[L.out_begin + i] = table[j];
    chunks[L.out_begin + i] = j;
  }
  const int64_t post_out = L.out_begin + n_pre + L.k;
  for (int32_t i = threadIdx.x; i < L.post_end - L.post_begin; i += blockDim.x) {
    const int32_t j = L.post_begin + i;
    pages[post_out + i] = table[j];
    chunks[post_out + i] = j;
  }
}

}  // namespace

cudaError_t launch_assemble_lists(const ListDesc* lists, int64_t num_lists, const int32_t* block_pages,
                                  int32_t* pages, int32_t* chunks, cudaStream_t stream) {
  if (num_lists <= 0) return cudaSuccess;
  assemble_lists_kernel<<<static_cast<unsigned>(num_lists), tiles::kAssembleThreads, 0, stream>>>(
      lists, block_pages, pages, chunks);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
