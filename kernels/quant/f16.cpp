#include "kernels/quant/f16.h"

#include <bit>
#include <cstring>

namespace q4t::quant {

namespace {
// A row of n 16-bit values (F16 or BF16, raw little-endian bytes at any address) widened by `widen` into T.
template <float (*widen)(uint16_t), typename T>
void widen_row(T* y, const uint8_t* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    std::memcpy(&h, x + 2 * i, sizeof h);
    y[i] = T(widen(h));
  }
}

// A row of n floats narrowed by `narrow` into raw 16-bit values.
template <uint16_t (*narrow)(float)>
void narrow_row(uint8_t* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const uint16_t h = narrow(x[i]);
    std::memcpy(y + 2 * i, &h, sizeof h);
  }
}
}  // namespace

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) {
    // Inf stays inf; a NaN keeps its payload and comes out quiet, as F16C's vcvtph2ps does.
    return std::bit_cast<float>(sign | 0x7F800000 | (mant ? 0x400000 : 0) | (mant << 13));
  }
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float (10 significant bits, power-of-two scale).
    const float v = float(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  // Normal: rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((b >> 16) & 0x8000);
  const uint32_t abs = b & 0x7FFFFFFF;
  if (abs > 0x7F800000) {
    // NaN: quiet it and keep the top 9 payload bits (what vcvtps2ph does).
    return uint16_t(sign | 0x7E00 | ((abs >> 13) & 0x3FF));
  }
  // 65520 = 65504 + half an ulp rounds (to even) up to 2^16, which is inf; so does inf itself.
  if (abs >= 0x477FF000) return uint16_t(sign | 0x7C00);
  if (abs >= 0x38800000) {
    // Normal half. Round to nearest even at bit 13, then rebias 127 -> 15; a mantissa carry correctly
    // bumps the exponent.
    const uint32_t rounded = abs + 0xFFF + ((abs >> 13) & 1);
    return uint16_t(sign | ((rounded - 0x38000000) >> 13));
  }
  // Subnormal half (or zero): count of 2^-24 units, rounded to nearest even. Anything <= 2^-25 is 0.
  if (abs <= 0x33000000) return sign;
  const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - (abs >> 23);  // value = mant * 2^(exp-150) = (mant >> shift) units of 2^-24
  uint32_t units = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (units & 1))) units++;
  return uint16_t(sign | units);
}

void f16_row_to_f32(float* y, const uint8_t* x, int64_t n) { widen_row<f16_to_f32>(y, x, n); }
void f16_row_to_f64(double* y, const uint8_t* x, int64_t n) { widen_row<f16_to_f32>(y, x, n); }
void f32_row_to_f16(uint8_t* y, const float* x, int64_t n) { narrow_row<f32_to_f16>(y, x, n); }

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  // NaN: keep the top bits and set the quiet bit (bit 6 of the half), so truncation cannot make it an inf.
  if ((b & 0x7FFFFFFF) > 0x7F800000) return uint16_t((b >> 16) | 0x40);
  // Round to nearest even at bit 16; a mantissa carry bumps the exponent (the largest floats become inf).
  return uint16_t((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

void bf16_row_to_f32(float* y, const uint8_t* x, int64_t n) { widen_row<bf16_to_f32>(y, x, n); }
void bf16_row_to_f64(double* y, const uint8_t* x, int64_t n) { widen_row<bf16_to_f32>(y, x, n); }
void f32_row_to_bf16(uint8_t* y, const float* x, int64_t n) { narrow_row<f32_to_bf16>(y, x, n); }

}  // namespace q4t::quant
