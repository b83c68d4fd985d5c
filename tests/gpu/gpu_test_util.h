// Helpers of the GPU tests: device buffers, and a CPU PagedKvCache mirrored into device memory
// (same physical page IDs, block tables concatenated in SeqId order), so every GPU op can be
// compared with the CPU engine on identical inputs.
#pragma once
#ifdef CISA_WITH_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cisa/core/bf16.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/cuda/backend.h"

namespace cisa::test {

// Skips the test when no usable device exists (CI, machines without a GPU).
#define CISA_REQUIRE_GPU()                                                  \
  do {                                                                      \
    std::string why_;                                                       \
    if (!::cisa::cuda::device_available(&why_))                             \
      GTEST_SKIP() << "no CUDA device: GPU tests skipped (" << why_ << ")"; \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << cudaGetErrorString(cudaGetLastError())

// Each value rounded to bf16 (round to nearest even).
inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_bf16(x[i]);
  return h;
}

template <class T>
class DevVec {
 public:
  DevVec() = default;
  explicit DevVec(size_t n) { resize(n); }
  ~DevVec() {
    if (p_) cudaFree(p_);
  }
  DevVec(const DevVec&) = delete;
  DevVec& operator=(const DevVec&) = delete;
  void resize(size_t n) {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = n;
    if (n && cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  void upload(const T* h, size_t n) {
    resize(n);
    if (n) cudaMemcpy(p_, h, n * sizeof(T), cudaMemcpyHostToDevice);
  }
  void upload(const std::vector<T>& h) { upload(h.data(), h.size()); }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  void poison() {
    if (n_) cudaMemset(p_, 0xff, n_ * sizeof(T));
  }  // f32/bf16 NaN, int −1
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Device mirror of one layer of a CPU cache.
struct DeviceMirror {
  DevVec<uint16_t> k, v, reps;
  DevVec<int32_t> tables;
  std::vector<int64_t> offsets;
  cuda::DeviceLayer layer;
  cuda::DeviceBlockTables block_tables() const { return {tables.data(), offsets}; }

  // copy_reps = false leaves the device representatives poisoned (NaN).
  void build(const PagedKvCache& c, int l, int num_seqs, bool copy_reps = true) {
    const size_t kv_elems =
        static_cast<size_t>(c.num_pages()) * c.num_kv_heads() * c.page_size() * c.head_dim();
    const size_t rep_elems = static_cast<size_t>(c.num_pages()) * c.num_kv_heads() * c.rep_width();
    k.upload(static_cast<const uint16_t*>(c.k_pool(l)), kv_elems);
    v.upload(static_cast<const uint16_t*>(c.v_pool(l)), kv_elems);
    reps.resize(rep_elems);
    reps.poison();
    if (copy_reps) cudaMemcpy(reps.data(), c.rep_pool(l), rep_elems * 2, cudaMemcpyHostToDevice);
    std::vector<int32_t> flat;
    offsets.assign(1, 0);
    for (SeqId s = 0; s < num_seqs; ++s) {
      auto t = *c.block_table(s);
      flat.insert(flat.end(), t.begin(), t.end());
      offsets.push_back(static_cast<int64_t>(flat.size()));
    }
    tables.upload(flat);
    layer = {k.data(),         v.data(),     reps.data(),   c.num_pages(),
             c.num_kv_heads(), c.head_dim(), c.page_size(), c.config().rep};
  }
};

}  // namespace cisa::test

#endif  // CISA_WITH_CUDA
