// Union kernel: one block per union. The members' chunks set bits of a shared bitmap (4 bits per
// chunk, 8 chunks per word); one ordered sweep over the words then writes the non-empty chunks
// in ascending order (block-wide exclusive scan per 8 × kUnionThreads chunks).
#include <cub/block/block_scan.cuh>

#include "pdl.cuh"
#include "tile_sizes.cuh"
#include "unions.cuh"

namespace cisa::cuda::detail {
namespace {

constexpr int kThreads = tiles::kUnionThreads;

__global__ void __launch_bounds__(kThreads)
    build_unions_kernel(const UnionDesc* __restrict__ unions, const ListDesc* __restrict__ lists,
                        const int32_t* __restrict__ chunks, const int32_t* __restrict__ block_pages,
                        int32_t* __restrict__ upages, int32_t* __restrict__ uchunks,
                        int32_t* __restrict__ umask, int32_t* __restrict__ counts) {
  dev::dependent_start();
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  extern __shared__ uint32_t bits[];  // [max_chunk / 8 + 1]
  const UnionDesc U = unions[blockIdx.x];
  const int32_t words = U.max_chunk / 8 + 1;
  for (int32_t i = threadIdx.x; i < words; i += kThreads) bits[i] = 0;
  __syncthreads();
  for (int m = 0; m < U.members; ++m) {
    const ListDesc L = lists[U.first_list + m * U.stride];
    const int32_t n = (L.pre_end - L.pre_begin) + L.k + (L.post_end - L.post_begin);
    for (int32_t i = threadIdx.x; i < n; i += kThreads) {
      const int32_t c = chunks[L.out_begin + i];
      atomicOr(&bits[c / 8], 1u << ((c % 8) * 4 + m));
    }
  }
  __syncthreads();
  const int32_t* table = block_pages + U.table_begin;
  int base = 0;
  for (int32_t w0 = 0; w0 < words; w0 += kThreads) {
    const int32_t w = w0 + threadIdx.x;
    const uint32_t word = w < words ? bits[w] : 0u;
    int n = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) n += ((word >> (4 * j)) & 15u) ? 1 : 0;
    int pos, total;
    Scan(scan_tmp).ExclusiveSum(n, pos, total);
    __syncthreads();  // scan_tmp is reused next iteration
    pos += base;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t m = (word >> (4 * j)) & 15u;
      if (!m) continue;
      const int32_t c = w * 8 + j;
      upages[U.out_begin + pos] = table[c];
      uchunks[U.out_begin + pos] = c;
      umask[U.out_begin + pos] = static_cast<int32_t>(m);
      ++pos;
    }
    base += total;
  }
  if (threadIdx.x == 0) counts[blockIdx.x] = base;
}

}  // namespace

cudaError_t launch_build_unions(const UnionDesc* unions, int64_t num_unions, size_t smem_bytes,
                                const ListDesc* lists, const int32_t* chunks,
                                const int32_t* block_pages, int32_t* upages, int32_t* uchunks,
                                int32_t* umask, int32_t* counts, cudaStream_t stream) {
  if (num_unions <= 0) return cudaSuccess;
  cudaError_t err =
      cudaFuncSetAttribute(build_unions_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_bytes));
  if (err != cudaSuccess) return err;
  launch_dependent(build_unions_kernel, static_cast<unsigned>(num_unions), kThreads, smem_bytes,
                   stream, unions, lists, chunks, block_pages, upages, uchunks, umask, counts);
  return cudaGetLastError();
}

}  // namespace cisa::cuda::detail
