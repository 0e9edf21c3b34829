// Q8_0 block codec, byte for byte GGML's format: 32 weights per 34-byte block { f16 d; i8 qs[32] }; weight j
// is d * qs[j].
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/shapes.h"

namespace q4t::quant {

struct BlockQ8_0 {
  uint16_t d;      // f16 scale
  int8_t qs[32];   // weight j = d * qs[j]
};
static_assert(sizeof(BlockQ8_0) == kQ8_0BlockBytes, "Q8_0 block must be 34 bytes");

// GGML's reference quantizer: amax = max |x|, d = amax / 127, q = roundf(x / d) (half away from zero), with
// 1/d = 0 for an all-zero block. n must be a multiple of 32; out receives n/32 blocks.
void quantize_row_q8_0(BlockQ8_0* out, const float* x, int64_t n);
// Writes n weights (n multiple of 32). Exact in float and in double: q * d (an 8-bit times an 11-bit
// significand) has no rounding.
void dequantize_row_q8_0(float* y, const BlockQ8_0* x, int64_t n);
void dequantize_row_q8_0(double* y, const BlockQ8_0* x, int64_t n);


}  // namespace q4t::quant
