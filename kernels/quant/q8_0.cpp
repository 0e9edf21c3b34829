#include "kernels/quant/q8_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/quant/f16.h"

namespace q4t::quant {

namespace {
void check_row(const char* fn, int64_t n) {
  if (n < 0 || n % kQ8_0BlockElems != 0)
    throw ShapeError(std::string(fn) + ": n = " + std::to_string(n) +
                     " is not a multiple of 32 (the Q8_0 block size)");
}

template <typename T>
void dequantize_row(T* y, const BlockQ8_0* x, int64_t n) {
  for (int64_t b = 0; b < n / kQ8_0BlockElems; b++) {
    const T d = T(f16_to_f32(x[b].d));
    for (int j = 0; j < 32; j++) y[b * kQ8_0BlockElems + j] = T(x[b].qs[j]) * d;
  }
}
}  // namespace

void quantize_row_q8_0(BlockQ8_0* out, const float* x, int64_t n) {
  check_row("quantize_row_q8_0", n);
  for (int64_t b = 0; b < n / kQ8_0BlockElems; b++) {
    const float* xb = x + b * kQ8_0BlockElems;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(xb[j]));
    // The scale is rounded to f16 only for storage; q is computed with the f32 d, as GGML does.
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d);
    for (int j = 0; j < 32; j++) out[b].qs[j] = int8_t(std::round(xb[j] * id));
  }
}

void dequantize_row_q8_0(float* y, const BlockQ8_0* x, int64_t n) {
  check_row("dequantize_row_q8_0", n);
  dequantize_row(y, x, n);
}

void dequantize_row_q8_0(double* y, const BlockQ8_0* x, int64_t n) {
  check_row("dequantize_row_q8_0", n);
  dequantize_row(y, x, n);
}


}  // namespace q4t::quant
