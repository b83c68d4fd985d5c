// 8-bit representatives (core/rep_quant.h): E4M3 rounding against a brute-force search over the
// format's 256 codes decoded from their bit fields; the per-representative scale, the error
// bound and exactness in bf16 for fp8 and int8; the CPU cache storing what quantize_rep gives
// and refusing moment representatives.
#include "cisa/core/rep_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cisa/core/bf16.h"
#include "cisa/cpu/kv_cache.h"
#include "test_util.h"

namespace cisa {
namespace {

// Every finite E4M3FN value with its code (sign, 4 exponent bits, 3 mantissa bits; bias 7;
// exponent 0 subnormal; S.1111.111 is NaN), from the bit fields alone.
struct Code {
  int bits;
  double value;
};
std::vector<Code> e4m3_codes() {
  std::vector<Code> out;
  for (int b = 0; b < 256; ++b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) continue;  // NaN
    const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
    out.push_back({b, s ? -mag : mag});
  }
  return out;
}

// Nearest code by search: the smallest distance, ties to the even mantissa (code bit 0 clear).
double brute_e4m3(double x, const std::vector<Code>& codes) {
  const double top = 448.0;
  if (x > top) return top;
  if (x < -top) return -top;
  const Code* best = nullptr;
  double bd = INFINITY;
  for (const Code& c : codes) {
    if ((c.bits >> 7) != (std::signbit(x) ? 1 : 0)) continue;  // same sign: ±0 kept apart
    const double d = std::fabs(c.value - x);
    if (d < bd || (d == bd && (c.bits & 1) == 0)) best = &c, bd = d;
  }
  return best->value;
}

TEST(RepQuant, E4m3MatchesBruteForce) {
  const auto codes = e4m3_codes();
  ASSERT_EQ(codes.size(), 254u);
  std::mt19937 rng(4);
  std::vector<float> xs;
  for (const Code& c : codes) {  // every code, and the midpoints to both neighbours
    xs.push_back(static_cast<float>(c.value));
    for (const Code& d : codes)
      if ((d.bits >> 7) == (c.bits >> 7) && (d.bits & 127) == (c.bits & 127) + 1)
        xs.push_back(static_cast<float>((c.value + d.value) / 2));
  }
  std::uniform_real_distribution<float> lg(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) xs.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(lg(rng)));
  xs.push_back(1e9f);
  xs.push_back(-1e9f);
  for (const float x : xs) {
    const double want = brute_e4m3(x, codes);
    const float got = round_to_e4m3(x);
    ASSERT_EQ(static_cast<double>(got), want) << "x = " << x;
    ASSERT_EQ(std::signbit(got), std::signbit(x)) << "x = " << x;
  }
  EXPECT_TRUE(std::isnan(round_to_e4m3(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to_e4m3(464.0f), 448.0f);  // would round up to 480: saturates
  // Ties: 1 + 1/16 lies between 1 (mantissa 0) and 1.125 (mantissa 1): to 1.
  EXPECT_EQ(round_to_e4m3(1.0625f), 1.0f);
  EXPECT_EQ(round_to_e4m3(1.1875f), 1.25f);
}

// One representative: the values kept, the scale chosen, the error bound, exact in bf16.
void check_rep(RepPrecision p, const std::vector<float>& in) {
  std::vector<float> out = in;
  quantize_rep(p, out);
  double m = 0;
  for (float x : in) m = std::max(m, std::fabs(static_cast<double>(x)));
  const double top = p == RepPrecision::kFp8 ? 448.0 : 127.0;
  // The scale: the smallest power of two 2^e with m ≤ top · 2^e.
  const int e = static_cast<int>(std::ceil(std::log2(m / top)));
  const double s = std::ldexp(1.0, e);
  ASSERT_LE(m, top * s);
  ASSERT_GT(m, top * s / 2);
  const auto codes = e4m3_codes();
  for (size_t i = 0; i < in.size(); ++i) {
    const double y = in[i] / s;
    const double want = p == RepPrecision::kFp8 ? brute_e4m3(y, codes) : std::nearbyint(y);
    ASSERT_EQ(static_cast<double>(out[i]), want * s) << "value " << i;
    ASSERT_EQ(bf16_to_f32(f32_to_bf16(out[i])), out[i]) << "value " << i << " not exact in bf16";
  }
}

TEST(RepQuant, RepresentativesUseTheirOwnScale) {
  std::mt19937 rng(8);
  for (const RepPrecision p : {RepPrecision::kFp8, RepPrecision::kInt8})
    for (const float spread : {1e-3f, 0.7f, 30.0f, 5e4f}) {
      std::vector<float> r = test::random_vec(rng, 128, spread);
      r[5] *= 20;  // an outlier channel sets the scale
      check_rep(p, r);
      if (::testing::Test::HasFatalFailure()) return;
    }
  // Unchanged: native precision, an all-zero representative. One with a non-finite value has no
  // 8-bit form: it becomes NaN throughout (the CUDA int8 cache stores the NaN exponent byte),
  // either format.
  std::vector<float> r = {0.3f, -1.7f, 2.5f}, z(8, 0.0f), n = {1.0f, NAN, 2.0f},
                     inf = {1.0f, -INFINITY, 2.0f};
  std::vector<float> r2 = r, z2 = z, n2 = n;
  quantize_rep(RepPrecision::kNative, r2);
  quantize_rep(RepPrecision::kFp8, z2);
  quantize_rep(RepPrecision::kInt8, n2);
  quantize_rep(RepPrecision::kFp8, inf);
  EXPECT_EQ(r2, r);
  EXPECT_EQ(z2, z);
  for (const float x : n2) EXPECT_TRUE(std::isnan(x));
  for (const float x : inf) EXPECT_TRUE(std::isnan(x));
  // int8 keeps ~7 bits: 0.3 of a representative whose largest value is 2.5 moves at most half
  // a step of 2.5 / 127 rounded up to a power of two (2^-5).
  std::vector<float> r8 = r;
  quantize_rep(RepPrecision::kInt8, r8);
  EXPECT_NEAR(r8[0], 0.3f, 0x1p-6f);
  EXPECT_NE(r8[0], 0.3f);
}

// The scale never goes below 2^kMinRepScaleExp (2^-126, the CUDA cache's smallest exponent
// byte): a representative under 127 · 2^-127 in magnitude rounds on that grid, both kinds,
// against the rule computed here in double.
TEST(RepQuant, TinyRepresentativesRoundOnTheSmallestScale) {
  EXPECT_EQ(kMinRepScaleExp, -126);
  const std::vector<float> tiny = {1e-38f, -3e-39f, 7e-38f, 0.0f, -6.2e-38f};
  for (const RepPrecision p : {RepPrecision::kInt8, RepPrecision::kFp8}) {
    std::vector<float> r = tiny;
    quantize_rep(p, r);
    for (size_t i = 0; i < r.size(); ++i) {
      const double y = std::ldexp(static_cast<double>(tiny[i]), 126);  // |y| < 6: in range
      const double want = std::ldexp(
          p == RepPrecision::kInt8 ? std::nearbyint(y) : round_to_e4m3(static_cast<float>(y)),
          -126);
      EXPECT_EQ(static_cast<double>(r[i]), want) << rep_precision_name(p) << " value " << i;
    }
  }
  // Just above the floor, the scale is the smallest that fits: 127 · 2^-126 needs e = −126 too,
  // and twice that e = −125.
  std::vector<float> edge = {127 * 0x1p-126f, 254 * 0x1p-126f};
  std::vector<float> e0 = {edge[0]}, e1 = {edge[1]};
  quantize_rep(RepPrecision::kInt8, e0);
  quantize_rep(RepPrecision::kInt8, e1);
  EXPECT_EQ(e0[0], edge[0]);
  EXPECT_EQ(e1[0], edge[1]);
}

TEST(RepQuant, NamesParse) {
  for (const RepPrecision p : {RepPrecision::kNative, RepPrecision::kFp8, RepPrecision::kInt8})
    EXPECT_EQ(*parse_rep_precision(rep_precision_name(p)), p);
  EXPECT_FALSE(parse_rep_precision("fp16").ok());
}

// The cache stores each representative as quantize_rep makes it from the native one: keys exact
// in bf16, so the f32 and bf16 caches' means agree and the comparison is bit for bit.
TEST(RepQuant, CacheStoresQuantizedRepresentatives) {
  for (const RepKind kind : {RepKind::kMean, RepKind::kQuest})
    for (const KvDtype dt : {KvDtype::kF32, KvDtype::kBF16})
      for (const RepPrecision p : {RepPrecision::kFp8, RepPrecision::kInt8}) {
        std::mt19937 rng(21);
        const int d = 32, H = 2, B = 16;
        auto make = [&](KvDtype t, RepPrecision q) {
          return std::move(*PagedKvCache::create({.num_layers = 1,
                                                  .num_kv_heads = H,
                                                  .head_dim = d,
                                                  .page_size = B,
                                                  .num_pages = 8,
                                                  .dtype = t,
                                                  .rep = kind,
                                                  .rep_precision = q}));
        };
        auto native = make(KvDtype::kF32, RepPrecision::kNative), quant = make(dt, p);
        ASSERT_EQ(*native->add_sequence(), 0);
        ASSERT_EQ(*quant->add_sequence(), 0);
        const int64_t n = 3 * B;
        std::vector<float> k = test::random_vec(rng, static_cast<size_t>(n * H * d), 3.0f);
        for (float& x : k) x = bf16_to_f32(f32_to_bf16(x));
        ASSERT_TRUE(native->reserve(0, n).ok());
        ASSERT_TRUE(quant->reserve(0, n).ok());
        ASSERT_TRUE(native->append(0, 0, n, k.data(), k.data()).ok());
        ASSERT_TRUE(quant->append(0, 0, n, k.data(), k.data()).ok());
        const int rw = quant->rep_width();
        int64_t changed = 0;
        const auto table = *native->block_table(0);
        for (int32_t page : table) {
          for (int g = 0; g < H; ++g) {
            const auto* nr = static_cast<const float*>(native->rep(0, page, g));
            std::vector<float> want(nr, nr + rw);
            quantize_rep(p, want);
            const void* qr = quant->rep(0, page, g);
            for (int i = 0; i < rw; ++i) {
              const float got = dt == KvDtype::kF32
                                    ? static_cast<const float*>(qr)[i]
                                    : bf16_to_f32(static_cast<const uint16_t*>(qr)[i]);
              ASSERT_EQ(got, want[static_cast<size_t>(i)])
                  << rep_precision_name(p) << " page " << page << " group " << g << " value " << i;
              changed += got != nr[i] ? 1 : 0;
            }
          }
        }
        EXPECT_GT(changed, 0);  // the rounding did happen
      }
  auto moment = PagedKvCache::create({.num_layers = 1,
                                      .num_kv_heads = 1,
                                      .head_dim = 8,
                                      .page_size = 16,
                                      .num_pages = 4,
                                      .rep = RepKind::kMoment,
                                      .rep_precision = RepPrecision::kFp8});
  ASSERT_FALSE(moment.ok());
  EXPECT_NE(moment.status().message().find("mean or quest"), std::string::npos);
}

}  // namespace
}  // namespace cisa
