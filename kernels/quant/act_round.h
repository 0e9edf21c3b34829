// How llama.cpp's CPU matmuls round an activation before multiplying it with a quantized weight (GGML's
// vec_dot_type; which one a format takes is its ActRound in kernels/formats.h). The rounded value i is d·q[i]:
// - Q8_0, blocks of 32: d = amax/127, q = nearest-even(x·(1/d)) with 1/d taken from the f32 d, and the d kept is d
//   rounded to f16, as GGML's x86 quantizer computes it (Q8_1 rounds the values alike);
// - Q8_K, blocks of 256: m = the value of largest |x| (the first on ties), s = −127/m, q = min(127,
//   nearest-even(s·x)), d = 1/s in f32.
// An all-zero block gives d = 0 and q = 0. Used by the act_round ops (--llama-cpp-numerics), by the CPU's mixed
// precision products (kernels/cpu/int_rows.h) and as their tests' reference.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/quant/f16.h"

namespace q4t::quant {

// One block of 32 values of x (any real type, read as float) -> q[32]; returns d.
template <class T>
float round_q8_0_block(const T* x, int8_t* q) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(float(x[i])));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) q[i] = int8_t(std::nearbyint(float(x[i]) * id));
  return f16_to_f32(f32_to_f16(d));
}

// One block of 256 values -> q[256]; returns d.
template <class T>
float round_q8_k_block(const T* x, int8_t* q) {
  float amax = 0, m = 0;
  for (int i = 0; i < 256; ++i) {
    const float v = float(x[i]);
    if (std::fabs(v) > amax) amax = std::fabs(v), m = v;
  }
  if (amax == 0.0f) {
    std::fill(q, q + 256, int8_t(0));
    return 0.0f;
  }
  const float s = -127.0f / m;
  for (int i = 0; i < 256; ++i) q[i] = int8_t(std::min(127.0f, std::nearbyint(s * float(x[i]))));
  return 1.0f / s;
}

}  // namespace q4t::quant
