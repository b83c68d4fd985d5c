// cisa/core/checked.h — overflow-checked integer arithmetic for sizes computed from untrusted
// numbers (command-line options, file headers) before anything is allocated.
//
//   int64_t bytes = 0;
//   if (!cisa::checked_mul({pages, page_size, heads, head_dim, 2}, &bytes))
//     return cisa::invalid_argument("the cache would need more than 2^63 bytes");
//
// Each function returns false, leaving *out untouched, when the exact result does not fit int64_t.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace cisa {

inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// The product of every factor; false as soon as a partial product overflows.
inline bool checked_mul(std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t r = 1;
  for (int64_t f : factors)
    if (!checked_mul(r, f, &r)) return false;
  *out = r;
  return true;
}

// True when x fits the range of int32_t (the type of page indices and most kernel arguments).
inline bool fits_int32(int64_t x) {
  return x >= INT32_MIN && x <= INT32_MAX;
}

}  // namespace cisa
