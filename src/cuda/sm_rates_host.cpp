// measure_sm_rates (backend.h): the SM-rate probe (sm_rates.cu) launched `repeats` times.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cisa/cuda/backend.h"
#include "plan_impl.h"
#include "sm_rates.cuh"
#include "tile_sizes.cuh"

namespace cisa::cuda {

Status measure_sm_rates(std::vector<float>* rates, int64_t bytes_per_block, int repeats) {
  if (!rates) return invalid_argument("cuda: null output");
  if (bytes_per_block < 16 || bytes_per_block > (int64_t{1} << 30) || bytes_per_block % 16 != 0)
    return invalid_argument(
        "cuda: measure_sm_rates bytes_per_block must be a multiple of 16 in "
        "[16, 2^30] (got " +
        std::to_string(bytes_per_block) + ")");
  if (repeats < 1 || repeats > 1000)
    return invalid_argument("cuda: measure_sm_rates repeats must be in [1, 1000] (got " +
                            std::to_string(repeats) + ")");
  const int sms = device_sms();
  const int blocks = sms * tiles::kDecodeBlocksPerSm;
  DeviceBuffer data, smid, ns;
  CISA_RETURN_IF_ERROR(
      data.reserve(static_cast<size_t>(blocks) * static_cast<size_t>(bytes_per_block),
                   "cuda: SM-rate probe data"));
  CISA_RETURN_IF_ERROR(smid.reserve(static_cast<size_t>(blocks) * sizeof(int32_t), "cuda: SM IDs"));
  CISA_RETURN_IF_ERROR(
      ns.reserve((static_cast<size_t>(blocks) + 1) * sizeof(int64_t), "cuda: SM-rate durations"));
  CISA_RETURN_IF_ERROR(cuda_status(cudaMemset(data.as<void>(), 0, data.bytes()), "cuda: memset"));
  std::vector<std::vector<double>> per_sm(static_cast<size_t>(sms));
  std::vector<int32_t> h_sm(static_cast<size_t>(blocks));
  std::vector<int64_t> h_ns(static_cast<size_t>(blocks));
  for (int r = 0; r < repeats + 1; ++r) {  // the first launch warms up and is not counted
    CISA_RETURN_IF_ERROR(
        cuda_status(detail::launch_sm_rate_probe(data.as<uint4>(), bytes_per_block, blocks,
                                                 smid.as<int32_t>(), ns.as<int64_t>(), nullptr),
                    "cuda: SM-rate probe"));
    CISA_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(h_sm.data(), smid.as<void>(), h_sm.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost),
                    "cuda: SM-rate download"));
    CISA_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(h_ns.data(), ns.as<void>(), h_ns.size() * sizeof(int64_t),
                               cudaMemcpyDeviceToHost),
                    "cuda: SM-rate download"));
    if (r == 0) continue;
    std::vector<double> sum(static_cast<size_t>(sms), 0.0);
    std::vector<int> count(static_cast<size_t>(sms), 0);
    for (int b = 0; b < blocks; ++b) {
      const int s = h_sm[static_cast<size_t>(b)];
      if (s < 0 || s >= sms) continue;
      sum[static_cast<size_t>(s)] += static_cast<double>(h_ns[static_cast<size_t>(b)]);
      ++count[static_cast<size_t>(s)];
    }
    for (int s = 0; s < sms; ++s)
      if (count[static_cast<size_t>(s)] > 0)
        per_sm[static_cast<size_t>(s)].push_back(sum[static_cast<size_t>(s)] /
                                                 count[static_cast<size_t>(s)]);
  }
  rates->assign(static_cast<size_t>(sms), 0.0f);
  double mean = 0.0;
  for (int s = 0; s < sms; ++s) {
    auto& v = per_sm[static_cast<size_t>(s)];
    if (v.empty())
      return Status(StatusCode::kInternal,
                    "cuda: measure_sm_rates: no probe block ran on SM " + std::to_string(s));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    const double t = v[v.size() / 2];
    if (!(t > 0.0)) return Status(StatusCode::kInternal, "cuda: measure_sm_rates: zero duration");
    (*rates)[static_cast<size_t>(s)] = static_cast<float>(1.0 / t);
    mean += 1.0 / t;
  }
  mean /= sms;
  for (auto& r : *rates) r = static_cast<float>(r / mean);
  return Status::Ok();
}

}  // namespace cisa::cuda
