// Helpers of the backend tests that run one Backend operation on the CPU and the CUDA model
// backends with identical inputs: a backend pair, buffers filled from host vectors, element-wise
// comparison under a per-element tolerance (NaN never passes), and GGUF-layout weight matrices
// (f32, Q8_0) with their exact values.
#pragma once
#if defined(CISA_WITH_CUDA_MODEL)

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/cuda/model_backend.h"
#include "cisa/model/quant.h"
#include "gpu/gpu_test_util.h"
#include "test_util.h"

namespace cisa::test {

struct BackendPair {
  std::unique_ptr<Backend> cpu, gpu;
  std::vector<std::unique_ptr<BackendBuffer>> keep;  // buffers that must outlive queued work
};

inline BackendPair make_backend_pair() {
  BackendPair b;
  auto cpu = make_cpu_backend({.threads = 2});
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  if (cpu.ok()) b.cpu = std::move(*cpu);
  auto gpu = cuda::make_model_backend({});
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  if (gpu.ok()) b.gpu = std::move(*gpu);
  return b;
}

template <class T>
std::unique_ptr<BackendBuffer> upload_vec(Backend& be, const std::vector<T>& host) {
  const auto bytes = static_cast<int64_t>(host.size() * sizeof(T));
  auto buf = be.allocate(bytes, "test buffer");
  EXPECT_TRUE(buf.ok()) << buf.status().to_string();
  if (!buf.ok()) return nullptr;
  const Status st = be.upload((*buf)->data(), host.data(), bytes);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return std::move(*buf);
}
inline std::unique_ptr<BackendBuffer> upload_f32(Backend& be, const std::vector<float>& h) {
  return upload_vec(be, h);
}
inline std::unique_ptr<BackendBuffer> upload_i32(Backend& be, const std::vector<int32_t>& h) {
  return upload_vec(be, h);
}

inline std::vector<float> download_f32(Backend& be, BackendBuffer& buf, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  const Status st = be.download(h.data(), buf.data(), n * static_cast<int64_t>(sizeof(float)));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return h;
}

// Every |got[i] − want[i]| ≤ tol(i, want[i]); a NaN on either side fails. Reports the first few.
inline void expect_within(const std::vector<float>& want, const std::vector<float>& got,
                          const std::function<double(size_t, float)>& tol) {
  ASSERT_EQ(want.size(), got.size());
  ASSERT_FALSE(want.empty()) << "nothing to compare";
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(got[i]) || std::isnan(want[i]) || !(err <= tol(i, want[i]))) {
      if (bad < 5)
        ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i]
                      << " (tolerance " << tol(i, want[i]) << ")";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance, of " << want.size();
}

// Values exactly representable in bf16 (so a backend's bf16 conversion of them is exact).
inline std::vector<float> bf16_exact(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// A weight matrix in GGUF layout and the exact values it holds.
struct HostMatrix {
  GgmlType type = GgmlType::F32;
  int64_t n_rows = 0, n_cols = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [n_rows][n_cols]
  WeightView view() const {
    const uint64_t row_bytes = static_cast<uint64_t>(bytes.size() / static_cast<size_t>(n_rows));
    return {.type = type,
            .n_rows = n_rows,
            .n_cols = n_cols,
            .row_bytes = row_bytes,
            .data = bytes.data()};
  }
};

inline HostMatrix make_f32(std::mt19937& rng, int64_t n_rows, int64_t n_cols) {
  HostMatrix m{.type = GgmlType::F32, .n_rows = n_rows, .n_cols = n_cols};
  m.values = random_vec(rng, static_cast<size_t>(n_rows * n_cols), 0.5f);
  m.bytes.resize(m.values.size() * sizeof(float));
  std::memcpy(m.bytes.data(), m.values.data(), m.bytes.size());
  return m;
}

// Q8_0: blocks of 32 values, an f16 scale d then 32 int8 codes; value = d · code.
inline HostMatrix make_q8_0(std::mt19937& rng, int64_t n_rows, int64_t n_cols) {
  HostMatrix m{.type = GgmlType::Q8_0, .n_rows = n_rows, .n_cols = n_cols};
  const auto raw = random_vec(rng, static_cast<size_t>(n_rows * n_cols), 0.5f);
  m.values.resize(raw.size());
  for (size_t b0 = 0; b0 < raw.size(); b0 += 32) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(raw[b0 + i]));
    const uint16_t dh = f32_to_f16(amax / 127.0f);
    const float d = f16_to_f32(dh);
    m.bytes.push_back(static_cast<uint8_t>(dh & 0xff));
    m.bytes.push_back(static_cast<uint8_t>(dh >> 8));
    for (size_t i = 0; i < 32; ++i) {
      const int q =
          d > 0 ? std::clamp(static_cast<int>(std::lround(raw[b0 + i] / d)), -127, 127) : 0;
      m.bytes.push_back(static_cast<uint8_t>(static_cast<int8_t>(q)));
      m.values[b0 + i] = d * static_cast<float>(q);
    }
  }
  return m;
}

}  // namespace cisa::test

#endif  // CISA_WITH_CUDA_MODEL
