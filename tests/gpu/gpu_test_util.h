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

// Device mirror of one layer of a CPU cache. A cache of int8 representatives (its
// rep_precision) is mirrored as codes and scale exponents that the device computes itself from the
// keys (cuda::run_update_reps over every full page of the mirrored sequences): the CPU holds only
// their products, which is what the tests compare against.
struct DeviceMirror {
  DevVec<uint16_t> k, v, reps;
  DevVec<uint8_t> codes;  // int8 representatives
  DevVec<int8_t> exps;    // int8 representatives: scale exponents
  DevVec<int32_t> tables;
  std::vector<int64_t> offsets;
  std::vector<int32_t> full_pages;  // physical pages whose representative the device built
  cuda::DeviceLayer layer;
  cuda::DeviceBlockTables block_tables() const { return {tables.data(), offsets}; }

  // copy_reps = false leaves the device representatives poisoned (NaN, or codes 0 with the NaN
  // exponent byte −128: scores NaN, as a non-finite representative's).
  void build(const PagedKvCache& c, int l, int num_seqs, bool copy_reps = true) {
    const size_t kv_elems =
        static_cast<size_t>(c.num_pages()) * c.num_kv_heads() * c.page_size() * c.head_dim();
    const size_t rep_elems = static_cast<size_t>(c.num_pages()) * c.num_kv_heads() * c.rep_width();
    const bool int8 = c.config().rep_precision == RepPrecision::kInt8;
    k.upload(static_cast<const uint16_t*>(c.k_pool(l)), kv_elems);
    v.upload(static_cast<const uint16_t*>(c.v_pool(l)), kv_elems);
    std::vector<int32_t> flat;
    offsets.assign(1, 0);
    full_pages.clear();
    for (SeqId s = 0; s < num_seqs; ++s) {
      auto t = *c.block_table(s);
      flat.insert(flat.end(), t.begin(), t.end());
      offsets.push_back(static_cast<int64_t>(flat.size()));
      const int64_t n_full = *c.length(s) / c.page_size();
      full_pages.insert(full_pages.end(), t.begin(), t.begin() + n_full);
    }
    tables.upload(flat);
    layer = {k.data(),         v.data(),     nullptr,       c.num_pages(),
             c.num_kv_heads(), c.head_dim(), c.page_size(), c.config().rep};
    if (!int8) {
      reps.resize(rep_elems);
      reps.poison();
      if (copy_reps) cudaMemcpy(reps.data(), c.rep_pool(l), rep_elems * 2, cudaMemcpyHostToDevice);
      layer.reps = reps.data();
      return;
    }
    codes.resize(rep_elems);
    cudaMemset(codes.data(), 0, codes.size());
    exps.resize(static_cast<size_t>(c.num_pages()) * c.num_kv_heads());
    cudaMemset(exps.data(), 0x80, exps.size());  // −128: no 8-bit form, scores NaN
    layer.reps = codes.data();
    layer.rep_exps = exps.data();
    layer.rep_precision = RepPrecision::kInt8;
    if (copy_reps && !full_pages.empty()) {
      DevVec<int32_t> pages;
      pages.upload(full_pages);
      const Status st = cuda::run_update_reps(layer, pages.data(),
                                              static_cast<int64_t>(full_pages.size()), nullptr);
      EXPECT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
    }
  }
};

}  // namespace cisa::test

#endif  // CISA_WITH_CUDA
