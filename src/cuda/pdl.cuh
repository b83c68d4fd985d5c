// Programmatic dependent launch (Hopper). A decode step is ~540 kernels, most of them a few
// microseconds long, run back to back in one stream: with ordinary launches each kernel starts
// only after the previous one has drained and its memory is flushed, and its blocks then ramp up
// from nothing. With launch_dependent() a kernel is launched as soon as every block of the kernel
// before it has started (dev::allow_dependents()), its blocks take the SM slots that free up, and
// they wait in dev::wait_for_producers() until that kernel has completed and its writes are
// visible. Work that reads nothing an earlier kernel writes (a GEMM's weights) may run before
// the wait, so weight streaming overlaps the previous kernel's tail.
//
// The rule every kernel launched through launch_dependent() keeps: call
// dev::wait_for_producers() before its first read of anything an earlier kernel of the stream
// writes, before its first write of anything an earlier kernel reads, and before any return.
// The wait covers every earlier kernel, not only the last: a kernel completes only after its
// own wait returned, so completion is transitive. Kernels launched the ordinary way (cuBLASLt's,
// or ours under <<<>>>) wait for their predecessors fully, as always; the wait is a no-op in a
// kernel that was not launched as a dependent. Both instructions need sm_90 (the backend builds
// for sm_90a only); compiled for an older architecture they are left out, and what the launch
// attribute does there was not tried.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace cisa::cuda::dev {

__device__ __forceinline__ void wait_for_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The start of a kernel that reads or writes its predecessors' data from its first line.
__device__ __forceinline__ void dependent_start() {
  wait_for_producers();
  allow_dependents();
}

}  // namespace cisa::cuda::dev

namespace cisa::cuda::detail {

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the stream's
// previous kernel (see above) when `pdl` is set, else an ordinary launch (which waits for the
// previous kernel to complete before any block starts). Returns the launch's error (also left for
// cudaGetLastError).
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// launch_kernel as a programmatic dependent.
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args&&... args) {
  return launch_kernel(kernel, grid, block, smem, stream, true, std::forward<Args>(args)...);
}

}  // namespace cisa::cuda::detail
