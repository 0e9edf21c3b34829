#include "kernels/quant/q4_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/quant/f16.h"

namespace q4t::quant {

namespace {
void check_row(const char* fn, int64_t n) {
  if (n < 0 || n % kQ4_0BlockElems != 0)
    throw ShapeError(std::string(fn) + ": n = " + std::to_string(n) +
                     " is not a multiple of 32 (the Q4_0 block size)");
}

template <typename T>
void dequantize_row(T* y, const BlockQ4_0* x, int64_t n) {
  for (int64_t b = 0; b < n / kQ4_0BlockElems; b++) {
    const T d = T(f16_to_f32(x[b].d));
    T* yb = y + b * kQ4_0BlockElems;
    for (int j = 0; j < 16; j++) {
      yb[j] = T((x[b].qs[j] & 0xF) - 8) * d;
      yb[j + 16] = T((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}
}  // namespace

void quantize_row_q4_0(BlockQ4_0* out, const float* x, int64_t n) {
  check_row("quantize_row_q4_0", n);
  for (int64_t b = 0; b < n / kQ4_0BlockElems; b++) {
    const float* xb = x + b * kQ4_0BlockElems;
    // The signed value of largest magnitude; a strict > keeps the first one on ties.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    // d < 0 when max > 0, so max itself maps to q = 0 (i.e. -8) and the other side gets up to +7.
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d);
    for (int j = 0; j < 16; j++) {
      // x*id + 8.5 lies in about [0.5, 16.5]; the int8 cast truncates, 16 is clamped to 15.
      const int q0 = std::min(15, int(int8_t(xb[j] * id + 8.5f)));
      const int q1 = std::min(15, int(int8_t(xb[j + 16] * id + 8.5f)));
      out[b].qs[j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q4_0(float* y, const BlockQ4_0* x, int64_t n) {
  check_row("dequantize_row_q4_0", n);
  dequantize_row(y, x, n);
}

void dequantize_row_q4_0(double* y, const BlockQ4_0* x, int64_t n) {
  check_row("dequantize_row_q4_0", n);
  dequantize_row(y, x, n);
}


}  // namespace q4t::quant
