// cisa/core/bf16.h — bfloat16 storage type: the top 16 bits of an IEEE float32.
//
//   uint16_t h = cisa::f32_to_bf16(1.5f);   // round to nearest even
//   float x = cisa::bf16_to_f32(h);         // exact widening
#pragma once

#include <cstdint>
#include <cstring>

namespace cisa {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest, ties to even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace cisa
