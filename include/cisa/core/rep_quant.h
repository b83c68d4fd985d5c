// cisa/core/rep_quant.h — representatives rounded to 8 bits (RepPrecision, cpu/kv_cache.h): how
// much selection quality a cache of 1-byte representatives would cost, measured on the CPU
// before any device kernel reads them (docs/design.md, "Representative precision").
//
//   std::vector<float> r = mean_key;        // one representative (one page, one KV group)
//   quantize_rep(RepPrecision::kFp8, r);    // r now holds the values an fp8 cache would give
#pragma once

#include <span>
#include <string>

#include "cisa/core/status.h"

namespace cisa {

// kNative: the cache's own element type (f32 or bf16). kFp8: OCP fp8 E4M3 (the "FN" variant:
// largest finite 448, no infinities). kInt8: signed integers in [−127, 127]. Both 8-bit kinds use
// one power-of-two scale 2^e per representative, the smallest that puts its largest magnitude
// within range, but never below 2^kMinRepScaleExp (the smallest normal f32), so that e fits the
// CUDA cache's one-byte exponent and a value times its scale is exact in bf16 and in f32.
// Representatives below 127 · 2^-127 (~7.5e-37) in magnitude round on that finest grid.
enum class RepPrecision { kNative, kFp8, kInt8 };
constexpr int kMinRepScaleExp = -126;
const char* rep_precision_name(RepPrecision p);                  // "native", "fp8", "int8"
Result<RepPrecision> parse_rep_precision(const std::string& s);  // the names above

// x rounded to the nearest E4M3 value, ties to the even code; |x| above 448 saturates to ±448
// (an E4M3FN cache has no infinity). NaN stays NaN.
float round_to_e4m3(float x);

// Rounds every value of one representative in place to `p` (kNative: no change) with the
// representative's own scale. One of only zeros is left as it is; one holding a non-finite value
// has no 8-bit form and becomes NaN throughout (its scores are NaN, which the SPEC ranks).
void quantize_rep(RepPrecision p, std::span<float> rep);

}  // namespace cisa
