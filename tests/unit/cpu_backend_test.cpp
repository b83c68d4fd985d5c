// The CPU backend (backend.h) op by op on random inputs: each operation against the reference code
// it wraps (model_ops.h, quant.h; bit for bit) and against fp64 formulas written out here; the
// paged cache, dense and CISA plans and attention against an fp64 brute-force attention; and the
// errors of calls out of order or with bad handles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/model.h"
#include "cisa/model/quant.h"
#include "cisa/model/sampling.h"
#include "model/model_ops.h"

namespace cisa {
namespace {

std::vector<float> randn(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class CpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = make_cpu_backend({.threads = 2});
    ASSERT_TRUE(b.ok()) << b.status().message();
    be = std::move(*b);
  }
  // A backend buffer holding `v`.
  std::unique_ptr<BackendBuffer> buf(const std::vector<float>& v) {
    auto b = be->allocate(static_cast<int64_t>(v.size() * sizeof(float)), "test");
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(be->upload((*b)->data(), v.data(), (*b)->bytes()).ok());
    return std::move(*b);
  }
  std::vector<float> get(BackendBuffer& b, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(be->download(v.data(), b.data(), static_cast<int64_t>(n * sizeof(float))).ok());
    return v;
  }
  std::unique_ptr<Backend> be;
};

TEST_F(CpuBackendTest, DescribesItself) {
  EXPECT_EQ(be->kind(), BackendKind::kCpu);
  EXPECT_NE(be->description().find("cpu ("), std::string::npos) << be->description();
  ASSERT_NE(be->cpu_pool(), nullptr);
  EXPECT_EQ(be->cpu_pool()->num_threads(), 2);
  EXPECT_EQ(be->cpu_cache(), nullptr);  // no cache before create_cache
  EXPECT_GT(be->free_memory(), 0);
  EXPECT_FALSE(make_cpu_backend({.threads = -1}).ok());
  EXPECT_STREQ(backend_kind_name(BackendKind::kCpu), "cpu");
  EXPECT_STREQ(backend_kind_name(BackendKind::kCuda), "cuda");
  EXPECT_EQ(*parse_backend_kind("cuda"), BackendKind::kCuda);
  EXPECT_EQ(*parse_backend_kind("cpu"), BackendKind::kCpu);
  EXPECT_EQ(parse_backend_kind("tpu").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CpuBackendTest, MatmulOfF32AndQ8_0MatchesReferenceAndFp64) {
  std::mt19937 rng(3);
  const int64_t rows = 5, n_out = 48, n_in = 64;
  const std::vector<float> w = randn(rng, n_out * n_in), x = randn(rng, rows * n_in);
  // Q8_0 blocks of the same matrix: an f16 scale and 32 int8 codes per block.
  std::vector<uint8_t> q8(static_cast<size_t>(n_out * (n_in / 32) * 34));
  for (int64_t b = 0; b < n_out * n_in / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(w[b * 32 + i]));
    const uint16_t d16 = f32_to_f16(amax / 127.0f);
    const float d = f16_to_f32(d16);
    std::memcpy(&q8[b * 34], &d16, 2);
    for (int i = 0; i < 32; ++i)
      q8[b * 34 + 2 + i] =
          static_cast<uint8_t>(static_cast<int8_t>(std::lround(w[b * 32 + i] / d)));
  }
  const WeightView vf{.type = GgmlType::F32,
                      .n_rows = n_out,
                      .n_cols = n_in,
                      .row_bytes = n_in * 4,
                      .data = reinterpret_cast<const uint8_t*>(w.data())};
  const WeightView vq{.type = GgmlType::Q8_0,
                      .n_rows = n_out,
                      .n_cols = n_in,
                      .row_bytes = n_in / 32 * 34,
                      .data = q8.data()};
  ThreadPool pool(1);
  for (const WeightView& v : {vf, vq}) {
    auto m = be->bind_matrix(v);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->n_rows, n_out);
    EXPECT_EQ(m->n_cols, n_in);
    auto xb = buf(x);
    auto yb = *be->allocate(rows * n_out * 4, "y");
    ASSERT_TRUE(be->matmul(*m, xb->f32(), yb->f32(), rows).ok());
    std::vector<float> ref(static_cast<size_t>(rows * n_out));
    ASSERT_TRUE(matmul(v, x.data(), ref.data(), rows, pool).ok());
    const std::vector<float> y = get(*yb, ref.size());
    // fp64 of the stored weights; Q8_0 also rounds the activations to 8 bits (~0.05 here).
    std::vector<float> wd(static_cast<size_t>(n_out * n_in));
    for (int64_t o = 0; o < n_out; ++o)
      ASSERT_TRUE(dequantize_row(v.type, v.row(o), wd.data() + o * n_in, n_in).ok());
    const double tol = v.type == GgmlType::F32 ? 1e-5 : 0.2;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < n_out; ++o) {
        double want = 0;
        for (int64_t c = 0; c < n_in; ++c) want += double(wd[o * n_in + c]) * x[r * n_in + c];
        EXPECT_EQ(y[r * n_out + o], ref[r * n_out + o]);
        EXPECT_NEAR(y[r * n_out + o], want, tol) << ggml_type_name(v.type);
      }
    // Strided output: y[r·ldy + o].
    auto wide = *be->allocate(rows * 2 * n_out * 4, "wide");
    ASSERT_TRUE(be->matmul(*m, xb->f32(), wide->f32() + n_out, rows, 2 * n_out).ok());
    const std::vector<float> yw = get(*wide, static_cast<size_t>(rows * 2 * n_out));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < n_out; ++o)
        EXPECT_EQ(yw[r * 2 * n_out + n_out + o], y[r * n_out + o]);
  }
  EXPECT_GT(be->weight_bytes(), 0);
  auto xb = buf(x);
  EXPECT_FALSE(be->matmul(BackendMatrix{n_out, n_in, 99}, xb->f32(), xb->f32(), 1).ok());
}

// bf16_matmul (the CUDA backend's rounding): the product is the fp64 product of the weights and
// inputs each rounded to bf16 (round to nearest even, written out here), within f32 accumulation;
// the embedding rows are the rounded weights; the plain backend does not round.
TEST(CpuBackendBf16, MatmulAndEmbedRoundWeightsAndInputsToBf16) {
  auto made = make_cpu_backend({.threads = 2, .bf16_matmul = true});
  ASSERT_TRUE(made.ok()) << made.status().message();
  Backend& be = **made;
  std::mt19937 rng(5);
  const int64_t rows = 4, n_out = 40, n_in = 96;
  const std::vector<float> w = randn(rng, n_out * n_in), x = randn(rng, rows * n_in);
  auto bf16 = [](float v) {  // round to nearest, ties to even, on the bits
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
  };
  const WeightView v{.type = GgmlType::F32,
                     .n_rows = n_out,
                     .n_cols = n_in,
                     .row_bytes = n_in * 4,
                     .data = reinterpret_cast<const uint8_t*>(w.data())};
  auto m = be.bind_matrix(v);
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto xb = *be.allocate(rows * n_in * 4, "x");
  auto yb = *be.allocate(rows * n_out * 4, "y");
  ASSERT_TRUE(be.upload(xb->data(), x.data(), xb->bytes()).ok());
  ASSERT_TRUE(be.matmul(*m, xb->f32(), yb->f32(), rows).ok());
  std::vector<float> y(static_cast<size_t>(rows * n_out));
  ASSERT_TRUE(be.download(y.data(), yb->data(), yb->bytes()).ok());
  int differs_from_unrounded = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < n_out; ++o) {
      double want = 0, plain = 0, mag = 0;
      for (int64_t c = 0; c < n_in; ++c) {
        want += double(bf16(w[o * n_in + c])) * bf16(x[r * n_in + c]);
        plain += double(w[o * n_in + c]) * x[r * n_in + c];
        mag += std::abs(double(w[o * n_in + c]) * x[r * n_in + c]);
      }
      EXPECT_NEAR(y[r * n_out + o], want, mag * n_in * 0x1p-24);
      differs_from_unrounded += std::abs(want - plain) > 2 * mag * n_in * 0x1p-24;
    }
  EXPECT_GT(differs_from_unrounded, rows * n_out / 2);  // the rounding is visible
  // The input buffer is left as it was.
  std::vector<float> back(x.size());
  ASSERT_TRUE(be.download(back.data(), xb->data(), xb->bytes()).ok());
  EXPECT_EQ(back, x);
  // Embedding rows are the rounded table's.
  const int32_t tokens[2] = {3, 17};
  auto eb = *be.allocate(2 * n_in * 4, "e");
  ASSERT_TRUE(be.embed(*m, tokens, 2, 1.0f, eb->f32()).ok());
  std::vector<float> e(static_cast<size_t>(2 * n_in));
  ASSERT_TRUE(be.download(e.data(), eb->data(), eb->bytes()).ok());
  for (int t = 0; t < 2; ++t)
    for (int64_t c = 0; c < n_in; ++c) EXPECT_EQ(e[t * n_in + c], bf16(w[tokens[t] * n_in + c]));
}

TEST_F(CpuBackendTest, RandomMatrixIsSeededAndNormalWithTheGivenScale) {
  auto a = be->random_matrix(64, 256, 7, 0.02f), b = be->random_matrix(64, 256, 7, 0.02f),
       c = be->random_matrix(64, 256, 8, 0.02f);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  // Read the matrices back through matmul with unit vectors: column j of W for x = e_j.
  std::vector<float> eye(256 * 256, 0.0f);
  for (int i = 0; i < 256; ++i) eye[i * 256 + i] = 1.0f;
  auto x = buf(eye);
  auto ya = *be->allocate(256 * 64 * 4, "a"), yb = *be->allocate(256 * 64 * 4, "b"),
       yc = *be->allocate(256 * 64 * 4, "c");
  ASSERT_TRUE(be->matmul(*a, x->f32(), ya->f32(), 256).ok());
  ASSERT_TRUE(be->matmul(*b, x->f32(), yb->f32(), 256).ok());
  ASSERT_TRUE(be->matmul(*c, x->f32(), yc->f32(), 256).ok());
  const auto va = get(*ya, 256 * 64), vb = get(*yb, 256 * 64), vc = get(*yc, 256 * 64);
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  double s = 0, ss = 0;
  for (float v : va) s += v, ss += double(v) * v;
  const double n = static_cast<double>(va.size()), mean = s / n,
               sd = std::sqrt(ss / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, 0.02, 0.001);
  // fill_random is the same generator: element (r, c) of the matrix is value r·cols + c.
  auto f = *be->allocate(64 * 256 * 4, "fill");
  ASSERT_TRUE(be->fill_random(f->f32(), 64 * 256, 7, 0.02f).ok());
  const auto vf = get(*f, 64 * 256);
  for (int r = 0; r < 64; ++r)
    for (int col = 0; col < 256; ++col) ASSERT_EQ(va[col * 64 + r], vf[r * 256 + col]);
  EXPECT_FALSE(be->random_matrix(0, 4, 1, 1.0f).ok());
}

// bind_owned_matrix: the backend keeps the values it is handed (the caller's vector is gone once
// the call returns); read_matrix_rows gives back what matmul multiplies by; bad sizes are errors.
TEST_F(CpuBackendTest, OwnedMatricesAndReadRows) {
  std::mt19937 rng(3);
  const std::vector<float> w = randn(rng, 24 * 40);
  auto m = be->bind_owned_matrix(std::vector<float>(w), 24, 40);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<float> back(24 * 40);
  ASSERT_TRUE(be->read_matrix_rows(*m, 0, 24, back.data()).ok());
  EXPECT_EQ(back, w);
  std::vector<float> rows(3 * 40);
  ASSERT_TRUE(be->read_matrix_rows(*m, 21, 3, rows.data()).ok());
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), w.begin() + 21 * 40));
  const std::vector<float> xv = randn(rng, 2 * 40);
  auto x = buf(xv);
  auto y = *be->allocate(2 * 24 * 4, "y");
  ASSERT_TRUE(be->matmul(*m, x->f32(), y->f32(), 2).ok());
  const auto yv = get(*y, 2 * 24);
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 24; ++o) {
      double want = 0;
      for (int c = 0; c < 40; ++c) want += double(w[o * 40 + c]) * xv[r * 40 + c];
      EXPECT_NEAR(yv[r * 24 + o], want, 1e-4) << r << " " << o;
    }
  EXPECT_EQ(be->bind_owned_matrix(std::vector<float>(10), 3, 4).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(be->read_matrix_rows(*m, 22, 3, rows.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(be->read_matrix_rows(*m, -1, 1, rows.data()).code(), StatusCode::kOutOfRange);
}

TEST_F(CpuBackendTest, EmbedNormRopeActivationAddRoundMeanGatherMatchReferences) {
  std::mt19937 rng(5);
  const int64_t rows = 11, E = 32, V = 9;
  const std::vector<float> table = randn(rng, V * E);
  auto t = be->bind_matrix({.type = GgmlType::F32,
                            .n_rows = V,
                            .n_cols = E,
                            .row_bytes = E * 4,
                            .data = reinterpret_cast<const uint8_t*>(table.data())});
  ASSERT_TRUE(t.ok());
  std::vector<int32_t> tok(rows);
  for (int64_t r = 0; r < rows; ++r) tok[r] = static_cast<int32_t>((r * 5) % V);
  auto tb = *be->allocate(rows * 4, "tokens");
  ASSERT_TRUE(be->upload(tb->data(), tok.data(), rows * 4).ok());
  auto xb = *be->allocate(rows * E * 4, "x");
  ASSERT_TRUE(be->embed(*t, tb->i32(), rows, 2.5f, xb->f32()).ok());
  std::vector<float> x = get(*xb, rows * E);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < E; ++i) EXPECT_EQ(x[r * E + i], table[tok[r] * E + i] * 2.5f);
  tok[3] = static_cast<int32_t>(V);
  ASSERT_TRUE(be->upload(tb->data(), tok.data(), rows * 4).ok());
  EXPECT_EQ(be->embed(*t, tb->i32(), rows, 1.0f, xb->f32()).code(), StatusCode::kOutOfRange);

  // rms_norm: fp64 and ops::rms_norm, with and without a gain, in place.
  const std::vector<float> g = randn(rng, E);
  auto gb = be->bind_vector(g);
  ASSERT_TRUE(gb.ok());
  x = randn(rng, rows * E, 3.0f);
  auto in = buf(x);
  auto out = *be->allocate(rows * E * 4, "y");
  ASSERT_TRUE(be->rms_norm(in->f32(), *gb, out->f32(), rows, E, 1e-6f).ok());
  std::vector<float> y = get(*out, rows * E);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < E; ++i) ss += double(x[r * E + i]) * x[r * E + i];
    const double inv = 1.0 / std::sqrt(ss / E + 1e-6);
    std::vector<float> ref(E);
    ops::rms_norm(&x[r * E], g.data(), ref.data(), E, 1e-6f);
    for (int64_t i = 0; i < E; ++i) {
      EXPECT_EQ(y[r * E + i], ref[i]);
      EXPECT_NEAR(y[r * E + i], x[r * E + i] * inv * g[i], 1e-5);
    }
  }
  ASSERT_TRUE(be->rms_norm(in->f32(), nullptr, in->f32(), rows, E, 1e-6f).ok());
  y = get(*in, rows * E);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> ref(E);
    ops::rms_norm(&x[r * E], nullptr, ref.data(), E, 1e-6f);
    for (int64_t i = 0; i < E; ++i) EXPECT_EQ(y[r * E + i], ref[i]);
  }

  // rope over [rows][heads][d] with per-row tables: each head rotated by its row's angles.
  const int heads = 3, d = 16;
  std::vector<int64_t> pos(rows);
  for (int64_t r = 0; r < rows; ++r) pos[r] = 100 + 37 * r;
  std::vector<float> cs(rows * d / 2), sn(rows * d / 2);
  ops::rope_table(pos.data(), rows, d, 10000.0, cs.data(), sn.data());
  auto csb = buf(cs), snb = buf(sn);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kNorm}) {
    x = randn(rng, rows * heads * d);
    auto xr = buf(x);
    ASSERT_TRUE(be->rope(xr->f32(), rows, heads, d, csb->f32(), snb->f32(), style).ok());
    y = get(*xr, x.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < heads; ++h) {
        const float* src = &x[(r * heads + h) * d];
        const float* got = &y[(r * heads + h) * d];
        for (int i = 0; i < d / 2; ++i) {
          const int a = style == RopeStyle::kNeox ? i : 2 * i;
          const int b = style == RopeStyle::kNeox ? i + d / 2 : 2 * i + 1;
          const double th = pos[r] * std::pow(10000.0, -2.0 * i / d);
          EXPECT_NEAR(got[a], src[a] * std::cos(th) - src[b] * std::sin(th), 2e-3);
          EXPECT_NEAR(got[b], src[a] * std::sin(th) + src[b] * std::cos(th), 2e-3);
        }
        std::vector<float> ref(src, src + d);
        ops::rope_apply(ref.data(), &cs[r * d / 2], &sn[r * d / 2], d, style);
        for (int i = 0; i < d; ++i) EXPECT_EQ(got[i], ref[i]);
      }
  }
  EXPECT_FALSE(be->rope(xb->f32(), rows, heads, 15, csb->f32(), snb->f32(), RopeStyle::kNorm).ok());

  // gated_activation: SiLU against fp64, both against ops (in place over gate).
  const int64_t F = 40;
  const std::vector<float> ga = randn(rng, rows * F, 2.0f), up = randn(rng, rows * F);
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    auto gbuf = buf(ga), ubuf = buf(up);
    ASSERT_TRUE(be->gated_activation(act, gbuf->f32(), ubuf->f32(), gbuf->f32(), rows, F).ok());
    y = get(*gbuf, ga.size());
    std::vector<float> ref(ga.size());
    ops::gated_activation(act, ga.data(), up.data(), ref.data(), rows * F);
    EXPECT_EQ(y, ref);
    for (size_t i = 0; i < ga.size(); ++i) {
      const double gx = ga[i];
      const double a =
          act == Activation::kSilu
              ? gx / (1 + std::exp(-gx))
              : 0.5 * gx * (1 + std::tanh(0.7978845608 * (gx + 0.044715 * gx * gx * gx)));
      EXPECT_NEAR(y[i], a * up[i], 5e-3 * std::abs(a * up[i]) + 1e-5);
    }
  }

  // add and round_f16 over more values than one chunk, so that both run threaded.
  const int64_t n = 70000;
  const std::vector<float> p = randn(rng, n), q = randn(rng, n);
  auto pb = buf(p), qb = buf(q);
  ASSERT_TRUE(be->add(pb->f32(), qb->f32(), n).ok());
  y = get(*pb, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], p[i] + q[i]);
  ASSERT_TRUE(be->round_f16(qb->f32(), n).ok());
  y = get(*qb, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], f16_to_f32(f32_to_f16(q[i])));

  // mean_heads: the mean of each KV group's query heads.
  const int hq = 6, hkv = 2, hd = 8;
  x = randn(rng, rows * hq * hd);
  auto qh = buf(x);
  auto mh = *be->allocate(rows * hkv * hd * 4, "mean");
  ASSERT_TRUE(be->mean_heads(qh->f32(), rows, hq, hkv, hd, mh->f32()).ok());
  y = get(*mh, rows * hkv * hd);
  for (int64_t r = 0; r < rows; ++r)
    for (int gi = 0; gi < hkv; ++gi)
      for (int i = 0; i < hd; ++i) {
        double s = 0;
        for (int h = 0; h < 3; ++h) s += x[(r * hq + gi * 3 + h) * hd + i];
        EXPECT_NEAR(y[(r * hkv + gi) * hd + i], s / 3, 1e-6);
      }
  EXPECT_FALSE(be->mean_heads(qh->f32(), rows, 5, 2, hd, mh->f32()).ok());

  // gather_rows.
  const std::vector<int64_t> pick = {7, 0, 7, 10};
  auto gout = *be->allocate(4 * hq * hd * 4, "gather");
  ASSERT_TRUE(be->gather_rows(qh->f32(), pick, hq * hd, gout->f32()).ok());
  y = get(*gout, 4 * hq * hd);
  for (size_t i = 0; i < pick.size(); ++i)
    for (int j = 0; j < hq * hd; ++j) EXPECT_EQ(y[i * hq * hd + j], x[pick[i] * hq * hd + j]);
}

// fp64 causal attention of every query head over positions 0 … t of one sequence, optionally
// within a sliding window; k, v: [n][hkv][d] as appended.
std::vector<double> brute_attention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t first, int64_t rows,
                                    int hq, int hkv, int d, int64_t window) {
  std::vector<double> out(static_cast<size_t>(rows * hq * d), 0.0);
  const double scale = 1.0 / std::sqrt(double(d));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = first + r;
    for (int h = 0; h < hq; ++h) {
      const int g = h / (hq / hkv);
      std::vector<double> s;
      const int64_t s0 = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
      double mx = -1e300;
      for (int64_t j = s0; j <= t; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += double(q[(r * hq + h) * d + i]) * k[(j * hkv + g) * d + i];
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      double den = 0;
      for (double& e : s) den += (e = std::exp(e - mx));
      for (int64_t j = s0; j <= t; ++j)
        for (int i = 0; i < d; ++i)
          out[(r * hq + h) * d + i] += s[j - s0] / den * v[(j * hkv + g) * d + i];
    }
  }
  return out;
}

TEST_F(CpuBackendTest, CachePlansAndAttentionMatchBruteForce) {
  std::mt19937 rng(9);
  const int hq = 4, hkv = 2, d = 16, layers = 2;
  KvCacheConfig kc{.num_layers = layers, .num_kv_heads = hkv, .head_dim = d, .num_pages = 64};
  // Out-of-order calls before the cache exists.
  EXPECT_FALSE(be->add_sequence().ok());
  ASSERT_TRUE(be->create_cache(kc).ok());
  ASSERT_NE(be->cpu_cache(), nullptr);
  EXPECT_EQ(be->cache_config().num_kv_heads, hkv);
  SeqId s = *be->add_sequence();
  const int64_t n = 300;
  ASSERT_TRUE(be->reserve(s, n).ok());
  EXPECT_EQ(*be->pages().reserved(s), n);
  const std::vector<BatchEntry> batch = {{.seq = s, .first = 0, .count = static_cast<int32_t>(n)}};
  std::vector<float> k = randn(rng, n * hkv * d), v = randn(rng, n * hkv * d),
                     q = randn(rng, n * hq * d);
  auto kb = buf(k), vb = buf(v), qb = buf(q), iq = *be->allocate(n * hkv * d * 4, "index q");
  auto ob = *be->allocate(n * hq * d * 4, "out");
  ASSERT_TRUE(be->mean_heads(qb->f32(), n, hq, hkv, d, iq->f32()).ok());

  // attend() before a plan, select() on a dense plan.
  EXPECT_EQ(be->attend(PlanSlot::kGlobal, 0, qb->f32(), hq, {}, ob->f32()).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(be->plan(PlanSlot::kGlobal, batch, {.kind = PlanKind::kDense}).ok());
  ASSERT_TRUE(
      be->plan(PlanSlot::kSliding, batch, {.kind = PlanKind::kDense, .sliding_window = 40}).ok());
  const SelectionParams full{.budget = 64, .window = 2, .qshare = 4};   // covers every chunk
  const SelectionParams sparse{.budget = 3, .window = 2, .qshare = 4};  // a few chunks
  ASSERT_TRUE(be->plan(PlanSlot::kCisa, batch, {.kind = PlanKind::kCisa, .selection = full}).ok());
  EXPECT_FALSE(be->select(PlanSlot::kGlobal, 0, iq->f32()).ok());
  ASSERT_TRUE(be->append_kv(0, batch, kb->f32(), vb->f32()).ok());
  EXPECT_EQ(*be->pages().tokens(0, s), n);

  for (int64_t window : {int64_t{0}, int64_t{40}}) {
    const PlanSlot slot = window ? PlanSlot::kSliding : PlanSlot::kGlobal;
    ASSERT_TRUE(be->attend(slot, 0, qb->f32(), hq, {.sliding_window = window}, ob->f32()).ok());
    EXPECT_EQ(be->plan_groups(slot).size(), 1u);
    const auto want = brute_attention(q, k, v, 0, n, hq, hkv, d, window);
    const auto got = get(*ob, want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << window;
    // llama.cpp numerics: f16 K/V and query, so only close.
    ASSERT_TRUE(be->attend(slot, 0, qb->f32(), hq,
                           {.sliding_window = window, .numerics = AttentionNumerics::kLlamaCpp},
                           ob->f32())
                    .ok());
    const auto lc = get(*ob, want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(lc[i], want[i], 2e-2) << window;
  }
  const std::vector<float> dense_out = [&] {
    EXPECT_TRUE(be->attend(PlanSlot::kGlobal, 0, qb->f32(), hq, {}, ob->f32()).ok());
    return get(*ob, q.size());
  }();

  // CISA: attend needs this layer's select(); a budget covering the context equals dense.
  EXPECT_EQ(be->attend(PlanSlot::kCisa, 0, qb->f32(), hq, {}, ob->f32()).code(),
            StatusCode::kFailedPrecondition);
  PageLists seen;  // page_lists: nothing before select(), and a null output is refused
  EXPECT_EQ(be->page_lists(PlanSlot::kCisa, &seen).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(be->page_lists(PlanSlot::kCisa, nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(be->select(PlanSlot::kCisa, 0, iq->f32()).ok());
  ASSERT_TRUE(be->attend(PlanSlot::kCisa, 0, qb->f32(), hq, {}, ob->f32()).ok());
  const auto cisa_full = get(*ob, q.size());
  for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(cisa_full[i], dense_out[i], 1e-5);

  // A small budget reads fewer pages and differs from dense; a later layer needs its own select.
  ASSERT_TRUE(
      be->plan(PlanSlot::kCisa, batch, {.kind = PlanKind::kCisa, .selection = sparse}).ok());
  ASSERT_TRUE(be->select(PlanSlot::kCisa, 0, iq->f32()).ok());
  ASSERT_TRUE(be->attend(PlanSlot::kCisa, 0, qb->f32(), hq, {}, ob->f32()).ok());
  const auto cisa_sparse = get(*ob, q.size());
  double diff = 0;
  for (size_t i = 0; i < q.size(); ++i)
    diff = std::max(diff, double(std::abs(cisa_sparse[i] - dense_out[i])));
  EXPECT_GT(diff, 1e-3);
  int64_t read = 0, dense = 0;
  for (const QueryGroup& g : be->plan_groups(PlanSlot::kCisa)) {
    read += pages_read(g, 16, sparse);
    dense += pages_read_dense(g, 16);
  }
  EXPECT_LT(read, dense);
  EXPECT_GT(be->plan_groups(PlanSlot::kCisa).size(), 1u);  // dense prefix, then QShare groups
  // page_lists: the lists attention just read, as select_pages makes them.
  PageLists want;
  ASSERT_TRUE(select_pages(*be->cpu_cache(), 0, batch, iq->f32(), sparse, nullptr, &want).ok());
  ASSERT_TRUE(be->page_lists(PlanSlot::kCisa, &seen).ok());
  EXPECT_EQ(seen.offsets, want.offsets);
  EXPECT_EQ(seen.pages, want.pages);
  EXPECT_EQ(seen.chunks, want.chunks);
  EXPECT_EQ(seen.num_selected, want.num_selected);
  ASSERT_TRUE(be->append_kv(1, batch, kb->f32(), vb->f32()).ok());
  EXPECT_FALSE(be->attend(PlanSlot::kCisa, 1, qb->f32(), hq, {}, ob->f32()).ok());
  // Host lists set from outside replace the selection.
  ASSERT_TRUE(be->set_page_lists(PlanSlot::kCisa, PageLists{}).ok());
  EXPECT_FALSE(be->attend(PlanSlot::kCisa, 1, qb->f32(), hq, {}, ob->f32()).ok());  // empty lists
  ASSERT_TRUE(be->page_lists(PlanSlot::kCisa, &seen).ok());
  EXPECT_TRUE(seen.pages.empty() && seen.groups.empty());

  ASSERT_TRUE(be->release_sequence(s).ok());
  EXPECT_FALSE(be->pages().has_sequence(s));
}

TEST_F(CpuBackendTest, BadSizesAreErrors) {
  EXPECT_FALSE(be->allocate(-1, "x").ok());
  auto b = *be->allocate(16, "x");
  EXPECT_FALSE(be->upload(b->data(), nullptr, 16).ok());
  EXPECT_FALSE(be->download(nullptr, b->data(), 16).ok());
  EXPECT_FALSE(be->upload(b->data(), b->data(), -4).ok());
  EXPECT_FALSE(be->bind_matrix(WeightView{}).ok());
  EXPECT_FALSE(be->create_cache({.head_dim = 12}).ok());
}

// The fused operations' defaults (what the CPU backend runs) are their compositions, bit for
// bit, and refuse mismatched shapes.
TEST_F(CpuBackendTest, FusedOperationsEqualTheirCompositions) {
  std::mt19937 rng(5);
  const int64_t rows = 3, k = 64, f = 48;
  auto gs = be->random_matrices(std::vector<int64_t>{f, f, 16}, k, 11, 0.1f);
  ASSERT_TRUE(gs.ok()) << gs.status().message();
  auto g1 = be->random_matrix(f, k, 11, 0.1f), u1 = be->random_matrix(f, k, 12, 0.1f);
  ASSERT_TRUE(g1.ok() && u1.ok());
  auto x = buf(randn(rng, rows * k));
  auto y0 = *be->allocate(rows * f * 4, "y0"), y1 = *be->allocate(rows * f * 4, "y1"),
       y2 = *be->allocate(rows * 16 * 4, "y2"), ref = *be->allocate(rows * f * 4, "ref"),
       ref_u = *be->allocate(rows * f * 4, "ref_u");
  // matmul_many of a stack = one matmul each; random_matrices' values = random_matrix's.
  float* const ys[3] = {y0->f32(), y1->f32(), y2->f32()};
  ASSERT_TRUE(be->matmul_many(*gs, x->f32(), ys, rows).ok());
  ASSERT_TRUE(be->matmul(*g1, x->f32(), ref->f32(), rows).ok());
  EXPECT_EQ(get(*y0, rows * f), get(*ref, rows * f));
  // gated_matmul = silu(gate x) ⊙ (up x).
  ASSERT_TRUE(
      be->gated_matmul((*gs)[0], (*gs)[1], Activation::kSilu, x->f32(), y0->f32(), y1->f32(), rows)
          .ok());
  ASSERT_TRUE(be->matmul(*u1, x->f32(), ref_u->f32(), rows).ok());
  ASSERT_TRUE(
      be->gated_activation(Activation::kSilu, ref->f32(), ref_u->f32(), ref->f32(), rows, f).ok());
  EXPECT_EQ(get(*y0, rows * f), get(*ref, rows * f));
  // add_rms_norm = add, then rms_norm.
  const auto h = randn(rng, rows * k), o = randn(rng, rows * k), w = randn(rng, k);
  auto h1 = buf(h), h2 = buf(h), ob = buf(o), wb = buf(w);
  auto n1 = *be->allocate(rows * k * 4, "n1"), n2 = *be->allocate(rows * k * 4, "n2");
  ASSERT_TRUE(be->add_rms_norm(h1->f32(), ob->f32(), wb->f32(), n1->f32(), rows, k, 1e-6f).ok());
  ASSERT_TRUE(be->add(h2->f32(), ob->f32(), rows * k).ok());
  ASSERT_TRUE(be->rms_norm(h2->f32(), wb->f32(), n2->f32(), rows, k, 1e-6f).ok());
  EXPECT_EQ(get(*h1, rows * k), get(*h2, rows * k));
  EXPECT_EQ(get(*n1, rows * k), get(*n2, rows * k));
  // Mismatched shapes are errors, not reads past a buffer.
  EXPECT_EQ(
      be->gated_matmul((*gs)[0], (*gs)[2], Activation::kSilu, x->f32(), y0->f32(), y1->f32(), rows)
          .code(),
      StatusCode::kInvalidArgument);
  auto other = be->random_matrix(16, k + 1, 3, 0.1f);
  ASSERT_TRUE(other.ok());
  const BackendMatrix mixed[2] = {(*gs)[2], *other};
  float* const two[2] = {y2->f32(), y1->f32()};
  EXPECT_EQ(be->matmul_many(mixed, x->f32(), two, rows).code(), StatusCode::kInvalidArgument);
  float* const one[1] = {y0->f32()};
  EXPECT_EQ(be->matmul_many(*gs, x->f32(), one, rows).code(), StatusCode::kInvalidArgument);
  const int heads[1] = {1};
  float* const rx[2] = {h1->f32(), h2->f32()};
  EXPECT_EQ(be->rope_many(rx, heads, rows, 4, nullptr, nullptr, RopeStyle::kNeox).code(),
            StatusCode::kInvalidArgument);
}

// argmax_rows follows cisa::argmax (ties to the smaller index, NaN never wins, all NaN gives 0),
// in the CPU backend's override and in the Backend default (download, host argmax, upload).
TEST_F(CpuBackendTest, ArgmaxRowsFollowTheArgmaxRule) {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {
      {1, 3, 3, 2},         {nan, 1, nan, 1},        {nan, nan, nan, nan}, {-inf, -inf, -inf, -inf},
      {-1, nan, -0.5f, -2}, {0.0f, -0.0f, 0.0f, -1}, {2, 1, 0, inf},       {-3, -2, -2, nan}};
  const std::vector<int32_t> want = {1, 1, 0, 0, 2, 0, 3, 1};
  std::vector<float> flat;
  for (const auto& r : rows) {
    flat.insert(flat.end(), r.begin(), r.end());
    EXPECT_EQ(argmax(r), want[flat.size() / 4 - 1])
        << "cisa::argmax itself, row " << flat.size() / 4 - 1;
  }
  auto x = buf(flat);
  const auto n_rows = static_cast<int64_t>(rows.size());
  auto ids = *be->allocate(n_rows * 4, "ids");
  for (int variant = 0; variant < 2; ++variant) {
    std::fill_n(ids->i32(), n_rows, -7);
    const Status st = variant == 0 ? be->argmax_rows(x->f32(), n_rows, 4, ids->i32())
                                   : be->Backend::argmax_rows(x->f32(), n_rows, 4, ids->i32());
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(std::vector<int32_t>(ids->i32(), ids->i32() + n_rows), want) << "variant " << variant;
  }
  EXPECT_FALSE(be->argmax_rows(x->f32(), -1, 4, ids->i32()).ok());
  EXPECT_FALSE(be->argmax_rows(nullptr, 2, 4, ids->i32()).ok());
  EXPECT_TRUE(be->argmax_rows(nullptr, 0, 4, nullptr).ok());
}

// Model::forward with ForwardOutputs::argmax gives the argmax of the logits path's rows, alone or
// with the logits, over prefill (several output modes, several blocks) and decode steps that cross
// page boundaries; the two models have the same synthetic weights.
TEST(ModelGreedy, ArgmaxOutputsAreTheArgmaxOfTheLogits) {
  const ModelOptions mo{.threads = 2, .context = 256, .max_sequences = 3, .prefill_block = 24};
  auto a = Model::load_synthetic("tiny-llama", mo);
  auto b = Model::load_synthetic("tiny-llama", mo);
  ASSERT_TRUE(a.ok() && b.ok());
  Model* models[2] = {a->get(), b->get()};
  const int V = (*a)->hparams().n_vocab;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<int32_t> prompt[3];
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 13 + 7 * s; ++i) prompt[s].push_back(tok(rng));
  std::vector<SeqId> seqs[2];
  for (Model* m : models)
    for (int s = 0; s < 3; ++s) seqs[m == models[0] ? 0 : 1].push_back(*m->add_sequence());
  const std::vector<int64_t> positions = {0, 5, 12};
  auto inputs = [&](int k) {
    return std::vector<SequenceInput>{
        {.seq = seqs[k][0], .tokens = prompt[0], .outputs = OutputMode::kAll},
        {.seq = seqs[k][1],
         .tokens = prompt[1],
         .outputs = OutputMode::kPositions,
         .positions = positions},
        {.seq = seqs[k][2], .tokens = prompt[2], .outputs = OutputMode::kLast}};
  };
  std::vector<int32_t> ids, ids_both;
  std::vector<float> logits, logits_both;
  ASSERT_TRUE(models[0]->forward(inputs(0), ForwardOutputs{.argmax = &ids}).ok());
  ASSERT_TRUE(models[1]->forward(inputs(1), &logits).ok());
  auto expect_argmax_of = [&](const std::vector<float>& lg, const std::vector<int32_t>& got,
                              const char* what) {
    ASSERT_EQ(lg.size(), got.size() * static_cast<size_t>(V)) << what;
    for (size_t r = 0; r < got.size(); ++r)
      EXPECT_EQ(got[r], argmax({lg.data() + r * V, static_cast<size_t>(V)}))
          << what << ", row " << r;
  };
  ASSERT_EQ(ids.size(), 13u + 3u + 1u);
  expect_argmax_of(logits, ids, "prefill");
  std::vector<int32_t> next = {ids[12], ids[15], ids[16]};
  for (int step = 0; step < 40; ++step) {  // 20 + 40 positions: pages of 16 fill several times
    std::vector<SequenceInput> in[2];
    for (int k = 0; k < 2; ++k)
      for (int s = 0; s < 3; ++s) in[k].push_back({.seq = seqs[k][s], .tokens = {&next[s], 1}});
    ASSERT_TRUE(models[0]->forward(in[0], ForwardOutputs{.argmax = &ids}).ok());
    ASSERT_TRUE(models[1]
                    ->forward(in[1], ForwardOutputs{.logits = &logits_both, .argmax = &ids_both})
                    .ok());
    expect_argmax_of(logits_both, ids, "decode, greedy alone");
    EXPECT_EQ(ids, ids_both) << "step " << step;
    next = ids;
  }
  // Nowhere to put the outputs is an error; kNone rows need neither vector.
  const int32_t t = 1;
  const SequenceInput last{.seq = seqs[0][0], .tokens = {&t, 1}};
  EXPECT_EQ(models[0]->forward({&last, 1}, ForwardOutputs{}).code(), StatusCode::kInvalidArgument);
  const SequenceInput none{.seq = seqs[0][0], .tokens = {&t, 1}, .outputs = OutputMode::kNone};
  EXPECT_TRUE(models[0]->forward({&none, 1}, ForwardOutputs{}).ok());
}

}  // namespace
}  // namespace cisa
