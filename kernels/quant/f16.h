// IEEE half <-> float, round-to-nearest-even (what F16C and GGML's tables produce), one value or a whole row.
#pragma once
#include <cstdint>

namespace q4t::quant {
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Rows of n halves stored as raw little-endian bytes (an F16 weight row; no alignment assumed). Widening is
// exact in float and in double.
void f16_row_to_f32(float* y, const uint8_t* x, int64_t n);
void f16_row_to_f64(double* y, const uint8_t* x, int64_t n);
void f32_row_to_f16(uint8_t* y, const float* x, int64_t n);

// bfloat16 (the top 16 bits of a float) <-> float, as GGML converts: widening is exact; narrowing rounds to
// nearest even (subnormals included, overflow to inf) and turns a NaN into a quiet NaN with the same top bits.
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// Rows of n bfloat16 values stored as raw little-endian bytes (a BF16 weight row; no alignment assumed).
void bf16_row_to_f32(float* y, const uint8_t* x, int64_t n);
void bf16_row_to_f64(double* y, const uint8_t* x, int64_t n);
void f32_row_to_bf16(uint8_t* y, const float* x, int64_t n);
}  // namespace q4t::quant
