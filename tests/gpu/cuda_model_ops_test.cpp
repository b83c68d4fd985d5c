// The transformer-layer kernels of src/cuda/model (model_ops.cuh) and the cuBLASLt GEMM (gemm.h)
// against CPU references: the CPU operations where the GPU must match them bit for bit (embedding,
// RoPE, f16 rounding, bf16 conversions, the paged KV store of PagedKvCache, add, gathers), fp64
// formulas with error bounds from the f32 arithmetic elsewhere (RMSNorm, activations, head means,
// the GEMM). Odd and even sizes, and pointers offset by one element, so both the vector and the
// scalar paths and the tails run; every output is NaN-poisoned first and must be written.
#include <gtest/gtest.h>

#ifdef CISA_WITH_CUDA_MODEL
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gemm.h"
#include "gpu/gpu_test_util.h"
#include "model/model_ops.h"
#include "model_ops.cuh"
#include "skinny_gemm.cuh"
#include "test_util.h"

namespace cisa::test {
namespace {

using cuda::detail::launch_add;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every element finite and within rel·|ref| + abs of the fp64 reference (NaN never passes).
::testing::AssertionResult close_to(const std::vector<float>& got, const std::vector<double>& ref,
                                    double rel, double abs) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref[i]);
    if (!std::isfinite(got[i]) || !(err <= rel * std::fabs(ref[i]) + abs))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << ref[i];
  }
  return ::testing::AssertionSuccess();
}

// Bit-identical floats.
::testing::AssertionResult same_bits(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

// A device copy of h placed `offset` elements into its buffer (offset 1: misaligned for vectors).
template <class T>
struct Placed {
  DevVec<T> buf;
  size_t off = 0;
  Placed(const std::vector<T>& h, size_t offset) : off(offset) {
    std::vector<T> p(offset, T{});
    p.insert(p.end(), h.begin(), h.end());
    buf.upload(p);
  }
  Placed(size_t n, size_t offset) : buf(n + offset), off(offset) { buf.poison(); }
  T* ptr() const { return buf.data() + off; }
  std::vector<T> get() const {
    auto h = buf.download();
    return {h.begin() + static_cast<std::ptrdiff_t>(off), h.end()};
  }
};

TEST(CudaModelOps, EmbedMatchesTableTimesScale) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(1);
  const int64_t vocab = 50;
  for (int64_t n : {1, 7, 132, 1152})
    for (int64_t rows : {1, 5, 33})
      for (size_t off : {0, 1}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " rows=" + std::to_string(rows) +
                     " off=" + std::to_string(off));
        const auto table = to_bf16(random_vec(rng, static_cast<size_t>(vocab * n)));
        std::vector<int32_t> tok(static_cast<size_t>(rows));
        for (auto& t : tok) t = static_cast<int32_t>(rng() % vocab);
        tok[0] = static_cast<int32_t>(vocab);  // out of range: a NaN row when checked
        Placed<uint16_t> dt(table, off);
        DevVec<int32_t> dtok;
        dtok.upload(tok);
        Placed<float> x(static_cast<size_t>(rows * n), off);
        const float scale = 33.9411255f;  // √1152, Gemma's embedding scale
        CUDA_OK(cuda::detail::launch_embed(dt.ptr(), dtok.data(), rows, n, scale, x.ptr(), nullptr,
                                           vocab));
        CUDA_OK(cudaDeviceSynchronize());
        auto got = x.get();
        std::vector<float> want(got.size());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < n; ++i)
            want[r * n + i] = r == 0 ? kNaN : bf16_to_f32(table[tok[r] * n + i]) * scale;
        for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(got[i])) << i;
        std::fill(got.begin(), got.begin() + n, 0.0f);
        std::fill(want.begin(), want.begin() + n, 0.0f);
        EXPECT_TRUE(same_bits(got, want));
      }
}

TEST(CudaModelOps, RmsNormMatchesFp64InAndOutOfPlace) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (int n : {1, 7, 64, 256, 640, 1000, 1027, 1152, 2051, 4096, 5376})
    for (int64_t rows : {1, 3, 17})
      for (int mode = 0; mode < 4; ++mode) {  // bit 0: gain, bit 1: in place; odd n also misaligned
        SCOPED_TRACE("n=" + std::to_string(n) + " rows=" + std::to_string(rows) +
                     " mode=" + std::to_string(mode));
        const bool gain = mode & 1, in_place = mode & 2;
        const size_t off = n % 2;
        const auto x = random_vec(rng, static_cast<size_t>(rows * n), 2.0f);
        const auto w = random_vec(rng, static_cast<size_t>(n));
        const float eps = 1e-6f;
        Placed<float> dx(x, off), dw(w, off), dy(x.size(), off);
        float* y = in_place ? dx.ptr() : dy.ptr();
        CUDA_OK(cuda::detail::launch_rms_norm(dx.ptr(), gain ? dw.ptr() : nullptr, y, rows, n, eps,
                                              nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<double> want(x.size());
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
          const double s = 1.0 / std::sqrt(ss / n + eps);
          for (int i = 0; i < n; ++i) want[r * n + i] = x[r * n + i] * s * (gain ? w[i] : 1.0);
        }
        // f32: the sum of squares (tree order, ~log2(n) roundings), 1/√, two products.
        EXPECT_TRUE(close_to(in_place ? dx.get() : dy.get(), want, 1e-5, 1e-30));
      }
}

TEST(CudaModelOps, RopeBitIdenticalToCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kNorm})
    for (int d : {2, 6, 64, 128, 256})
      for (int heads : {1, 3, 8})
        for (int64_t rows : {1, 5}) {
          SCOPED_TRACE("d=" + std::to_string(d) + " heads=" + std::to_string(heads) +
                       " rows=" + std::to_string(rows));
          std::vector<int64_t> pos(static_cast<size_t>(rows));
          for (auto& p : pos) p = static_cast<int64_t>(rng() % 40000);
          std::vector<float> cs(static_cast<size_t>(rows * d / 2)), sn(cs.size());
          ops::rope_table(pos.data(), rows, d, 10000.0, cs.data(), sn.data());
          auto x = random_vec(rng, static_cast<size_t>(rows * heads * d), 3.0f);
          Placed<float> dx(x, 0), dc(cs, 0), ds(sn, 0);
          CUDA_OK(cuda::detail::launch_rope(dx.ptr(), rows, heads, d, dc.ptr(), ds.ptr(),
                                            style == RopeStyle::kNeox, nullptr));
          CUDA_OK(cudaDeviceSynchronize());
          for (int64_t r = 0; r < rows; ++r)
            for (int h = 0; h < heads; ++h)
              ops::rope_apply(x.data() + (r * heads + h) * d, cs.data() + r * d / 2,
                              sn.data() + r * d / 2, d, style);
          EXPECT_TRUE(same_bits(dx.get(), x));
        }
  EXPECT_EQ(cudaErrorInvalidValue,
            cuda::detail::launch_rope(nullptr, 1, 1, 3, nullptr, nullptr, true, nullptr));
}

TEST(CudaModelOps, GatedActivationsMatchFp64AndCpu) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(4);
  for (bool gelu : {true, false})
    for (int64_t n : {1, 7, 640, 6913})
      for (int64_t rows : {1, 3})
        for (int alias = 0; alias < 3; ++alias) {  // 0: separate out, 1: out = gate, 2: out = up
          SCOPED_TRACE(std::string(gelu ? "gelu" : "silu") + " n=" + std::to_string(n) +
                       " alias=" + std::to_string(alias));
          const size_t m = static_cast<size_t>(rows * n), off = static_cast<size_t>(n % 2);
          const auto g = random_vec(rng, m, 4.0f), u = random_vec(rng, m);
          Placed<float> dg(g, off), du(u, off), dout(m, off);
          float* out = alias == 1 ? dg.ptr() : alias == 2 ? du.ptr() : dout.ptr();
          CUDA_OK(cuda::detail::launch_gated_activation(gelu, dg.ptr(), du.ptr(), out, rows, n,
                                                        nullptr));
          CUDA_OK(cudaDeviceSynchronize());
          const auto got = alias == 1 ? dg.get() : alias == 2 ? du.get() : dout.get();
          std::vector<double> want(m), cpu(m);
          for (size_t i = 0; i < m; ++i) {
            const double x = g[i];
            const double a =
                gelu ? 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
                     : x / (1 + std::exp(-x));
            want[i] = a * u[i];
            cpu[i] = double(gelu ? ops::gelu_tanh(g[i]) : ops::silu(g[i])) * u[i];
          }
          // expf of −2u with u rounded in f32 (relative error ~|2u| ulp of the tiny values of very
          // negative x: absolute), then the division: a few ulp of f32.
          EXPECT_TRUE(close_to(got, want, 1e-5, 1e-6));
          EXPECT_TRUE(close_to(got, cpu, 2e-5, 1e-6));
        }
}

TEST(CudaModelOps, AddRoundF16AndConversionsBitExact) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int64_t n : {1, 3, 4, 1001, 65536 + 5})
    for (size_t off : {0, 1}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " off=" + std::to_string(off));
      auto x = random_vec(rng, static_cast<size_t>(n));
      std::uniform_real_distribution<float> e(-30.0f, 20.0f);
      for (auto& v : x) v *= std::exp2(e(rng));  // 2^-30 … 2^20: f16 subnormals, overflow to inf
      const float special[] = {65504.0f,
                               65519.0f,
                               65520.0f,
                               -65520.0f,
                               5.9604645e-8f,
                               2.9802322e-8f,
                               -0.0f,
                               std::numeric_limits<float>::infinity(),
                               1.00390625f /*bf16 tie*/,
                               1.01171875f,
                               std::numeric_limits<float>::denorm_min()};
      for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i] = special[i];
      const auto y = random_vec(rng, x.size());

      Placed<float> dy(y, off), dx(x, off);
      Placed<uint16_t> dh(x.size(), off);
      Placed<float> dback(x.size(), off);
      CUDA_OK(launch_add(dy.ptr(), dx.ptr(), n, nullptr));
      CUDA_OK(cuda::detail::launch_f32_to_bf16(dx.ptr(), dh.ptr(), n, nullptr));
      CUDA_OK(cuda::detail::launch_bf16_to_f32(dh.ptr(), dback.ptr(), n, nullptr));
      CUDA_OK(cuda::detail::launch_round_f16(dx.ptr(), n, nullptr));
      CUDA_OK(cudaDeviceSynchronize());

      auto sum = y;
      ops::add_inplace(sum.data(), x.data(), n);
      EXPECT_TRUE(same_bits(dy.get(), sum));
      auto r = x;
      ops::round_to_f16(r.data(), n);
      EXPECT_TRUE(same_bits(dx.get(), r));
      const auto h = to_bf16(x);
      EXPECT_EQ(dh.get(), h);
      std::vector<float> back(h.size());
      for (size_t i = 0; i < h.size(); ++i) back[i] = bf16_to_f32(h[i]);
      EXPECT_TRUE(same_bits(dback.get(), back));
    }
  // NaN keeps its quiet bit through both conversions, as cisa::f32_to_bf16 does.
  DevVec<float> nan_in;
  nan_in.upload(std::vector<float>{kNaN, -kNaN});
  DevVec<uint16_t> nan_h(2);
  CUDA_OK(cuda::detail::launch_f32_to_bf16(nan_in.data(), nan_h.data(), 2, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(nan_h.download(), to_bf16({kNaN, -kNaN}));
}

TEST(CudaModelOps, MeanHeadsMatchesFp64) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(6);
  struct Case {
    int hq, hkv, d;
  };
  for (Case c : {Case{8, 2, 128}, Case{4, 4, 64}, Case{16, 1, 256}, Case{6, 3, 5}, Case{3, 1, 7},
                 Case{32, 8, 128}})
    for (int64_t rows : {1, 7}) {
      SCOPED_TRACE("hq=" + std::to_string(c.hq) + " hkv=" + std::to_string(c.hkv) +
                   " d=" + std::to_string(c.d));
      const auto q = random_vec(rng, static_cast<size_t>(rows * c.hq * c.d));
      const size_t off = c.d % 2;
      Placed<float> dq(q, off), dout(static_cast<size_t>(rows * c.hkv * c.d), off);
      CUDA_OK(
          cuda::detail::launch_mean_heads(dq.ptr(), rows, c.hq, c.hkv, c.d, dout.ptr(), nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const int gs = c.hq / c.hkv;
      std::vector<double> want(static_cast<size_t>(rows * c.hkv * c.d), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < c.hq; ++h)
          for (int i = 0; i < c.d; ++i)
            want[(r * c.hkv + h / gs) * c.d + i] += q[(r * c.hq + h) * c.d + i] / gs;
      // gs − 1 f32 additions of values ~1 (absolute error ≤ gs · 2^-24 · max|q|) and one product.
      EXPECT_TRUE(close_to(dout.get(), want, 1e-6, 1e-5));
    }
  EXPECT_EQ(cudaErrorInvalidValue,
            cuda::detail::launch_mean_heads(nullptr, 1, 6, 4, 8, nullptr, nullptr));
}

TEST(CudaModelOps, GatherRowsExact) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (int64_t width : {1, 7, 128, 130})
    for (size_t off : {0, 1}) {
      const int64_t src_rows = 40, n = 23;
      const auto x = random_vec(rng, static_cast<size_t>(src_rows * width));
      std::vector<int64_t> idx(static_cast<size_t>(n));
      for (auto& i : idx) i = static_cast<int64_t>(rng() % src_rows);  // repeats allowed
      Placed<float> dx(x, off), dout(static_cast<size_t>(n * width), off);
      DevVec<int64_t> didx;
      didx.upload(idx);
      CUDA_OK(
          cuda::detail::launch_gather_rows(dx.ptr(), didx.data(), n, width, dout.ptr(), nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> want;
      for (auto i : idx)
        want.insert(want.end(), x.begin() + i * width, x.begin() + (i + 1) * width);
      EXPECT_TRUE(same_bits(dout.get(), want)) << "width=" << width << " off=" << off;
    }
}

// The device append writes exactly what PagedKvCache::append stores (same pages, same bf16 bits)
// and nothing else: the rest of the poisoned pools stays poisoned.
TEST(CudaModelOps, AppendKvMatchesPagedKvCache) {
  CISA_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (int d : {64, 128, 256})
    for (int hkv : {1, 4}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " hkv=" + std::to_string(hkv));
      auto cache = *PagedKvCache::create({.num_layers = 1,
                                          .num_kv_heads = hkv,
                                          .head_dim = d,
                                          .page_size = 16,
                                          .num_pages = 24,
                                          .dtype = KvDtype::kBF16});
      ASSERT_EQ(*cache->add_sequence(), 0);
      ASSERT_EQ(*cache->add_sequence(), 1);
      append_random(*cache, 0, 21, rng);  // history, so the step starts mid-page
      append_random(*cache, 1, 3, rng);
      append_random(*cache, 0, 16, rng);
      // The step: 19 tokens of sequence 0, then 30 of sequence 1 (pages interleaved in the pool).
      const std::pair<SeqId, int64_t> step[] = {{0, 19}, {1, 30}};
      const size_t row = static_cast<size_t>(hkv * d);
      std::vector<float> k, v;
      std::vector<int64_t> slots;
      for (auto [seq, count] : step) {
        const int64_t start = *cache->length(seq);
        ASSERT_TRUE(cache->reserve(seq, count).ok());
        const auto ks = random_vec(rng, static_cast<size_t>(count) * row),
                   vs = random_vec(rng, ks.size());
        ASSERT_TRUE(cache->append(0, seq, count, ks.data(), vs.data()).ok());
        k.insert(k.end(), ks.begin(), ks.end());
        v.insert(v.end(), vs.begin(), vs.end());
        const auto table = *cache->block_table(seq);
        for (int64_t p = start; p < start + count; ++p)
          slots.push_back(int64_t{table[p / 16]} * 16 + p % 16);
      }
      slots.push_back(-1);  // a padding row: must store nothing
      k.resize(k.size() + row, 7.0f);
      v.resize(v.size() + row, 7.0f);
      const int64_t rows = static_cast<int64_t>(slots.size());
      const size_t pool = static_cast<size_t>(cache->num_pages()) * hkv * 16 * d;
      DevVec<uint16_t> kp(pool), vp(pool);
      kp.poison();
      vp.poison();
      DevVec<float> dk, dv;
      dk.upload(k);
      dv.upload(v);
      DevVec<int64_t> ds;
      ds.upload(slots);
      CUDA_OK(cuda::detail::launch_append_kv(dk.data(), dv.data(), ds.data(), rows, hkv, d,
                                             kp.data(), vp.data(), nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint16_t> want_k(pool, 0xffff), want_v(pool, 0xffff);
      const auto* ck = static_cast<const uint16_t*>(cache->k_pool(0));
      const auto* cv = static_cast<const uint16_t*>(cache->v_pool(0));
      for (int64_t s : slots) {
        if (s < 0) continue;
        for (int g = 0; g < hkv; ++g) {
          const size_t at = static_cast<size_t>(((s / 16 * hkv + g) * 16 + s % 16) * d);
          std::copy(ck + at, ck + at + d, want_k.begin() + static_cast<std::ptrdiff_t>(at));
          std::copy(cv + at, cv + at + d, want_v.begin() + static_cast<std::ptrdiff_t>(at));
        }
      }
      EXPECT_EQ(kp.download(), want_k);
      EXPECT_EQ(vp.download(), want_v);
    }
  // Head dims PagedKvCache does not take (not a multiple of 4: the scalar path), by the formula.
  const int d = 6, hkv = 3;
  const std::vector<int64_t> slots = {5, 16 * 2 + 15, 17};
  const auto k = random_vec(rng, slots.size() * hkv * d), v = random_vec(rng, k.size());
  DevVec<float> dk, dv;
  dk.upload(k);
  dv.upload(v);
  DevVec<int64_t> ds;
  ds.upload(slots);
  const size_t pool = size_t{3} * hkv * 16 * d;
  DevVec<uint16_t> kp(pool), vp(pool);
  kp.poison();
  vp.poison();
  CUDA_OK(cuda::detail::launch_append_kv(dk.data(), dv.data(), ds.data(), 3, hkv, d, kp.data(),
                                         vp.data(), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> want_k(pool, 0xffff), want_v(pool, 0xffff);
  for (size_t r = 0; r < slots.size(); ++r)
    for (int g = 0; g < hkv; ++g)
      for (int i = 0; i < d; ++i) {
        const size_t at =
            static_cast<size_t>(((slots[r] / 16 * hkv + g) * 16 + slots[r] % 16) * d + i);
        want_k[at] = f32_to_bf16(k[(r * hkv + g) * d + i]);
        want_v[at] = f32_to_bf16(v[(r * hkv + g) * d + i]);
      }
  EXPECT_EQ(kp.download(), want_k);
  EXPECT_EQ(vp.download(), want_v);
}

// y = x Wᵀ against an fp64 product of the same bf16 values; the columns past n of a wider y
// stay poisoned.
TEST(CudaGemm, MatchesFp64Product) {
  CISA_REQUIRE_GPU();
  auto gemm_or = cuda::Gemm::create();
  ASSERT_TRUE(gemm_or.ok()) << gemm_or.status().to_string();
  auto& gemm = *gemm_or;
  std::mt19937 rng(9);
  struct Shape {
    int64_t n, k, pad;
  };
  for (Shape s :
       {Shape{1152, 640, 0}, Shape{4096, 4096, 0}, Shape{2048, 5632, 4}, Shape{24, 40, 0}}) {
    const auto w = to_bf16(random_vec(rng, static_cast<size_t>(s.n * s.k), 0.05f));
    std::vector<double> wf(w.size());
    for (size_t i = 0; i < w.size(); ++i) wf[i] = bf16_to_f32(w[i]);
    DevVec<uint16_t> dw;
    dw.upload(w);
    for (int64_t rows : {1, 3, 16, 257}) {
      SCOPED_TRACE("n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                   " rows=" + std::to_string(rows));
      const int64_t ldy = s.n + s.pad;
      const auto x = to_bf16(random_vec(rng, static_cast<size_t>(rows * s.k)));
      DevVec<uint16_t> dx;
      dx.upload(x);
      DevVec<float> dy(static_cast<size_t>(rows * ldy));
      dy.poison();
      ASSERT_TRUE(gemm->run(dw.data(), s.n, s.k, dx.data(), rows, dy.data(), ldy, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      const auto y = dy.download();
      // Every row for small products; 24 rows (first and last among them) for the large ones.
      std::vector<int64_t> check;
      for (int64_t r = 0; r < rows; ++r)
        if (rows <= 16 || r == 0 || r == rows - 1 || rng() % rows < 22) check.push_back(r);
      for (int64_t r : check) {
        std::vector<double> xr(static_cast<size_t>(s.k));
        for (int64_t c = 0; c < s.k; ++c) xr[c] = bf16_to_f32(x[r * s.k + c]);
        double err2 = 0, ref2 = 0;
        for (int64_t o = 0; o < s.n; ++o) {
          const double* wo = wf.data() + o * s.k;
          double acc = 0;
          for (int64_t c = 0; c < s.k; ++c) acc += wo[c] * xr[c];
          const float got = y[r * ldy + o];
          ASSERT_TRUE(std::isfinite(got)) << "row " << r << " col " << o;
          err2 += (got - acc) * (got - acc);
          ref2 += acc * acc;
        }
        // f32 accumulation of k products: relative L2 error ~√k · 2^-24 ≪ 1e-3; a layout error is
        // O(1).
        EXPECT_LE(std::sqrt(err2 / ref2), 1e-3) << "row " << r;
        for (int64_t o = s.n; o < ldy; ++o)
          EXPECT_EQ(bits(y[r * ldy + o]), 0xffffffffu) << "padding touched";
      }
    }
  }
  EXPECT_GE(gemm->cached_shapes(), 16);
  // describe(): a line per cached shape, naming it and what ran it; timed shapes (≤ 256 rows and
  // more than one candidate) say how long their pick took.
  const std::vector<std::string> lines = gemm->describe();
  ASSERT_EQ(static_cast<int64_t>(lines.size()), gemm->cached_shapes());
  for (const std::string& line : lines) {
    EXPECT_TRUE(line.find("kernel") != std::string::npos ||
                line.find("cuBLASLt algorithm") != std::string::npos)
        << line;
    const bool timed = line.find(" us (median of 5") != std::string::npos;
    EXPECT_NE(timed, line.find("untimed") != std::string::npos) << line;
    EXPECT_FALSE(timed && line.find(", 257 rows:") != std::string::npos) << line;
  }
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.rfind("4096 x 4096, 3 rows: ", 0) == 0;
  }));
  // The same shape again reuses its plan.
  const int64_t cached = gemm->cached_shapes();
  DevVec<uint16_t> w(24 * 40), x(40);
  DevVec<float> y(24);
  ASSERT_TRUE(gemm->run(w.data(), 24, 40, x.data(), 1, y.data(), 24, nullptr).ok());
  EXPECT_EQ(gemm->cached_shapes(), cached);
  EXPECT_EQ(gemm->run(w.data(), 24, 40, x.data(), 1, y.data(), 23, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm->run(nullptr, 24, 40, x.data(), 1, y.data(), 24, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm->run(w.data(), 0, 40, x.data(), 1, y.data(), 24, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(gemm->run(w.data(), 24, 40, x.data(), 0, y.data(), 24, nullptr).ok());
}

// Runs a few-row kernel (launch(w, n, k, x, rows, y, ldy, splits, workspace, counters)) on
// random shapes, row counts and K splits, against fp64 element by element, the padding of a wider
// y untouched, and the split-K sum deterministic (two runs bit-identical; the counters are left
// at zero, so a second run sums the same way).
template <typename Launch>
void check_few_row_kernel(const char* name,
                          std::initializer_list<std::tuple<int64_t, int64_t, int64_t>> shapes,
                          std::initializer_list<int64_t> row_counts, int64_t k_step,
                          Launch launch) {
  std::mt19937 rng(21);
  DevVec<float> ws(1 << 22);
  DevVec<int> counters(4096);
  CUDA_OK(cudaMemset(counters.data(), 0, 4096 * sizeof(int)));
  for (const auto& [n, k, pad] : shapes) {
    const auto w = to_bf16(random_vec(rng, static_cast<size_t>(n * k), 0.05f));
    DevVec<uint16_t> dw;
    dw.upload(w);
    const int64_t steps = k / k_step;
    for (int64_t rows : row_counts) {
      const auto x = to_bf16(random_vec(rng, static_cast<size_t>(rows * k)));
      DevVec<uint16_t> dx;
      dx.upload(x);
      std::vector<double> ref(static_cast<size_t>(rows * n)), mag(ref.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n; ++o) {
          double acc = 0, a = 0;
          for (int64_t c = 0; c < k; ++c) {
            const double p = double(bf16_to_f32(w[o * k + c])) * bf16_to_f32(x[r * k + c]);
            acc += p;
            a += std::fabs(p);
          }
          ref[r * n + o] = acc;
          mag[r * n + o] = a;
        }
      for (int64_t splits : {int64_t{1}, int64_t{3}, int64_t{7}, steps}) {
        SCOPED_TRACE(std::string(name) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                     " rows=" + std::to_string(rows) + " splits=" + std::to_string(splits));
        const int64_t ldy = n + pad;
        std::vector<float> y[2];
        for (int run = 0; run < 2; ++run) {
          DevVec<float> dy(static_cast<size_t>(rows * ldy));
          dy.poison();
          CUDA_OK(launch(dw.data(), n, k, dx.data(), rows, dy.data(), ldy, static_cast<int>(splits),
                         ws.data(), counters.data()));
          CUDA_OK(cudaDeviceSynchronize());
          y[run] = dy.download();
        }
        EXPECT_TRUE(same_bits(y[1], y[0])) << "two runs differ";
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t o = 0; o < n; ++o) {
            const float got = y[0][r * ldy + o];
            // f32 sums of k bf16 products (the tensor cores' f32 adds may truncate): within k ·
            // 2^-22 of Σ|products|, and finite.
            ASSERT_TRUE(std::isfinite(got) &&
                        std::fabs(got - ref[r * n + o]) <=
                            double(k) * std::ldexp(mag[r * n + o], -22) + 1e-30)
                << "row " << r << " col " << o << ": " << got << " vs " << ref[r * n + o];
          }
          for (int64_t o = n; o < ldy; ++o)
            ASSERT_EQ(bits(y[0][r * ldy + o]), 0xffffffffu) << "padding touched";
        }
      }
    }
  }
  EXPECT_EQ(counters.download(), std::vector<int>(4096, 0)) << "counters not left at zero";
}

// The tensor-core few-row kernel (skinny_gemm.cuh) directly, at every K split it may be given.
TEST(CudaSkinnyGemm, MatchesFp64AtEverySplit) {
  CISA_REQUIRE_GPU();
  for (int unroll : {4, 8})
    check_few_row_kernel(
        unroll == 4 ? "unroll 4" : "unroll 8", {{64, 32, 0}, {192, 640, 3}, {1024, 3584, 0}},
        {1, 5, 8, 9, 16}, cuda::detail::kSkinnyKStep,
        [unroll](const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t rows, float* y,
                 int64_t ldy, int splits, float* ws, int* counters) {
          return cuda::detail::launch_skinny_gemm(w, n, k, x, rows, y, ldy, splits, ws, counters,
                                                  nullptr, unroll);
        });
  // Shapes it does not take are refused, not run.
  EXPECT_FALSE(cuda::detail::skinny_gemm_applies(24, 40, 1, nullptr, nullptr, 4096));
  EXPECT_FALSE(cuda::detail::skinny_gemm_applies(64, 32, 17, nullptr, nullptr, 4096));
  EXPECT_EQ(cuda::detail::launch_skinny_gemm(nullptr, 64, 32, nullptr, 1, nullptr, 64, 1, nullptr,
                                             nullptr, nullptr),
            cudaErrorInvalidValue);
}

// The streaming few-row kernel, with 4 and 8 W rows per warp, at every row count it takes.
TEST(CudaSkinnyStream, MatchesFp64AtEverySplit) {
  CISA_REQUIRE_GPU();
  for (int per_warp : {4, 8})
    check_few_row_kernel(
        per_warp == 4 ? "4 rows a warp" : "8 rows a warp",
        {{64, 256, 0}, {192, 768, 3}, {1024, 3584, 0}}, {1, 2, 3, 4}, cuda::detail::kStreamKStep,
        [per_warp](const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t rows,
                   float* y, int64_t ldy, int splits, float* ws, int* counters) {
          return cuda::detail::launch_skinny_stream(w, n, k, x, rows, y, ldy, splits, ws, counters,
                                                    nullptr, per_warp);
        });
  EXPECT_TRUE(cuda::detail::skinny_stream_applies(3584, 18944, 2, nullptr, nullptr, 4096, 8));
  EXPECT_FALSE(cuda::detail::skinny_stream_applies(64, 256, 5, nullptr, nullptr, 4096, 8));
  EXPECT_FALSE(cuda::detail::skinny_stream_applies(96, 256, 1, nullptr, nullptr, 4096, 8));
  EXPECT_FALSE(cuda::detail::skinny_stream_applies(64, 640, 1, nullptr, nullptr, 4096, 4));
  EXPECT_FALSE(cuda::detail::skinny_stream_applies(64, 256, 1, nullptr, nullptr, 4096, 6));
  EXPECT_EQ(cuda::detail::launch_skinny_stream(nullptr, 64, 256, nullptr, 1, nullptr, 64, 1,
                                               nullptr, nullptr, nullptr, 8),
            cudaErrorInvalidValue);
  // The split candidates of the 3584 x 18944 down projection on 132 SMs (56 tiles): 2 and 4
  // (112 and 224 blocks, 85 % of 1 and 2 per SM; ties to fewer splits), 7 (392 blocks, 3 per SM,
  // 99 %), and ⌈264 / 56⌉ = 5.
  EXPECT_EQ(cuda::detail::skinny_stream_splits(3584, 18944, 132, 8),
            (std::vector<int>{2, 4, 7, 5}));
}

// The balanced K splits the per-shape timing adds (host arithmetic, no device needed): against
// a brute force over every split, and the decode shapes of the Qwen2.5-7B step on 132 SMs.
TEST(CudaSkinnyGemm, BalancedSplitsSpreadBlocksEvenly) {
  const auto balance = [](int64_t blocks, int sms) {
    return static_cast<double>(blocks) / (static_cast<double>(sms) * ((blocks + sms - 1) / sms));
  };
  for (const auto& [n, k, sms] :
       std::vector<std::tuple<int64_t, int64_t, int>>{{3584, 18944, 132},
                                                      {4608, 3584, 132},
                                                      {3584, 3584, 132},
                                                      {37888, 3584, 132},
                                                      {64, 32, 132},
                                                      {1024, 3584, 78},
                                                      {152064, 3584, 132}}) {
    SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k));
    const auto got = cuda::detail::skinny_gemm_balanced_splits(n, k, sms);
    const int64_t tiles = n / 64, max_splits = std::max<int64_t>(1, k / 256);
    double best = 0;
    for (int64_t s = 1; s <= max_splits; ++s) {
      const int64_t per_sm = (tiles * s + sms - 1) / sms;
      if (per_sm >= 2 && per_sm <= 16) best = std::max(best, balance(tiles * s, sms));
    }
    ASSERT_LE(got.size(), 2u);
    if (best == 0) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    ASSERT_FALSE(got.empty());
    EXPECT_DOUBLE_EQ(balance(tiles * got[0], sms), best);
    for (const int s : got) {
      EXPECT_GE(s, 1);
      EXPECT_LE(s, max_splits);
      const int64_t per_sm = (tiles * s + sms - 1) / sms;
      EXPECT_GE(per_sm, 2);
      EXPECT_LE(per_sm, 16);
    }
    if (got.size() == 2) {
      EXPECT_GE(balance(tiles * got[0], sms), balance(tiles * got[1], sms));
    }
  }
  // 56 tiles x 33 splits = 14 blocks on each of 132 SMs; 72 x 11 = 6 on each.
  EXPECT_EQ(cuda::detail::skinny_gemm_balanced_splits(3584, 18944, 132).front(), 33);
  EXPECT_EQ(cuda::detail::skinny_gemm_balanced_splits(4608, 3584, 132).front(), 11);
}

}  // namespace
}  // namespace cisa::test

#endif  // CISA_WITH_CUDA_MODEL
