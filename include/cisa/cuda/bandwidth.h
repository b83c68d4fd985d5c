// cisa/cuda/bandwidth.h — the GPU's measured copy bandwidth, the ceiling a memory-bound decode
// step (the whole model: weights + attended K/V + representatives) is judged against, and the
// device facts a benchmark's JSON records. No CUDA includes: the CLI uses it without nvcc.
//
//   CISA_ASSIGN_OR_RETURN(cisa::cuda::CopyBandwidth bw, cisa::cuda::measure_copy_bandwidth());
//   double step_floor_s = bytes_per_step / (bw.gb_per_s * 1e9);   // the roofline
//   CISA_ASSIGN_OR_RETURN(cisa::cuda::DeviceFacts dev, cisa::cuda::device_facts(0));
//
// The measurement: one device-to-device cudaMemcpyAsync of `bytes` between two buffers of that
// size (2 GiB by default, far larger than L2, so every byte comes from and goes to HBM), timed
// with cudaEvents; `warmup` untimed copies first, then `runs` timed ones, and the median. The
// bandwidth counts the bytes read plus the bytes written: 2 · bytes / time, in 10^9 bytes/s,
// the same convention as the one-layer benchmark's copy anchor (docs/cuda.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cisa/core/status.h"

namespace cisa::cuda {

struct CopyBandwidth {
  double gb_per_s = 0;          // 2 · bytes / median time, 10^9 bytes per second
  double median_ms = 0;         // one copy
  int64_t bytes = 0;            // size of each buffer (bytes read = bytes written = this)
  std::vector<double> runs_ms;  // every timed copy, in order
};

// Errors: kInvalidArgument for bytes < 1 MiB, runs < 10 or warmup < 1; kResourceExhausted when the
// two buffers do not fit in free device memory (measure before loading a model); kUnavailable
// without a usable device. Frees its buffers before returning.
Result<CopyBandwidth> measure_copy_bandwidth(int64_t bytes = int64_t{2} << 30, int runs = 20,
                                             int warmup = 3, int device = 0);

// What a benchmark's JSON says about the device it ran on.
struct DeviceFacts {
  std::string name;  // "NVIDIA H200"
  int compute_major = 0, compute_minor = 0;
  int sms = 0;
  int64_t total_memory = 0;  // bytes
  int driver_api = 0;        // cudaDriverGetVersion, e.g. 13000
  int runtime_api = 0;       // cudaRuntimeGetVersion
};
Result<DeviceFacts> device_facts(int device = 0);

// Starts (on = true) or stops the profiler's capture (cudaProfilerStart/Stop): under
// `ncu --profile-from-start off` only the kernels between the two are profiled, as
// `cisa bench model --profile-step N` does around one decode step. Errors: kUnavailable without a
// usable device.
Status set_profiler_capture(bool on);

}  // namespace cisa::cuda
