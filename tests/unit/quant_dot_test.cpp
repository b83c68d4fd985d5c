// Tests of the quantised dot products and matmul against an fp64 reference built from
// dequantize_row (itself checked against the gguf package in tests/golden/quant_golden_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "cisa/model/quant.h"
#include "model/quant_kernels.h"

namespace cisa {
namespace {

const GgmlType kQuantTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K};

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Random but well-formed blocks: random code bytes, scales drawn in a realistic range.
std::vector<uint8_t> random_rows(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t bb = ggml_block_bytes(type), bs = ggml_block_size(type);
  const int64_t n_blocks = rows * cols / bs;
  std::vector<uint8_t> out(static_cast<size_t>(n_blocks * bb));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f), sign(-1.0f, 1.0f);
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
  for (int64_t k = 0; k < n_blocks; ++k) {
    uint8_t* b = out.data() + k * bb;
    switch (type) {
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0:
        put_f16(b, scale(rng) * (sign(rng) < 0 ? -1.0f : 1.0f));
        break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1:
        put_f16(b, scale(rng));
        put_f16(b + 2, -8.0f * scale(rng) * sign(rng));
        break;
      case GgmlType::Q4_K:
        put_f16(b, scale(rng) / 16.0f);
        put_f16(b + 2, scale(rng) / 16.0f);
        break;
      case GgmlType::Q6_K:
        put_f16(b + 208, scale(rng) / 32.0f);
        break;
      default:
        break;
    }
  }
  return out;
}

std::vector<float> random_floats(int64_t n, std::mt19937& rng, float spread = 1.0f) {
  std::normal_distribution<float> nd(0.0f, spread);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<float> dequant(GgmlType type, const uint8_t* row, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  EXPECT_TRUE(dequantize_row(type, row, out.data(), n).ok());
  return out;
}

TEST(Half, MatchesHardwareConversionOnEveryValue) {
#if defined(__F16C__)
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = f16_to_f32(static_cast<uint16_t>(h));
    const float hw = _cvtsh_ss(static_cast<unsigned short>(h));
    if (std::isnan(hw)) {
      EXPECT_TRUE(std::isnan(ours)) << h;
    } else {
      ASSERT_EQ(std::memcmp(&ours, &hw, 4), 0) << "half " << h;
    }
  }
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int k = 0; k < 200000; ++k) {
    uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << "float bits " << b;
  }
  for (float f : {65504.0f, 65520.0f, 65519.99f, 5.96e-8f, 2.98e-8f, 2.99e-8f, -0.0f, 6.1035e-5f})
    EXPECT_EQ(f32_to_f16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << f;
#else
  GTEST_SKIP() << "no F16C on this target to compare with";
#endif
}

TEST(Half, KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7C00)));
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
}

float round_half(float v) {
  return f16_to_f32(f32_to_f16(v));
}  // checked above vs F16C

// The activation quantisations must be llama.cpp's (its AVX2 quantize_row_q8_0 / q8_1 and
// quantize_row_q8_K), written out here from its definition: codes round(x * 127 / max|x|) half
// to even, scale f16(max|x| / 127) for blocks of 32 (sum f16(max|x|/127 * sum q) for Q8_1) and
// 1 / (127 / max|x|) in f32 for blocks of 256; plus the error bound that follows from them.
TEST(QuantizeX, MatchesLlamaCppDefinitionAndErrorBound) {
  std::mt19937 rng(1);
  for (float spread : {1e-4f, 3.0f, 400.0f}) {
    std::vector<float> x = random_floats(256, rng, spread);
    x[40] = 0.0f;
    for (int i = 64; i < 96; ++i) x[i] = 0.0f;  // an all-zero block
    x[100] = 2.5f * spread;                     // a block whose extreme is positive ...
    x[130] = -2.5f * spread;                    // ... and one whose extreme is negative
    for (quant::XSum kind : {quant::XSum::kQ8_0, quant::XSum::kQ8_1}) {
      std::vector<quant::BlockX> q(8);
      quant::quantize_x(x.data(), q.data(), 256, kind);
      for (int b = 0; b < 8; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        const float id = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; ++i) {
          const float xi = x[b * 32 + i];
          ASSERT_EQ(q[b].q[i], static_cast<int>(std::nearbyint(xi * id))) << b << " " << i;
          sum += q[b].q[i];
          // |x - d q| <= half a step plus 127 times the f16 rounding of the scale: 2^-11
          // relative, or 2^-25 absolute once the scale is an f16 subnormal (below 2^-14).
          const float step = amax / 127.0f;
          const float d_err = std::max(step * 0x1p-11f, 0x1p-25f);
          EXPECT_LE(std::fabs(xi - q[b].d * q[b].q[i]),
                    (0.5f * step + 127.0f * d_err) * 1.0001f + 1e-30f);
        }
        EXPECT_EQ(q[b].d, round_half(amax / 127.0f)) << b;
        if (kind == quant::XSum::kQ8_1)
          EXPECT_EQ(q[b].s, round_half(amax / 127.0f * static_cast<float>(sum))) << b;
        else
          EXPECT_EQ(q[b].s, q[b].d * static_cast<float>(sum)) << b;
      }
      EXPECT_EQ(q[2].d, 0.0f);
      EXPECT_EQ(q[2].s, 0.0f);
    }
    // Offset-coded weights (Q4_0: c = 8, Q5_0: c = 16): the same Q8_0 block plus lane offsets
    // -c times the sum of each lane's 4 codes.
    for (int c : {8, 16}) {
      std::vector<quant::BlockX> plain(8);
      std::vector<quant::BlockXO> xo(8);
      quant::quantize_x(x.data(), plain.data(), 256, quant::XSum::kQ8_0);
      quant::quantize_xo(x.data(), xo.data(), 256, c);
      for (int b = 0; b < 8; ++b) {
        EXPECT_EQ(std::memcmp(&xo[b].x, &plain[b], sizeof(quant::BlockX)), 0);
        const int8_t* q = plain[b].q;
        for (int l = 0; l < 8; ++l)
          EXPECT_EQ(xo[b].off[l], -c * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]));
      }
    }
  }
}

TEST(QuantizeXK, MatchesLlamaCppDefinitionAndGroupSums) {
  std::mt19937 rng(2);
  std::vector<float> x = random_floats(768, rng, 2.0f);
  for (int i = 256; i < 512; ++i) x[i] = 0.0f;
  x[600] = -9.0f;  // negative extreme (llama.cpp then divides by a negative max: same products)
  std::vector<quant::BlockXK> q(3);
  quant::quantize_xk(x.data(), q.data(), 768);
  for (int b : {0, 2}) {
    float amax = 0.0f;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[b * 256 + i]));
    const float id = 127.0f / amax;
    EXPECT_EQ(q[b].d, 1.0f / id);
    for (int i = 0; i < 256; ++i) {
      ASSERT_EQ(q[b].q[i], static_cast<int>(std::nearbyint(x[b * 256 + i] * id))) << i;
      EXPECT_LE(std::fabs(x[b * 256 + i] - q[b].d * q[b].q[i]), 0.5f * q[b].d * 1.0001f);
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += q[b].q[16 * g + i];
      EXPECT_EQ(q[b].bsum[g], sum);
    }
  }
  EXPECT_EQ(q[1].d, 0.0f);
}

TEST(QuantizeFast, BitIdenticalToScalar) {
  std::mt19937 rng(4);
  for (float spread : {1e-3f, 1.0f, 50.0f}) {
    std::vector<float> x = random_floats(1024, rng, spread);
    for (int i = 0; i < 64; ++i) x[i] = 0.0f;  // a zero block
    for (quant::XSum kind : {quant::XSum::kQ8_0, quant::XSum::kQ8_1}) {
      std::vector<quant::BlockX> a(32), b(32);
      quant::quantize_x(x.data(), a.data(), 1024, kind);
      quant::quantize_x_fast(x.data(), b.data(), 1024, kind);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(quant::BlockX) * a.size()), 0) << spread;
    }
    for (int c : {8, 16}) {
      std::vector<quant::BlockXO> a(32), b(32);
      quant::quantize_xo(x.data(), a.data(), 1024, c);
      quant::quantize_xo_fast(x.data(), b.data(), 1024, c);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(quant::BlockXO) * a.size()), 0) << spread;
    }
    std::vector<quant::BlockXK> c(4), d(4);
    quant::quantize_xk(x.data(), c.data(), 1024);
    quant::quantize_xk_fast(x.data(), d.data(), 1024);
    EXPECT_EQ(std::memcmp(c.data(), d.data(), sizeof(quant::BlockXK) * c.size()), 0) << spread;
  }
}

struct KernelCase {
  const char* isa;
  quant::TileKernel (*get)(GgmlType);
};

// Every kernel, every type, token counts hitting each tail case: the result must equal the fp64
// dot of the dequantised weights with the dequantised activations up to float rounding.
TEST(QuantKernels, MatchFp64ReferenceOnQuantisedActivations) {
  const KernelCase cases[] = {{"scalar", quant::tile_kernel_scalar},
                              {"avx2", quant::tile_kernel_avx2},
                              {"avx2_k", quant::tile_kernel_avx2_k},
                              {"avx2_k_batch", quant::tile_kernel_avx2_k_batch}};
  std::mt19937 rng(7);
  int ran = 0;
  for (const KernelCase& kc : cases) {
    for (GgmlType type : kQuantTypes) {
      quant::TileKernel kernel = kc.get(type);
      if (!kernel) {
        EXPECT_STRNE(kc.isa, "scalar") << "no scalar kernel for " << ggml_type_name(type);
        continue;
      }
      ++ran;
      const int64_t rows = 7, cols = 512;
      const int64_t nb = quant::activation_blocks(type, cols);
      const size_t tok_bytes = quant::activation_bytes(type, cols);
      const uint64_t rb = *ggml_row_bytes(type, cols);
      const std::vector<uint8_t> w = random_rows(type, rows, cols, rng);
      for (int64_t n_tok : {1, 2, 3, 4, 7, 8, 15}) {  // every token-group path
        const std::vector<float> x = random_floats(n_tok * cols, rng);
        std::vector<uint8_t> xq(n_tok * tok_bytes);
        for (int64_t t = 0; t < n_tok; ++t)
          quant::quantize_activations(type, x.data() + t * cols, xq.data() + t * tok_bytes, cols);
        const int64_t ldy = rows + 3;
        std::vector<float> y(static_cast<size_t>(n_tok * ldy), -1.0f);
        kernel(w.data(), rb, rows, xq.data(), nb, n_tok, y.data(), ldy);
        for (int64_t r = 0; r < rows; ++r) {
          const std::vector<float> wr = dequant(type, w.data() + r * rb, cols);
          for (int64_t t = 0; t < n_tok; ++t) {
            const void* xt = xq.data() + t * tok_bytes;
            double ref = 0, mag = 0, ref_raw = 0, qerr = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double xd = quant::activation_value(type, xt, c);
              ref += static_cast<double>(wr[c]) * xd;
              ref_raw += static_cast<double>(wr[c]) * x[t * cols + c];
              mag += std::fabs(static_cast<double>(wr[c]) * xd);
              qerr += std::fabs(wr[c] * (x[t * cols + c] - xd));
            }
            // Q8_1 activations (Q4_1, Q5_1 weights) carry their block sum as llama.cpp stores
            // it, f16(d_f32 * sum q) rather than d * sum q: the min m of each weight block
            // multiplies that stored sum.
            if (quant::activation_sum_kind(type) == quant::XSum::kQ8_1) {
              const auto* bx = static_cast<const quant::BlockX*>(xt);
              for (int64_t b = 0; b < cols / 32; ++b) {
                quant::SubBlock sb;
                quant::decode_sub_block(type, w.data() + r * rb + b * ggml_block_bytes(type), 0,
                                        &sb);
                int qsum = 0;
                for (int i = 0; i < 32; ++i) qsum += bx[b].q[i];
                const double dev = double(sb.add) * (double(bx[b].s) - double(bx[b].d) * qsum);
                ref += dev;
                qerr += std::fabs(dev);
              }
            }
            const double got = y[t * ldy + r];
            ASSERT_FALSE(std::isnan(got));
            EXPECT_NEAR(got, ref, 2e-6 * mag + 1e-6)
                << kc.isa << " " << ggml_type_name(type) << " row " << r << " tok " << t << " of "
                << n_tok;
            // Against the unquantised activations, the error is the activation rounding's.
            EXPECT_LE(std::fabs(got - ref_raw), qerr * 1.001 + 2e-6 * mag + 1e-6)
                << ggml_type_name(type);
          }
        }
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t r = rows; r < ldy; ++r)
            EXPECT_EQ(y[t * ldy + r], -1.0f) << "wrote past the tile";
      }
    }
  }
#if defined(__AVX2__) && defined(__FMA__)
  EXPECT_EQ(ran, 15);  // 7 scalar, 5 avx2, 2 avx2_k, 1 avx2_k_batch
#endif
}

// The public matmul: threads, tiling over rows and tokens, strides, float weight types.
TEST(Matmul, ThreadedMatchesReferenceForEveryType) {
  ThreadPool pool(3);
  std::mt19937 rng(11);
  std::vector<GgmlType> types(std::begin(kQuantTypes), std::end(kQuantTypes));
  types.insert(types.end(), {GgmlType::F32, GgmlType::F16, GgmlType::BF16});
  MatmulScratch scratch;
  for (GgmlType type : types) {
    const bool is_float = ggml_block_size(type) == 1;
    for (auto [rows, n_tok] : {std::pair<int64_t, int64_t>{300, 1}, {37, 70}, {129, 5}}) {
      const int64_t cols = 256;
      std::vector<uint8_t> w;
      if (is_float) {
        const std::vector<float> wf = random_floats(rows * cols, rng, 0.1f);
        w.resize(static_cast<size_t>(rows) * *ggml_row_bytes(type, cols));
        for (size_t i = 0; i < wf.size(); ++i) {
          if (type == GgmlType::F32) std::memcpy(&w[4 * i], &wf[i], 4);
          if (type == GgmlType::F16) put_f16(&w[2 * i], wf[i]);
          if (type == GgmlType::BF16) {
            uint32_t b;
            std::memcpy(&b, &wf[i], 4);
            const uint16_t h = static_cast<uint16_t>(b >> 16);
            std::memcpy(&w[2 * i], &h, 2);
          }
        }
      } else {
        w = random_rows(type, rows, cols, rng);
      }
      WeightView view{type, rows, cols, *ggml_row_bytes(type, cols), w.data()};
      const int64_t ldx = cols + 16, ldy = rows + 1;
      const std::vector<float> x = random_floats(n_tok * ldx, rng);
      std::vector<float> y(static_cast<size_t>(n_tok * ldy), 0.0f);
      ASSERT_TRUE(matmul(view, x.data(), y.data(), n_tok, pool, &scratch, ldx, ldy).ok());
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> wr = dequant(type, view.row(r), cols);
        for (int64_t t = 0; t < n_tok; ++t) {
          double ref = 0, qerr = 0, mag = 0;
          // Activations are quantised in blocks of 32, or 256 for the K-quants: half a step each.
          const int64_t ab = quant::uses_block256(type) ? 256 : 32;
          float amax[8] = {};
          for (int64_t c = 0; c < cols; ++c)
            amax[c / ab] = std::fmax(amax[c / ab], std::fabs(x[t * ldx + c]));
          for (int64_t c = 0; c < cols; ++c) {
            ref += static_cast<double>(wr[c]) * x[t * ldx + c];
            mag += std::fabs(static_cast<double>(wr[c]) * x[t * ldx + c]);
            qerr += is_float ? 0.0 : std::fabs(wr[c]) * 0.5 * amax[c / ab] / 127.0;
          }
          EXPECT_NEAR(y[t * ldy + r], ref, qerr * 1.001 + 1e-5 * mag + 1e-6)
              << ggml_type_name(type) << " rows " << rows << " tok " << t;
        }
      }
    }
  }
}

TEST(Matmul, ErrorsAreReported) {
  ThreadPool pool(1);
  std::vector<uint8_t> w(2 * 68);  // 2 rows of 64 Q8_0 weights (two 34-byte blocks each)
  std::vector<float> x(64), y(2);
  WeightView v{GgmlType::Q8_0, 2, 64, 68, w.data()};
  EXPECT_TRUE(matmul(v, x.data(), y.data(), 1, pool).ok());
  WeightView bad = v;
  bad.row_bytes = 60;
  EXPECT_EQ(matmul(bad, x.data(), y.data(), 1, pool).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(matmul(v, nullptr, y.data(), 1, pool).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(matmul(v, x.data(), y.data(), -1, pool).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(matmul(v, x.data(), y.data(), 1, pool, nullptr, 10, 0).code(),
            StatusCode::kInvalidArgument);
  WeightView q2{GgmlType::Q2_K, 1, 256, 84, w.data()};
  EXPECT_EQ(matmul(q2, x.data(), y.data(), 1, pool).code(), StatusCode::kUnimplemented);
  GgufTensor t;
  t.name = "q2";
  t.type = GgmlType::Q2_K;
  EXPECT_EQ(WeightView::of(t).status().code(), StatusCode::kUnimplemented);
  float out[32];
  EXPECT_EQ(dequantize_row(GgmlType::Q2_K, w.data(), out, 256).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(dequantize_row(GgmlType::Q8_0, w.data(), out, 31).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cisa
