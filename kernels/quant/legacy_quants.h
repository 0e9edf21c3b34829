// Q4_1, Q5_0 and Q5_1 block codecs, byte for byte GGML's "legacy" formats: 32 weights per block.
//
// Q4_1 (20 bytes): { f16 d; f16 m; u8 qs[16] }: weight j = q·d + m with q a 4-bit quant, weight j < 16 in the low
// nibble of qs[j], weight j >= 16 in the high nibble of qs[j-16].
// Q5_0 (22 bytes): { f16 d; u8 qh[4]; u8 qs[16] }: weight j = (q − 16)·d with q a 5-bit quant: its low 4 bits are
// nibbles as in Q4_1, its fifth bit is bit j of the little-endian 32-bit qh.
// Q5_1 (24 bytes): { f16 d; f16 m; u8 qh[4]; u8 qs[16] }: weight j = q·d + m, q packed as in Q5_0.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/shapes.h"

namespace q4t::quant {

struct BlockQ4_1 {
  uint16_t d;      // f16 scale
  uint16_t m;      // f16 offset (the block's minimum)
  uint8_t qs[16];  // nibbles: low -> weights 0..15, high -> weights 16..31
};
static_assert(sizeof(BlockQ4_1) == kQ4_1BlockBytes, "Q4_1 block must be 20 bytes");

struct BlockQ5_0 {
  uint16_t d;      // f16 scale
  uint8_t qh[4];   // fifth bits, bit j for weight j
  uint8_t qs[16];  // low 4 bits, as Q4_1's nibbles
};
static_assert(sizeof(BlockQ5_0) == kQ5_0BlockBytes, "Q5_0 block must be 22 bytes");

struct BlockQ5_1 {
  uint16_t d;      // f16 scale
  uint16_t m;      // f16 offset (the block's minimum)
  uint8_t qh[4];   // fifth bits, bit j for weight j
  uint8_t qs[16];  // low 4 bits, as Q4_1's nibbles
};
static_assert(sizeof(BlockQ5_1) == kQ5_1BlockBytes, "Q5_1 block must be 24 bytes");

// GGML's reference quantizers. Q4_1 and Q5_1: d = (max − min)/15 (or /31), m = min, q = (x − min)/d rounded
// half up. Q5_0: like Q4_0 with 5 bits: d = (the value of largest |x|)/−16, q = x/d + 16 rounded half up, at
// most 31. n must be a multiple of 32; out receives n/32 blocks.
void quantize_row_q4_1(BlockQ4_1* out, const float* x, int64_t n);
void quantize_row_q5_0(BlockQ5_0* out, const float* x, int64_t n);
void quantize_row_q5_1(BlockQ5_1* out, const float* x, int64_t n);

// Write n weights (n multiple of 32). The float versions evaluate GGML's expression (q·d + m, or (q − 16)·d) in
// float, so they equal GGML's dequantisation bit for bit: Q5_0 is exact, Q4_1 and Q5_1 round once (the sum).
// The double versions are exact.
void dequantize_row_q4_1(float* y, const BlockQ4_1* x, int64_t n);
void dequantize_row_q4_1(double* y, const BlockQ4_1* x, int64_t n);
void dequantize_row_q5_0(float* y, const BlockQ5_0* x, int64_t n);
void dequantize_row_q5_0(double* y, const BlockQ5_0* x, int64_t n);
void dequantize_row_q5_1(float* y, const BlockQ5_1* x, int64_t n);
void dequantize_row_q5_1(double* y, const BlockQ5_1* x, int64_t n);

}  // namespace q4t::quant
