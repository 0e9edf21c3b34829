// What the block quantizers share (internal to kernels/quant): GGML's rounding helper, its "all zero" threshold
// and the row-length check every codec makes.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/shapes.h"

namespace q4t::quant::detail {

// GGML's GROUP_MAX_EPS: a group whose largest magnitude (or a block whose largest scale) is below this is zero.
inline constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, as GGML's nearest_int: adding 1.5·2^23 leaves the rounded integer in the low
// mantissa bits (exact for |v| < 2^22, which every caller's levels are far inside).
inline int nearest(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

// Throws ShapeError unless n is a non-negative multiple of block: "<fn>: n = 300 is not a multiple of 256 (the
// <what>)", what naming the block ("Q5_K super-block size").
inline void check_row(const char* fn, int64_t n, int64_t block, const char* what) {
  if (n < 0 || n % block != 0)
    throw ShapeError(std::string(fn) + ": n = " + std::to_string(n) + " is not a multiple of " +
                     std::to_string(block) + " (the " + what + ")");
}

}  // namespace q4t::quant::detail
