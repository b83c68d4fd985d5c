// The CUDA model backend against the CPU backend, op by op (ggml's test-backend-ops idea): every
// Backend operation runs on both with the same fresh random inputs and the outputs are compared
// under tolerances that follow from the GPU's bf16 storage (weights, GEMM inputs); NaN never
// passes, and GPU outputs start as NaN so an unwritten element fails. The paged KV cache and
// attention are in cuda_backend_kv_test.cpp.
#include <gtest/gtest.h>

#if defined(CISA_WITH_CUDA_MODEL)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/cuda/model_backend.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "gpu/cuda_backend_test_util.h"

namespace cisa::test {
namespace {

// One operation: inputs (host values uploaded to both backends), an output buffer (`out_init`,
// or NaN), the call on one backend, and the allowed |gpu − cpu| of output element i.
struct OpCase {
  std::string name;
  std::vector<std::vector<float>> inputs;
  int64_t out_size = 0;
  std::vector<float> out_init;
  std::function<Status(Backend&, const std::vector<float*>& in, float* out)> run;
  std::function<double(size_t i, float want)> tol;
};

// cos and sin of n angles uniform in (-π, π): RoPE tables.
std::pair<std::vector<float>, std::vector<float>> random_angles(std::mt19937& rng, int n) {
  std::vector<float> cs, sn;
  std::uniform_real_distribution<float> angle(-3.14f, 3.14f);
  for (int i = 0; i < n; ++i) {
    const float a = angle(rng);
    cs.push_back(std::cos(a));
    sn.push_back(std::sin(a));
  }
  return {cs, sn};
}

void run_case(BackendPair& b, const OpCase& c) {
  SCOPED_TRACE(c.name);
  std::vector<float> init = c.out_init;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (init.empty()) init.assign(static_cast<size_t>(c.out_size), nan);
  std::vector<float> result[2];
  Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
  for (int k = 0; k < 2; ++k) {
    std::vector<std::unique_ptr<BackendBuffer>> bufs;
    std::vector<float*> in;
    for (const auto& v : c.inputs) {
      bufs.push_back(upload_f32(*bes[k], v));
      in.push_back(bufs.back()->f32());
    }
    auto out = upload_f32(*bes[k], init);
    ASSERT_TRUE(out);
    const Status st = c.run(*bes[k], in, out->f32());
    ASSERT_TRUE(st.ok()) << bes[k]->description() << ": " << st.to_string();
    result[k] = download_f32(*bes[k], *out, static_cast<int64_t>(init.size()));
  }
  expect_within(result[0], result[1], c.tol);
}

TEST(CudaBackendOps, MatchTheCpuBackend) {
  CISA_REQUIRE_GPU();
  BackendPair b = make_backend_pair();
  ASSERT_TRUE(b.gpu) << "the CUDA model backend did not start";
  std::mt19937 rng(7);
  std::vector<OpCase> cases;
  // The CPU backend multiplies the GGUF bytes in place: they must outlive the cases.
  std::vector<std::unique_ptr<HostMatrix>> weights;

  // matmul: one f32 and one Q8_0 WeightView bound on both. The GPU rounds W and x to bf16
  // (2^-9 relative each) and sums in f32; the CPU's Q8_0 product also quantises x to 8 bits per
  // block of 32 (error ≤ max|x_block| / 254 per element).
  for (bool q8 : {false, true}) {
    const int64_t n = 96, k = 160, rows = 5, ldy = q8 ? n + 8 : n;
    const HostMatrix& w = *weights.emplace_back(
        std::make_unique<HostMatrix>(q8 ? make_q8_0(rng, n, k) : make_f32(rng, n, k)));
    auto x = random_vec(rng, static_cast<size_t>(rows * k));
    std::vector<double> bound(static_cast<size_t>(rows * ldy), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < n; ++o) {
        double abs_sum = 0, w_sum = 0, xmax = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double wv = w.values[static_cast<size_t>(o * k + c)],
                       xv = x[static_cast<size_t>(r * k + c)];
          abs_sum += std::fabs(wv * xv);
          w_sum += std::fabs(wv);
          xmax = std::max(xmax, std::fabs(xv));
        }
        bound[static_cast<size_t>(r * ldy + o)] =
            std::ldexp(abs_sum, -7) + (q8 ? w_sum * xmax / 254.0 : 0.0) + 1e-6;
      }
    auto mc = b.cpu->bind_matrix(w.view()), mg = b.gpu->bind_matrix(w.view());
    ASSERT_TRUE(mc.ok() && mg.ok()) << (mg.ok() ? mc.status() : mg.status()).to_string();
    // Padding columns of ldy keep their initial value (7) on both backends.
    cases.push_back({.name = q8 ? "matmul q8_0, ldy > n" : "matmul f32",
                     .inputs = {x},
                     .out_size = rows * ldy,
                     .out_init = std::vector<float>(static_cast<size_t>(rows * ldy), 7.0f),
                     .run =
                         [=](Backend& be, const std::vector<float*>& in, float* out) {
                           return be.matmul(be.kind() == BackendKind::kCpu ? *mc : *mg, in[0], out,
                                            rows, ldy);
                         },
                     .tol = [bound](size_t i, float) { return bound[i]; }});
  }

  // embed: the table is bound as f32 on both; the GPU holds it in bf16.
  {
    const int64_t vocab = 50, e = 64;
    const HostMatrix& t =
        *weights.emplace_back(std::make_unique<HostMatrix>(make_f32(rng, vocab, e)));
    auto tc = b.cpu->bind_matrix(t.view()), tg = b.gpu->bind_matrix(t.view());
    ASSERT_TRUE(tc.ok() && tg.ok());
    const std::vector<int32_t> tokens = {3, 0, 49, 3, 17, 25};
    auto tok_c = upload_i32(*b.cpu, tokens), tok_g = upload_i32(*b.gpu, tokens);
    const int32_t* pc = tok_c->i32();
    const int32_t* pg = tok_g->i32();
    cases.push_back(
        {.name = "embed",
         .out_size = static_cast<int64_t>(tokens.size()) * e,
         .run =
             [=](Backend& be, const std::vector<float*>&, float* out) {
               const bool cpu = be.kind() == BackendKind::kCpu;
               return be.embed(cpu ? *tc : *tg, cpu ? pc : pg, 6, 1.7f, out);
             },
         .tol = [](size_t, float want) { return std::ldexp(std::fabs(want), -8) + 1e-7; }});
    b.keep.push_back(std::move(tok_c));
    b.keep.push_back(std::move(tok_g));
  }

  // rms_norm (with and without gain, in place): f32 sums of squares vs the CPU's double.
  for (bool gain : {true, false}) {
    const int rows = 7, n = 640;
    auto x = random_vec(rng, rows * n, 3.0f);
    cases.push_back({.name = gain ? "rms_norm" : "rms_norm, no gain, in place",
                     .inputs = {random_vec(rng, n)},
                     .out_init = x,
                     .run =
                         [=](Backend& be, const std::vector<float*>& in, float* out) {
                           return be.rms_norm(out, gain ? in[0] : nullptr, out, rows, n, 1e-6f);
                         },
                     .tol = [](size_t, float want) { return 1e-5 * std::fabs(want) + 1e-6; }});
  }

  // add_rms_norm, with rows of both kernels (warp: n ≤ 1024, block above): x += o, written back
  // (exact on both), then xn = rms_norm(x) (as rms_norm).
  for (int n : {640, 3584}) {
    const int rows = 5;
    std::vector<float> init = random_vec(rng, rows * n, 3.0f);
    init.resize(static_cast<size_t>(2 * rows * n), std::nanf(""));
    cases.push_back({.name = "add_rms_norm n=" + std::to_string(n),
                     .inputs = {random_vec(rng, rows * n), random_vec(rng, n)},
                     .out_init = init,
                     .run =
                         [=](Backend& be, const std::vector<float*>& in, float* out) {
                           return be.add_rms_norm(out, in[0], in[1], out + rows * n, rows, n,
                                                  1e-6f);
                         },
                     .tol = [](size_t, float want) { return 1e-5 * std::fabs(want) + 1e-6; }});
  }

  // rope, both pairings: the same fma and product as the CPU (bit-identical by design).
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kNorm}) {
    const int rows = 6, heads = 3, d = 64;
    const auto [cs, sn] = random_angles(rng, rows * d / 2);
    cases.push_back(
        {.name = style == RopeStyle::kNeox ? "rope neox" : "rope norm",
         .inputs = {cs, sn},
         .out_init = random_vec(rng, rows * heads * d),
         .run = [=](Backend& be, const std::vector<float*>& in,
                    float* out) { return be.rope(out, rows, heads, d, in[0], in[1], style); },
         .tol = [](size_t, float want) { return 1e-6 * std::fabs(want) + 1e-7; }});
  }

  // rope_many: q, k and index queries of different head counts in one call (one launch on the
  // GPU, one rope() each on the CPU), the same arithmetic as rope.
  {
    const int rows = 5, d = 32;
    const auto [cs, sn] = random_angles(rng, rows * d / 2);
    cases.push_back({.name = "rope_many",
                     .inputs = {cs, sn},
                     .out_init = random_vec(rng, rows * (6 + 2 + 2) * d),
                     .run =
                         [=](Backend& be, const std::vector<float*>& in, float* out) {
                           float* const xs[3] = {out, out + rows * 6 * d, out + rows * 8 * d};
                           const int heads[3] = {6, 2, 2};
                           return be.rope_many(xs, heads, rows, d, in[0], in[1], RopeStyle::kNeox);
                         },
                     .tol = [](size_t, float want) { return 1e-6 * std::fabs(want) + 1e-7; }});
  }

  // Gated activations. GELU: the GPU's exact tanh form vs the CPU's f16 table (x rounded to f16,
  // result rounded to f16: ≤ ~1.2e-3 · (|gate| + |gelu|) · |up|). SiLU: expf vs a 1.5-ulp exp.
  for (Activation act : {Activation::kGeluTanh, Activation::kSilu}) {
    const int rows = 5, n = 300;
    auto gate = random_vec(rng, rows * n, 3.0f), up = random_vec(rng, rows * n);
    const bool gelu = act == Activation::kGeluTanh;
    cases.push_back(
        {.name = gelu ? "gated gelu" : "gated silu",
         .inputs = {gate, up},
         .out_size = rows * n,
         .run = [=](Backend& be, const std::vector<float*>& in,
                    float* out) { return be.gated_activation(act, in[0], in[1], out, rows, n); },
         .tol =
             [=](size_t i, float want) {
               return gelu ? 2e-3 * (std::fabs(gate[i]) + std::fabs(want)) * std::fabs(up[i]) + 1e-6
                           : 1e-5 * std::fabs(want) + 1e-6 * std::fabs(up[i]);
             }});
  }

  const auto exact = [](size_t, float) { return 0.0; };
  cases.push_back({.name = "add",
                   .inputs = {random_vec(rng, 1000)},
                   .out_init = random_vec(rng, 1000),
                   .run = [](Backend& be, const std::vector<float*>& in,
                             float* out) { return be.add(out, in[0], 1000); },
                   .tol = exact});
  cases.push_back({.name = "round_f16",
                   .out_init = random_vec(rng, 999, 100.0f),
                   .run = [](Backend& be, const std::vector<float*>&,
                             float* out) { return be.round_f16(out, 999); },
                   .tol = exact});
  cases.push_back({.name = "mean_heads",
                   .inputs = {random_vec(rng, 4 * 8 * 64)},
                   .out_size = 4 * 2 * 64,
                   .run = [](Backend& be, const std::vector<float*>& in,
                             float* out) { return be.mean_heads(in[0], 4, 8, 2, 64, out); },
                   .tol = [](size_t, float want) { return 1e-6 * std::fabs(want) + 1e-7; }});
  cases.push_back({.name = "gather_rows",
                   .inputs = {random_vec(rng, 10 * 33)},
                   .out_size = 5 * 33,
                   .run =
                       [](Backend& be, const std::vector<float*>& in, float* out) {
                         const std::vector<int64_t> rows = {3, 0, 9, 3, 5};
                         return be.gather_rows(in[0], rows, 33, out);
                       },
                   .tol = exact});
  // fill_random: the GPU's values are the CPU's rounded to bf16; 20M values cross the
  // backend's 16M-value fill chunks.
  for (int64_t n : {int64_t{1000}, int64_t{20'000'000}})
    cases.push_back({.name = "fill_random " + std::to_string(n),
                     .out_size = n,
                     .run = [n](Backend& be, const std::vector<float*>&,
                                float* out) { return be.fill_random(out, n, 1234, 0.5f); },
                     .tol = [](size_t, float want) { return std::ldexp(std::fabs(want), -8); }});

  for (const OpCase& c : cases) run_case(b, c);
}

// random_matrix: the same pseudo-random weights on both backends (the GPU's in bf16), seen
// through a matmul with one-hot rows (y[r][o] = W[o][r]).
TEST(CudaBackendOps, RandomMatrixMatchesTheCpuBackend) {
  CISA_REQUIRE_GPU();
  BackendPair b = make_backend_pair();
  ASSERT_TRUE(b.gpu);
  const int64_t n = 48, k = 32;
  std::vector<float> eye(static_cast<size_t>(k * k), 0.0f);
  for (int64_t i = 0; i < k; ++i) eye[static_cast<size_t>(i * k + i)] = 1.0f;
  std::vector<float> got[2];
  Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
  for (int j = 0; j < 2; ++j) {
    auto m = bes[j]->random_matrix(n, k, 99, 0.25f);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto x = upload_f32(*bes[j], eye);
    auto y = upload_f32(*bes[j], std::vector<float>(static_cast<size_t>(k * n), std::nanf("")));
    ASSERT_TRUE(bes[j]->matmul(*m, x->f32(), y->f32(), k, 0).ok());
    got[j] = download_f32(*bes[j], *y, k * n);
  }
  expect_within(got[0], got[1], [](size_t, float want) { return std::ldexp(std::fabs(want), -8); });
  double s2 = 0;
  for (float v : got[1]) s2 += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(s2 / static_cast<double>(got[1].size())), 0.25, 0.03)
      << "standard deviation";
}

// Matrices bound together (q/k/v, gate/up) and multiplied by matmul_many: one GEMM over the
// stack on the GPU, one product each on the CPU; the values of random_matrices are those of
// random_matrix with consecutive seeds.
TEST(CudaBackendOps, StackedMatricesMatchTheCpuBackend) {
  CISA_REQUIRE_GPU();
  BackendPair b = make_backend_pair();
  ASSERT_TRUE(b.gpu);
  std::mt19937 rng(11);
  const int64_t k = 160, rows = 5;
  const std::vector<int64_t> ns = {96, 32, 32};
  std::vector<HostMatrix> w;
  std::vector<WeightView> views;
  for (int64_t n : ns) w.push_back(make_f32(rng, n, k));
  for (const HostMatrix& m : w) views.push_back(m.view());
  const auto x = random_vec(rng, static_cast<size_t>(rows * k));
  std::vector<float> got[2][3];
  Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
  for (int j = 0; j < 2; ++j) {
    auto ms = bes[j]->bind_matrices(views);
    ASSERT_TRUE(ms.ok()) << ms.status().to_string();
    ASSERT_EQ(ms->size(), 3u);
    auto xb = upload_f32(*bes[j], x);
    std::vector<std::unique_ptr<BackendBuffer>> ys;
    std::vector<float*> yp;
    for (int64_t n : ns) {
      ys.push_back(upload_f32(*bes[j], std::vector<float>(static_cast<size_t>(rows * n), NAN)));
      yp.push_back(ys.back()->f32());
    }
    ASSERT_TRUE(bes[j]->matmul_many(*ms, xb->f32(), yp, rows).ok());
    for (size_t i = 0; i < ns.size(); ++i) got[j][i] = download_f32(*bes[j], *ys[i], rows * ns[i]);
  }
  for (size_t i = 0; i < ns.size(); ++i) {
    SCOPED_TRACE("matrix " + std::to_string(i));
    // Bound of the bf16 GPU product, as for matmul above: 2^-7 of Σ|w x| per output.
    std::vector<double> bound;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < ns[i]; ++o) {
        double abs_sum = 0;
        for (int64_t c = 0; c < k; ++c)
          abs_sum += std::fabs(static_cast<double>(w[i].values[static_cast<size_t>(o * k + c)]) *
                               x[static_cast<size_t>(r * k + c)]);
        bound.push_back(std::ldexp(abs_sum, -7) + 1e-6);
      }
    expect_within(got[0][i], got[1][i], [&](size_t e, float) { return bound[e]; });
  }

  // gated_matmul over a stacked gate/up (one GEMM and the activation reading its columns on the
  // GPU; matmul_many and gated_activation on the CPU). SiLU: |Δ out| ≤ 1.1 |Δg| |u| + |silu(g)|
  // |Δu| with the products' bounds Δ.
  {
    const int64_t f = 64;
    std::vector<HostMatrix> gu = {make_f32(rng, f, k), make_f32(rng, f, k)};
    const std::vector<WeightView> gv = {gu[0].view(), gu[1].view()};
    std::vector<float> out[2], upv;
    for (int j = 0; j < 2; ++j) {
      auto ms = bes[j]->bind_matrices(gv);
      ASSERT_TRUE(ms.ok()) << ms.status().to_string();
      auto xb = upload_f32(*bes[j], x);
      auto o = upload_f32(*bes[j], std::vector<float>(static_cast<size_t>(rows * f), NAN));
      auto u = upload_f32(*bes[j], std::vector<float>(static_cast<size_t>(rows * f), NAN));
      ASSERT_TRUE(bes[j]
                      ->gated_matmul((*ms)[0], (*ms)[1], Activation::kSilu, xb->f32(), o->f32(),
                                     u->f32(), rows)
                      .ok());
      out[j] = download_f32(*bes[j], *o, rows * f);
      if (j == 0) upv = download_f32(*bes[j], *u, rows * f);
    }
    std::vector<double> tol;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < f; ++o) {
        double dg = 0, du = 0, g = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double xv = x[static_cast<size_t>(r * k + c)];
          dg += std::fabs(gu[0].values[static_cast<size_t>(o * k + c)] * xv);
          du += std::fabs(gu[1].values[static_cast<size_t>(o * k + c)] * xv);
          g += gu[0].values[static_cast<size_t>(o * k + c)] * xv;
        }
        const double silu = g / (1 + std::exp(-g)), uv = upv[static_cast<size_t>(r * f + o)];
        tol.push_back(1.1 * std::ldexp(dg, -7) * (std::fabs(uv) + std::ldexp(du, -7)) +
                      std::fabs(silu) * std::ldexp(du, -7) + 1e-5);
      }
    expect_within(out[0], out[1], [&](size_t e, float) { return tol[e]; });
  }

  // random_matrices on the GPU: each matrix exactly random_matrix's with its seed.
  const std::vector<int64_t> rn = {48, 16};
  auto stacked = b.gpu->random_matrices(rn, 32, 99, 0.25f);
  ASSERT_TRUE(stacked.ok()) << stacked.status().to_string();
  std::vector<float> eye(32 * 32, 0.0f);
  for (int i = 0; i < 32; ++i) eye[static_cast<size_t>(i * 32 + i)] = 1.0f;
  auto xe = upload_f32(*b.gpu, eye);
  for (size_t i = 0; i < rn.size(); ++i) {
    auto alone = b.gpu->random_matrix(rn[i], 32, 99 + i, 0.25f);
    ASSERT_TRUE(alone.ok());
    std::vector<float> v[2];
    const BackendMatrix m[2] = {(*stacked)[i], *alone};
    for (int j = 0; j < 2; ++j) {
      auto y = upload_f32(*b.gpu, std::vector<float>(static_cast<size_t>(32 * rn[i]), NAN));
      ASSERT_TRUE(b.gpu->matmul(m[j], xe->f32(), y->f32(), 32, 0).ok());
      v[j] = download_f32(*b.gpu, *y, 32 * rn[i]);
    }
    EXPECT_EQ(v[0], v[1]) << "matrix " << i;
  }
}

// Bad input gives a clear Status, and the backend stays usable.
TEST(CudaBackendOps, ErrorsAreStatusesAndLeaveTheBackendUsable) {
  CISA_REQUIRE_GPU();
  BackendPair b = make_backend_pair();
  ASSERT_TRUE(b.gpu);
  Backend& g = *b.gpu;
  auto huge = g.allocate(int64_t{1} << 52, "a 4 PiB test buffer");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("free"), std::string::npos) << huge.status().message();
  EXPECT_FALSE(g.matmul(BackendMatrix{4, 4, 12345}, nullptr, nullptr, 1, 0).ok());
  EXPECT_EQ(g.rope(nullptr, 1, 1, 7, nullptr, nullptr, RopeStyle::kNeox).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(g.mean_heads(nullptr, 1, 6, 4, 64, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.gather_rows(nullptr, std::vector<int64_t>{-1}, 4, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(g.create_cache({.head_dim = 128, .num_pages = 8, .dtype = KvDtype::kF32}).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(g.create_cache({.head_dim = 96, .num_pages = 8, .dtype = KvDtype::kBF16}).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(
      g.create_cache({.head_dim = 128, .page_size = 32, .num_pages = 8, .dtype = KvDtype::kBF16})
          .code(),
      StatusCode::kUnimplemented);
  // Representative precision: fp8 is CPU-only (the message names int8); int8 is a cache.
  const Status fp8 = g.create_cache({.head_dim = 128,
                                     .num_pages = 8,
                                     .dtype = KvDtype::kBF16,
                                     .rep_precision = RepPrecision::kFp8});
  EXPECT_EQ(fp8.code(), StatusCode::kUnimplemented);
  EXPECT_NE(fp8.message().find("int8"), std::string::npos) << fp8.message();
  EXPECT_TRUE(g.create_cache({.head_dim = 128,
                              .num_pages = 8,
                              .dtype = KvDtype::kBF16,
                              .rep_precision = RepPrecision::kInt8})
                  .ok());
  const Status oom = g.create_cache({.num_layers = 64,
                                     .num_kv_heads = 8,
                                     .head_dim = 256,
                                     .num_pages = int64_t{1} << 30,
                                     .dtype = KvDtype::kBF16});
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted) << oom.to_string();
  EXPECT_NE(oom.message().find("free"), std::string::npos) << oom.message();
  // Still usable: an add after the failures.
  auto y = upload_f32(g, {1.0f, 2.0f});
  auto x = upload_f32(g, {0.5f, 0.25f});
  ASSERT_TRUE(g.add(y->f32(), x->f32(), 2).ok());
  EXPECT_EQ(download_f32(g, *y, 2), (std::vector<float>{1.5f, 2.25f}));
  EXPECT_EQ(g.page_lists(PlanSlot::kGlobal, nullptr).code(), StatusCode::kInvalidArgument);
}

// argmax_rows on the GPU gives the CPU backend's indices exactly: rows of a vocabulary's width
// (bf16-rounded values, so ties are common) with planted ties, NaNs and infinities, and short rows.
TEST(CudaBackendOps, ArgmaxRowsMatchTheCpuBackend) {
  CISA_REQUIRE_GPU();
  BackendPair b = make_backend_pair();
  ASSERT_TRUE(b.gpu);
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(11);
  for (const int64_t n : {int64_t{152064}, int64_t{1000}, int64_t{33}, int64_t{1}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const int64_t rows = 12;
    std::vector<float> x = bf16_exact(random_vec(rng, static_cast<size_t>(rows * n), 1.0f));
    std::uniform_int_distribution<int64_t> col(0, n - 1);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x.data() + r * n;
      const int64_t i = col(rng), j = col(rng);
      switch (r % 6) {
        case 0:
          row[i] = row[j] = 100.0f;
          break;  // a tie at the top
        case 1:
          row[i] = nan;
          row[j] = 50.0f;
          break;  // NaN beside the maximum
        case 2:
          for (int64_t c = 0; c < n; ++c) row[c] = nan;
          break;  // all NaN: 0
        case 3:
          for (int64_t c = 0; c < n; ++c) row[c] = -inf;
          break;  // all -inf: 0
        case 4:
          row[i] = inf;
          row[j] = inf;
          break;  // tied infinities
        default:
          for (int64_t c = 0; c < n; c += 2) row[c] = nan;
          break;
      }
    }
    std::vector<int32_t> got[2];
    Backend* bes[2] = {b.cpu.get(), b.gpu.get()};
    for (int k = 0; k < 2; ++k) {
      auto xb = upload_f32(*bes[k], x);
      auto ids = upload_i32(*bes[k], std::vector<int32_t>(static_cast<size_t>(rows), -7));
      ASSERT_TRUE(bes[k]->argmax_rows(xb->f32(), rows, n, ids->i32()).ok());
      got[k].resize(static_cast<size_t>(rows));
      ASSERT_TRUE(bes[k]->download(got[k].data(), ids->data(), rows * 4).ok());
    }
    EXPECT_EQ(got[0], got[1]);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got[1][static_cast<size_t>(r)], argmax({x.data() + r * n, static_cast<size_t>(n)}))
          << "row " << r;
  }
  EXPECT_EQ(b.gpu->argmax_rows(nullptr, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
}

// Large downloads go through the pinned chunks: every byte arrives, at sizes around the chunking.
TEST(CudaBackendOps, LargeDownloadsAreExact) {
  CISA_REQUIRE_GPU();
  BackendPair b = make_backend_pair();
  ASSERT_TRUE(b.gpu);
  std::mt19937 rng(3);
  for (const int64_t n :
       {int64_t{65535}, int64_t{1} << 20, (int64_t{1} << 20) + 3, int64_t{2433024}}) {
    const std::vector<float> x = random_vec(rng, static_cast<size_t>(n), 1.0f);
    auto xb = upload_f32(*b.gpu, x);
    EXPECT_EQ(download_f32(*b.gpu, *xb, n), x) << n << " values";
  }
}

Result<std::unique_ptr<Model>> cuda_synthetic(const std::string& name, int64_t context,
                                              int sequences) {
  ModelOptions o{.context = context, .max_sequences = sequences, .kv_dtype = KvDtype::kBF16};
  o.backend = cuda::make_model_backend;
  return Model::load_synthetic(name, o);
}

// On the CUDA backend the greedy tokens of ForwardOutputs::argmax are the argmax of the logits the
// same step returns, over prefill and 40 decode steps (pages fill; a sequence finishes early).
// Qwen2.5-7B's shape: tiny-llama's head_dim 16 is not one the device cache takes.
TEST(CudaModelGreedy, ArgmaxOutputsAreTheArgmaxOfTheLogits) {
  CISA_REQUIRE_GPU();
  auto m = cuda_synthetic("qwen2.5-7b", 128, 3);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const int V = (*m)->hparams().n_vocab;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<int32_t> prompt[3];
  std::vector<SeqId> seqs;
  std::vector<SequenceInput> in;
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 9 + 6 * s; ++i) prompt[s].push_back(tok(rng));
    seqs.push_back(*(*m)->add_sequence());
    in.push_back({.seq = seqs.back(), .tokens = prompt[s]});
  }
  std::vector<int32_t> ids;
  std::vector<float> logits;
  for (int step = 0; step < 41; ++step) {
    ASSERT_TRUE((*m)->forward(in, ForwardOutputs{.logits = &logits, .argmax = &ids}).ok())
        << "step " << step;
    ASSERT_EQ(ids.size(), in.size());
    ASSERT_EQ(logits.size(), in.size() * static_cast<size_t>(V));
    for (size_t r = 0; r < ids.size(); ++r)
      EXPECT_EQ(ids[r], argmax({logits.data() + r * V, static_cast<size_t>(V)}))
          << "step " << step << ", row " << r;
    std::vector<int32_t> greedy_only;
    if (step == 20) {  // the middle sequence finishes
      ASSERT_TRUE((*m)->release_sequence(in[1].seq).ok());
      in.erase(in.begin() + 1);
      ids.erase(ids.begin() + 1);
    }
    for (size_t r = 0; r < in.size(); ++r) prompt[r] = {ids[r]};
    for (size_t r = 0; r < in.size(); ++r) in[r].tokens = prompt[r];
  }
}

// Decode step times (not a test: run with --gtest_also_run_disabled_tests): the logits path (all
// logits downloaded, host argmax) against the greedy path, Qwen2.5-7B's shape, 128 tokens of
// context, B = 1, 16, 64.
TEST(CudaModelGreedy, DISABLED_DecodeStepTimes) {
  CISA_REQUIRE_GPU();
  const int max_b = 64;
  auto m = cuda_synthetic("qwen2.5-7b", 256, max_b);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Model& model = **m;
  const int V = model.hparams().n_vocab;
  for (const int B : {1, 16, 64}) {
    std::vector<SeqId> seqs;
    std::vector<int32_t> prompt(96, 17), next(static_cast<size_t>(B), 3), ids;
    std::vector<SequenceInput> in;
    for (int s = 0; s < B; ++s) {
      seqs.push_back(*model.add_sequence());
      in.push_back({.seq = seqs.back(), .tokens = prompt});
    }
    ASSERT_TRUE(model.forward(in, ForwardOutputs{.argmax = &ids}).ok());
    std::vector<float> logits;
    for (int path = 0; path < 2; ++path) {
      std::vector<double> t;
      for (int step = 0; step < 12; ++step) {
        for (int s = 0; s < B; ++s)
          in[static_cast<size_t>(s)].tokens = {&next[static_cast<size_t>(s)], 1};
        const auto t0 = std::chrono::steady_clock::now();
        if (path == 0) {
          ASSERT_TRUE(model.forward(in, &logits).ok());
          for (int s = 0; s < B; ++s)
            ids.at(static_cast<size_t>(s)) =
                argmax({logits.data() + static_cast<size_t>(s) * V, static_cast<size_t>(V)});
        } else {
          ASSERT_TRUE(model.forward(in, ForwardOutputs{.argmax = &ids}).ok());
        }
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        next = ids;
      }
      std::sort(t.begin() + 2, t.end());
      std::printf("B=%d %s: median step %.2f ms\n", B,
                  path == 0 ? "logits + host argmax" : "argmax_rows",
                  1e3 * t[2 + (t.size() - 2) / 2]);
    }
    for (SeqId s : seqs) ASSERT_TRUE(model.release_sequence(s).ok());
  }
}

}  // namespace
}  // namespace cisa::test

#else
TEST(CudaBackendOps, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without the CUDA model backend)";
}
#endif
