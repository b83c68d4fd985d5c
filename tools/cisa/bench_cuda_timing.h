// GPU timing for the CUDA benchmarks of the CLI (`cisa bench layer`): medians of CUDA-event
// timings, of launches on the legacy stream or of one CUDA graph replayed.
//
//   double ms = bench_timing::median_ms([&] { launch_kernels(); }, /*warmup=*/3, /*iters=*/10);
//   double step = bench_timing::graph_ms([&](cudaStream_t s) { enqueue_step(s); }, 3, 10);
#pragma once

#ifdef CISA_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace cisa::cli::bench_timing {

inline double median_of(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

// Median ms of `iters` runs of `run`, each between two events recorded on `stream`.
template <class F>
double timed_median(F&& run, int64_t iters, cudaStream_t stream) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int64_t i = 0; i < iters; ++i) {
    cudaEventRecord(a, stream);
    run();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median_of(std::move(t));
}

// Median ms of `iters` runs of `launch` (kernels on the legacy stream) after `warmup` untimed
// ones, each timed alone between two events.
template <class F>
double median_ms(F&& launch, int64_t warmup, int64_t iters) {
  for (int64_t i = 0; i < warmup; ++i) launch();
  cudaDeviceSynchronize();
  return timed_median(launch, iters, nullptr);
}

// The whole step that `enqueue` launches on the stream it is given (for example selection stages,
// attention and merge), captured once as a CUDA graph and replayed: median ms of a replay. Unlike
// a sum of stages timed one by one, it has no launch gap between stages and lets a kernel's
// programmatic dependent launch overlap the previous one's tail, as a caller's captured step
// does. −1 where capture fails (the caller says so; nothing else depends on it).
template <class F>
double graph_ms(F&& enqueue, int64_t warmup, int64_t iters) {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return -1;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  double ms = -1;
  bool captured = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (captured) {
    enqueue(s);
    captured = cudaStreamEndCapture(s, &g) == cudaSuccess &&
               cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
  }
  if (captured) {
    for (int64_t i = 0; i < warmup; ++i) cudaGraphLaunch(ge, s);
    cudaStreamSynchronize(s);
    ms = timed_median([&] { cudaGraphLaunch(ge, s); }, iters, s);
  }
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaGetLastError();  // a failed capture leaves its error here, not in the next measurement
  return ms;
}

}  // namespace cisa::cli::bench_timing

#endif  // CISA_WITH_CUDA
