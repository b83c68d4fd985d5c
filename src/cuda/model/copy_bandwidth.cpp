// Device-to-device copy bandwidth and device facts (see cisa/cuda/bandwidth.h).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cisa/cuda/bandwidth.h"

namespace cisa::cuda {
namespace {

Status check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  const std::string m = std::string("copy bandwidth: ") + what + ": " + cudaGetErrorName(err) +
                        " (" + cudaGetErrorString(err) + ")";
  cudaGetLastError();  // clear a non-sticky error so the caller's later calls start clean
  if (err == cudaErrorMemoryAllocation) return resource_exhausted(m);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return unavailable(m);
  return internal_error(m);
}

// Owns the two buffers and two events; frees them on every path out.
struct CopyScratch {
  void* src = nullptr;
  void* dst = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaStream_t stream = nullptr;
  ~CopyScratch() {
    if (stream) cudaStreamSynchronize(stream);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    if (src) cudaFree(src);
    if (dst) cudaFree(dst);
  }
};

}  // namespace

Result<CopyBandwidth> measure_copy_bandwidth(int64_t bytes, int runs, int warmup, int device) {
  if (bytes < (int64_t{1} << 20))
    return invalid_argument("copy bandwidth: buffers of at least 1 MiB are needed (got " +
                            std::to_string(bytes) + " bytes)");
  if (runs < 10) return invalid_argument("copy bandwidth: at least 10 timed copies are needed");
  if (warmup < 1) return invalid_argument("copy bandwidth: at least one warm-up copy is needed");
  CISA_RETURN_IF_ERROR(check(cudaSetDevice(device), "cudaSetDevice"));
  size_t free_b = 0, total_b = 0;
  CISA_RETURN_IF_ERROR(check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
  if (static_cast<double>(2 * bytes) > 0.95 * static_cast<double>(free_b))
    return resource_exhausted("copy bandwidth: two buffers of " + std::to_string(bytes) +
                              " bytes do not fit in the " + std::to_string(free_b) +
                              " bytes of free device memory");
  CopyScratch s;
  const size_t n = static_cast<size_t>(bytes);
  CISA_RETURN_IF_ERROR(check(cudaMalloc(&s.src, n), "cudaMalloc (source)"));
  CISA_RETURN_IF_ERROR(check(cudaMalloc(&s.dst, n), "cudaMalloc (destination)"));
  CISA_RETURN_IF_ERROR(
      check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  CISA_RETURN_IF_ERROR(check(cudaEventCreate(&s.start), "cudaEventCreate"));
  CISA_RETURN_IF_ERROR(check(cudaEventCreate(&s.stop), "cudaEventCreate"));
  // Touch both buffers so no first-use cost lands in a timed copy.
  CISA_RETURN_IF_ERROR(check(cudaMemsetAsync(s.src, 0x3c, n, s.stream), "cudaMemset"));
  CISA_RETURN_IF_ERROR(check(cudaMemsetAsync(s.dst, 0, n, s.stream), "cudaMemset"));
  for (int i = 0; i < warmup; ++i)
    CISA_RETURN_IF_ERROR(check(cudaMemcpyAsync(s.dst, s.src, n, cudaMemcpyDeviceToDevice, s.stream),
                               "warm-up copy"));
  CISA_RETURN_IF_ERROR(check(cudaStreamSynchronize(s.stream), "warm-up"));

  CopyBandwidth out;
  out.bytes = bytes;
  for (int i = 0; i < runs; ++i) {
    CISA_RETURN_IF_ERROR(check(cudaEventRecord(s.start, s.stream), "cudaEventRecord"));
    CISA_RETURN_IF_ERROR(
        check(cudaMemcpyAsync(s.dst, s.src, n, cudaMemcpyDeviceToDevice, s.stream), "timed copy"));
    CISA_RETURN_IF_ERROR(check(cudaEventRecord(s.stop, s.stream), "cudaEventRecord"));
    CISA_RETURN_IF_ERROR(check(cudaEventSynchronize(s.stop), "cudaEventSynchronize"));
    float ms = 0;
    CISA_RETURN_IF_ERROR(check(cudaEventElapsedTime(&ms, s.start, s.stop), "cudaEventElapsedTime"));
    out.runs_ms.push_back(ms);
  }
  std::vector<double> sorted = out.runs_ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  out.median_ms = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
  if (out.median_ms <= 0) return internal_error("copy bandwidth: a copy timed at 0 ms");
  out.gb_per_s = 2.0 * static_cast<double>(bytes) / (out.median_ms * 1e-3) / 1e9;
  return out;
}

Result<DeviceFacts> device_facts(int device) {
  cudaDeviceProp prop{};
  CISA_RETURN_IF_ERROR(check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  DeviceFacts f;
  f.name = prop.name;
  f.compute_major = prop.major;
  f.compute_minor = prop.minor;
  f.sms = prop.multiProcessorCount;
  f.total_memory = static_cast<int64_t>(prop.totalGlobalMem);
  CISA_RETURN_IF_ERROR(check(cudaDriverGetVersion(&f.driver_api), "cudaDriverGetVersion"));
  CISA_RETURN_IF_ERROR(check(cudaRuntimeGetVersion(&f.runtime_api), "cudaRuntimeGetVersion"));
  return f;
}

Status set_profiler_capture(bool on) {
  return check(on ? cudaProfilerStart() : cudaProfilerStop(),
               on ? "cudaProfilerStart" : "cudaProfilerStop");
}

}  // namespace cisa::cuda
