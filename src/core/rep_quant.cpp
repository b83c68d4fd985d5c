// Representatives rounded to 8 bits (rep_quant.h).
#include "cisa/core/rep_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cisa {
namespace {

constexpr float kE4m3Max = 448.0f;  // 1.75 · 2^8
constexpr float kInt8Max = 127.0f;

// The smallest e with m ≤ top · 2^e, for finite m > 0.
int scale_exponent(float m, float top) {
  int e = static_cast<int>(std::ceil(std::log2(static_cast<double>(m) / top)));
  while (std::ldexp(static_cast<double>(top), e) < m) ++e;  // log2's rounding, either way
  while (std::ldexp(static_cast<double>(top), e - 1) >= m) --e;
  return e;
}

}  // namespace

const char* rep_precision_name(RepPrecision p) {
  return p == RepPrecision::kFp8 ? "fp8" : p == RepPrecision::kInt8 ? "int8" : "native";
}

Result<RepPrecision> parse_rep_precision(const std::string& s) {
  if (s == "native") return RepPrecision::kNative;
  if (s == "fp8") return RepPrecision::kFp8;
  if (s == "int8") return RepPrecision::kInt8;
  return invalid_argument("representative precision must be native, fp8 or int8 (got '" + s + "')");
}

float round_to_e4m3(float x) {
  if (std::isnan(x)) return x;
  const float a = std::min(std::fabs(x), kE4m3Max);
  // Below 2^-6 the codes are subnormal, spaced 2^-9; above, 8 steps per binade.
  int exp = 0;
  std::frexp(a, &exp);  // a = f · 2^exp, f in [0.5, 1)
  const int step_exp = a < 0x1p-6f ? -9 : exp - 4;
  const float step = std::ldexp(1.0f, step_exp);
  const float q = std::nearbyint(a / step) * step;  // ties to even: the even code
  return std::copysign(std::min(q, kE4m3Max), x);
}

void quantize_rep(RepPrecision p, std::span<float> rep) {
  if (p == RepPrecision::kNative) return;
  float m = 0;
  for (const float x : rep) {
    if (!std::isfinite(x)) {  // no 8-bit form (the CUDA int8 cache stores the NaN exponent)
      std::fill(rep.begin(), rep.end(), std::numeric_limits<float>::quiet_NaN());
      return;
    }
    m = std::max(m, std::fabs(x));
  }
  if (m == 0) return;
  const float top = p == RepPrecision::kFp8 ? kE4m3Max : kInt8Max;
  const int e = std::max(scale_exponent(m, top), kMinRepScaleExp);
  for (float& x : rep) {
    const float y = std::ldexp(x, -e);  // exact: a power of two (f32 has the range to spare)
    const float q = p == RepPrecision::kFp8 ? round_to_e4m3(y) : std::nearbyint(y);
    x = std::ldexp(q, e);
  }
}

}  // namespace cisa
