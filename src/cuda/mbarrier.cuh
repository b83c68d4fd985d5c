// Shared-memory addresses and mbarriers (sm_90), for the kernels that wait on transaction or
// arrival barriers: the warp-specialised attention's stage rings (attention_wgmma_ws.cu) and the
// decode top-k clusters' exchanges (topk_cluster.cuh).
#pragma once

#include <cstdint>

namespace cisa::cuda::dev {

// The shared-window (shared::cta) address of `p`, a pointer into this block's shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A barrier whose phases complete after `count` arrivals (and the bytes they expect).
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count)
               : "memory");
}
// Makes initialised barriers visible to the cluster's other blocks (before a cluster barrier).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
// One arrival, and `bytes` that the current phase then also waits for (complete_tx of st.async
// or bulk copies).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(b)),
               "r"(bytes)
               : "memory");
}
// Waits until the phase of parity `parity` has completed. The acquire is at the block's scope,
// or with kCluster at the cluster's (what other blocks of the cluster stored for the phase is
// then visible).
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done = 0;
  do {
    if constexpr (kCluster)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
          "%2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(b)), "r"(parity)
          : "memory");
    else
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, "
          "1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(b)), "r"(parity)
          : "memory");
  } while (!done);
}

}  // namespace cisa::cuda::dev
