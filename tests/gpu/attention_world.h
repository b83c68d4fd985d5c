// Shared parts of the GPU attention tests (cuda_attention_test, cuda_decode_attention_test):
// a world of random sequences in a CPU PagedKvCache with bf16-exact queries, and the runs that
// compare the GPU plan's attention with the CPU engine (cisa::attend) on the GPU's own lists.
#pragma once
#ifdef CISA_WITH_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cisa/cpu/attention.h"
#include "cisa/cpu/selection.h"
#include "cuda/plan_impl.h"
#include "gpu/gpu_test_util.h"
#include "test_util.h"

namespace cisa::test {

struct World {
  std::unique_ptr<PagedKvCache> cache;
  std::vector<BatchEntry> batch;
  std::vector<float> q;      // [rows][hq][d], values exactly representable in bf16
  std::vector<uint16_t> qh;  // the same in bf16
  int hq = 0;
  int64_t rows = 0;
};

inline World make_world(int hkv, int hq, int d, const std::vector<int64_t>& lengths,
                        const std::vector<BatchEntry>& batch, std::mt19937& rng) {
  World w;
  int64_t total = 0;
  for (auto n : lengths) total += n / 16 + 2;
  w.cache = *PagedKvCache::create({.num_layers = 1,
                                   .num_kv_heads = hkv,
                                   .head_dim = d,
                                   .page_size = 16,
                                   .num_pages = total + 4,
                                   .dtype = KvDtype::kBF16});
  for (size_t i = 0; i < lengths.size(); ++i)
    EXPECT_EQ(*w.cache->add_sequence(), static_cast<SeqId>(i));
  std::vector<int64_t> done(lengths.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t n = std::min<int64_t>(lengths[i] - done[i], 16 * (1 + rng() % 9));
      if (n <= 0) continue;
      append_random(*w.cache, static_cast<SeqId>(i), n, rng);
      done[i] += n;
      more = true;
    }
  }
  w.batch = batch;
  w.hq = hq;
  for (auto& b : batch) w.rows += b.count;
  // Scale 2 makes the softmax peaked enough that masking and page errors show.
  w.q = random_vec(rng, static_cast<size_t>(w.rows * hq * d), 2.0f);
  for (auto& x : w.q) {
    w.qh.push_back(f32_to_bf16(x));
    x = bf16_to_f32(w.qh.back());
  }
  return w;
}

// P is rounded to bf16 before P·V (relative error ≤ 2^-9 per weight) and V is exact, so each
// output element is off by at most ~2^-8·max|v| in the worst case; the L2 error, a sum of
// independent roundings, sits far below. lse comes from f32 scores of exact bf16 products.
inline void expect_close(const World& w, const std::vector<float>& want_out,
                         const std::vector<float>& want_lse, const std::vector<float>& out,
                         const std::vector<float>& lse) {
  ASSERT_EQ(want_out.size(), out.size());
  double err2 = 0, ref2 = 0, max_err = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << "output element " << i << " is NaN (unwritten?)";
    const double e = std::fabs(static_cast<double>(out[i]) - want_out[i]);
    max_err = std::max(max_err, e);
    err2 += e * e;
    ref2 += static_cast<double>(want_out[i]) * want_out[i];
  }
  // max|v| of N(0,1) values over the test sizes stays below 6.
  EXPECT_LT(max_err, 6.0 * std::ldexp(1.0, -8));
  EXPECT_LT(std::sqrt(err2 / ref2), 4e-3) << "relative L2 error";
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_FALSE(std::isnan(lse[i])) << "lse " << i;
    ASSERT_NEAR(lse[i], want_lse[i], 1e-3 * (1 + std::fabs(want_lse[i]))) << "lse " << i;
  }
}

// Runs the GPU plan's attention on w's queries into outputs poisoned with NaN; *out_h, *lse_h:
// what it wrote.
inline void attend_on_device(const World& w, const DeviceMirror& m, const cuda::Plan& plan,
                             std::vector<float>* out_h, std::vector<float>* lse_h) {
  const int d = w.cache->head_dim();
  DevVec<uint16_t> dq;
  dq.upload(w.qh);
  DevVec<float> out(static_cast<size_t>(w.rows * w.hq * d)),
      lse(static_cast<size_t>(w.rows * w.hq));
  out.poison();
  lse.poison();
  const Status run =
      cuda::run_attention(plan, m.layer, dq.data(), 0.0f, out.data(), lse.data(), nullptr);
  ASSERT_TRUE(run.ok()) << run.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  *out_h = out.download();
  *lse_h = lse.download();
}

// Runs the GPU plan's attention and the CPU's on the GPU's lists; compares.
inline void run_and_compare(const World& w, const DeviceMirror& m, const cuda::Plan& plan,
                            int64_t window) {
  std::vector<float> out, lse;
  ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out, &lse));
  PageLists lists;
  ASSERT_TRUE(cuda::download_page_lists(plan, &lists).ok());
  std::vector<float> want_out(out.size()), want_lse(lse.size());
  ThreadPool pool(2);
  AttentionWorkspace ws;
  auto st = attend(*w.cache, 0, w.batch, lists, w.q.data(), w.hq, {.sliding_window = window},
                   want_out.data(), want_lse.data(), pool, &ws);
  ASSERT_TRUE(st.ok()) << st.to_string();
  expect_close(w, want_out, want_lse, out, lse);
}

// A sparse plan end to end: the union lists poisoned, selection on the device index queries diq,
// attention against the CPU (run_and_compare); *read: the pages its attention reads.
inline void select_attend_and_compare(const World& w, const DeviceMirror& m,
                                      const DevVec<float>& diq, const cuda::Plan& plan,
                                      int64_t* read) {
  auto* P = plan.impl();
  cudaMemset(P->d_upages.as<void>(), 0xff, P->d_upages.bytes());
  cudaMemset(P->d_uchunks.as<void>(), 0xff, P->d_uchunks.bytes());
  ASSERT_TRUE(cuda::run_select(plan, m.layer, diq.data(), nullptr).ok());
  run_and_compare(w, m, plan, 0);
  ASSERT_TRUE(cuda::count_read_pages(plan, read).ok());
}

// A dense plan's lists must be exactly chunks lo/16 … last/16 of each entry (lo = first − window
// + 1 with a window, else 0) with pages from the block table: checked on their own, since the
// attention comparison runs the CPU on the lists downloaded from the GPU.
inline void expect_dense_lists(const World& w, const cuda::Plan& plan, int64_t window) {
  PageLists lists;
  ASSERT_TRUE(cuda::download_page_lists(plan, &lists).ok());
  ASSERT_EQ(lists.groups.size(), w.batch.size());
  for (size_t gi = 0; gi < lists.groups.size(); ++gi) {
    const auto& b = w.batch[static_cast<size_t>(lists.groups[gi].entry)];
    const int64_t c0 = (window > 0 ? std::max<int64_t>(0, b.first - window + 1) : 0) / 16;
    const int64_t c1 = (b.first + b.count - 1) / 16;
    const auto table = *w.cache->block_table(b.seq);
    for (int kv = 0; kv < w.cache->num_kv_heads(); ++kv) {
      const auto c = lists.list_chunks(static_cast<int64_t>(gi), kv);
      const auto p = lists.list_pages(static_cast<int64_t>(gi), kv);
      ASSERT_EQ(static_cast<int64_t>(c.size()), c1 - c0 + 1) << "group " << gi << " kv " << kv;
      for (size_t i = 0; i < c.size(); ++i) {
        ASSERT_EQ(c[i], c0 + static_cast<int64_t>(i))
            << "group " << gi << " kv " << kv << " entry " << i;
        ASSERT_EQ(p[i], table[static_cast<size_t>(c[i])])
            << "group " << gi << " kv " << kv << " entry " << i;
      }
    }
  }
}

struct Shape {
  int hkv, hq, d;
  std::string name() const {
    return "hkv=" + std::to_string(hkv) + " hq=" + std::to_string(hq) + " d=" + std::to_string(d);
  }
};

// Four decode entries (one query row each). The 40,000-token entry is split into more than 32
// parts (2,500 pages / kMinSplitPages): a merge reads the split LSEs in two passes of 32 lanes.
inline World decode_world(const Shape& sh, std::mt19937& rng) {
  return make_world(sh.hkv, sh.hq, sh.d, {5000, 3001, 12000, 40000},
                    {{0, 4999, 1}, {1, 3000, 1}, {2, 11999, 1}, {3, 39999, 1}}, rng);
}

// A CISA plan with selection p, or a dense one (no window), of w's batch with `opt`.
inline Status plan_decode(const World& w, const DeviceMirror& m, bool sparse,
                          const SelectionParams& p, const cuda::PlanOptions& opt,
                          cuda::Plan* plan) {
  return sparse ? cuda::plan_sparse(m.layer, m.block_tables(), w.batch, w.hq, p, plan, opt)
                : cuda::plan_dense(m.layer, m.block_tables(), w.batch, w.hq, 0, plan, opt);
}

// Selection (index queries iq, or none for a dense plan), then attention three times: the same
// bits every run (nothing a launch leaves behind changes the next), and the CPU engine's result
// on the same lists.
inline void select_run_thrice_and_compare(const World& w, const DeviceMirror& m,
                                          const cuda::Plan& plan, const float* iq) {
  ASSERT_TRUE(cuda::run_select(plan, m.layer, iq, nullptr).ok());
  std::vector<float> out0, lse0;
  ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out0, &lse0));
  for (int i = 0; i < 2; ++i) {
    std::vector<float> out, lse;
    ASSERT_NO_FATAL_FAILURE(attend_on_device(w, m, plan, &out, &lse));
    EXPECT_EQ(out, out0) << "run " << i;
    EXPECT_EQ(lse, lse0) << "run " << i;
  }
  run_and_compare(w, m, plan, 0);
}

}  // namespace cisa::test
#endif  // CISA_WITH_CUDA
