// Q4_0 block codec, byte for byte GGML's format: 32 weights per 18-byte block { f16 d; u8 qs[16] };
// weight j < 16 is (qs[j] & 0xF) - 8, weight j >= 16 is (qs[j-16] >> 4) - 8, each times d.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/shapes.h"

namespace q4t::quant {

struct BlockQ4_0 {
  uint16_t d;       // f16 scale
  uint8_t qs[16];   // nibbles: low -> weights 0..15, high -> weights 16..31
};
static_assert(sizeof(BlockQ4_0) == kQ4_0BlockBytes, "Q4_0 block must be 18 bytes");

// GGML's reference quantizer: m = the value with the largest |x|, d = m / -8, q = min(15, (int)(x/d + 8.5)).
// n must be a multiple of 32; out receives n/32 blocks.
void quantize_row_q4_0(BlockQ4_0* out, const float* x, int64_t n);
// Writes n weights (n multiple of 32). Exact in float and in double: (q - 8) * d has no rounding.
void dequantize_row_q4_0(float* y, const BlockQ4_0* x, int64_t n);
void dequantize_row_q4_0(double* y, const BlockQ4_0* x, int64_t n);


}  // namespace q4t::quant
