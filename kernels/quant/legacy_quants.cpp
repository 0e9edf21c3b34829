#include "kernels/quant/legacy_quants.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/quant/f16.h"
#include "kernels/quant/quant_util.h"

namespace q4t::quant {

namespace {

constexpr int kQK = 32;

void check_row(const char* fn, int64_t n, const char* block) { detail::check_row(fn, n, kQK, block); }

// The 32 fifth bits of a Q5 block, bit j for weight j (qh is little-endian).
uint32_t load_qh(const uint8_t* qh) {
  return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}
void store_qh(uint8_t* qh, uint32_t bits) {
  for (int i = 0; i < 4; i++) qh[i] = uint8_t(bits >> (8 * i));
}

// The smallest and largest value of a block (GGML starts from ±FLT_MAX, so a block of infinities stays infinite).
void min_max(const float* x, float* lo, float* hi) {
  *lo = FLT_MAX;
  *hi = -FLT_MAX;
  for (int j = 0; j < kQK; j++) {
    if (x[j] < *lo) *lo = x[j];
    if (x[j] > *hi) *hi = x[j];
  }
}

// Packs 32 five-bit levels: low nibbles as Q4's, fifth bits into qh.
void pack_q5(uint8_t* qs, uint8_t* qh, const uint8_t* L) {
  uint32_t high = 0;
  for (int j = 0; j < 16; j++) {
    qs[j] = uint8_t((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
    high |= uint32_t((L[j] >> 4) & 1) << j;
    high |= uint32_t((L[j + 16] >> 4) & 1) << (j + 16);
  }
  store_qh(qh, high);
}

template <typename T>
void dequantize_q4_1(T* y, const BlockQ4_1* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const T d = T(f16_to_f32(x[b].d)), m = T(f16_to_f32(x[b].m));
    T* yb = y + b * kQK;
    for (int j = 0; j < 16; j++) {
      yb[j] = T(x[b].qs[j] & 0xF) * d + m;
      yb[j + 16] = T(x[b].qs[j] >> 4) * d + m;
    }
  }
}

// The 5-bit level of weight j of a Q5 block.
inline int q5_level(const uint8_t* qs, uint32_t high, int j) {
  const int low = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
  return low | int((high >> j) & 1) << 4;
}

template <typename T>
void dequantize_q5_0(T* y, const BlockQ5_0* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const T d = T(f16_to_f32(x[b].d));
    const uint32_t high = load_qh(x[b].qh);
    T* yb = y + b * kQK;
    for (int j = 0; j < kQK; j++) yb[j] = T(q5_level(x[b].qs, high, j) - 16) * d;
  }
}

template <typename T>
void dequantize_q5_1(T* y, const BlockQ5_1* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const T d = T(f16_to_f32(x[b].d)), m = T(f16_to_f32(x[b].m));
    const uint32_t high = load_qh(x[b].qh);
    T* yb = y + b * kQK;
    for (int j = 0; j < kQK; j++) yb[j] = T(q5_level(x[b].qs, high, j)) * d + m;
  }
}

}  // namespace

void quantize_row_q4_1(BlockQ4_1* out, const float* x, int64_t n) {
  check_row("quantize_row_q4_1", n, "Q4_1 block size");
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    float lo, hi;
    min_max(xb, &lo, &hi);
    const float d = (hi - lo) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d);
    out[b].m = f32_to_f16(lo);
    for (int j = 0; j < 16; j++) {
      // (x − min)/d + 0.5 lies in about [0.5, 15.5]: the int8 cast truncates (rounds half up), 16 is clamped.
      const int q0 = std::min(15, int(int8_t((xb[j] - lo) * id + 0.5f)));
      const int q1 = std::min(15, int(int8_t((xb[j + 16] - lo) * id + 0.5f)));
      out[b].qs[j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

void quantize_row_q5_0(BlockQ5_0* out, const float* x, int64_t n) {
  check_row("quantize_row_q5_0", n, "Q5_0 block size");
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    // The signed value of largest magnitude; a strict > keeps the first one on ties.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; j++) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    // d < 0 when max > 0, so max itself maps to q = 0 (i.e. −16) and the other side gets up to +15.
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d);
    uint8_t L[kQK];
    for (int j = 0; j < kQK; j++) L[j] = uint8_t(std::min(31, int(int8_t(xb[j] * id + 16.5f))));
    pack_q5(out[b].qs, out[b].qh, L);
  }
}

void quantize_row_q5_1(BlockQ5_1* out, const float* x, int64_t n) {
  check_row("quantize_row_q5_1", n, "Q5_1 block size");
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    float lo, hi;
    min_max(xb, &lo, &hi);
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d);
    out[b].m = f32_to_f16(lo);
    uint8_t L[kQK];
    // (x − min)/d + 0.5 lies in about [0.5, 31.5]; GGML truncates it to 8 bits with no clamp.
    for (int j = 0; j < kQK; j++) L[j] = uint8_t((xb[j] - lo) * id + 0.5f);
    pack_q5(out[b].qs, out[b].qh, L);
  }
}

void dequantize_row_q4_1(float* y, const BlockQ4_1* x, int64_t n) {
  check_row("dequantize_row_q4_1", n, "Q4_1 block size");
  dequantize_q4_1(y, x, n);
}
void dequantize_row_q4_1(double* y, const BlockQ4_1* x, int64_t n) {
  check_row("dequantize_row_q4_1", n, "Q4_1 block size");
  dequantize_q4_1(y, x, n);
}
void dequantize_row_q5_0(float* y, const BlockQ5_0* x, int64_t n) {
  check_row("dequantize_row_q5_0", n, "Q5_0 block size");
  dequantize_q5_0(y, x, n);
}
void dequantize_row_q5_0(double* y, const BlockQ5_0* x, int64_t n) {
  check_row("dequantize_row_q5_0", n, "Q5_0 block size");
  dequantize_q5_0(y, x, n);
}
void dequantize_row_q5_1(float* y, const BlockQ5_1* x, int64_t n) {
  check_row("dequantize_row_q5_1", n, "Q5_1 block size");
  dequantize_q5_1(y, x, n);
}
void dequantize_row_q5_1(double* y, const BlockQ5_1* x, int64_t n) {
  check_row("dequantize_row_q5_1", n, "Q5_1 block size");
  dequantize_q5_1(y, x, n);
}

}  // namespace q4t::quant
