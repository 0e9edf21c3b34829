// The inner loops of the CPU Q8_0, Q4_K, Q6_K and F16 linears, one set per instruction set (frozen_linear.cpp
// tiles and threads them). A weight row is a run of blocks of block_elems weights stored in block_bytes bytes
// each (Q8_0: 32 weights in 34 bytes; Q4_K and Q6_K: 256 in 144 and 210; F16: 1 weight in 2 bytes), raw GGML
// bytes with no alignment assumed; rows lie row_bytes apart. Every range of weights below starts at a block
// boundary and is a whole number of blocks.
#pragma once
#include <algorithm>
#include <cstdint>

namespace q4t::cpu::detail {

struct FrozenRowKernels {
  const char* name;
  int64_t block_elems, block_bytes;
  // y[r] = W[r, 0:n) · x[0:n) for r in [0, n_rows); w points at row 0. Activations stay f32.
  void (*dot_rows)(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows, int64_t n);
  // dx[0:n) += Σ_r s[r] · W[r, 0:n) over n_rows rows; w points at the range's first weight in row 0
  // (the T = 1 backward).
  void (*axpy_rows)(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows, int64_t n);
  // y[0:n) = the n weights starting at w, widened to f32: exact, except Q4_K's d·sc·q − dmin·m, which rounds
  // once, as GGML's float dequantisation does.
  void (*decode)(float* y, const uint8_t* w, int64_t n);
};

// Byte offset of weight `col` within a row (col on a block boundary).
inline int64_t byte_offset(const FrozenRowKernels& k, int64_t col) { return col / k.block_elems * k.block_bytes; }

// The loops matching the Q4_0 kernel set in use (q4_0_kernels().isa), so use_q4_0_kernels switches these too and
// the tests cover each set. The AVX-512 set shares the AVX2 loops: one token is bound by memory, not lanes.
const FrozenRowKernels& q8_0_row_kernels();
const FrozenRowKernels& f16_row_kernels();
// Q4_K and Q6_K: blocks of 256 weights (144 and 210 bytes).
const FrozenRowKernels& q4_k_row_kernels();
const FrozenRowKernels& q6_k_row_kernels();

#if defined(__x86_64__) || defined(__i386__)
extern const FrozenRowKernels kQ8_0Avx2;
extern const FrozenRowKernels kF16Avx2;
extern const FrozenRowKernels kQ4_KAvx2;
extern const FrozenRowKernels kQ6_KAvx2;
#endif

}  // namespace q4t::cpu::detail

#include "kernels/formats.h"

namespace q4t::cpu::detail {

// The loops of any format through its codec: each block decoded to f32 by the format's dequantize_row (GGML's
// float values), then multiplied. The formats without loops of their own take these.
template <Format F>
void decoded_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows, int64_t n) {
  const FormatTraits& t = format_traits(F);
  float block[256];
  for (int64_t r = 0; r < n_rows; r++) {
    const uint8_t* row = w + r * row_bytes;
    float lanes[8] = {};
    for (int64_t b = 0; b < n / t.block_elems; b++) {
      const int64_t e = t.block_elems == 1 ? std::min<int64_t>(256, n - b) : t.block_elems;
      t.dequantize_row(block, row + b * t.block_bytes, e);
      const float* xb = x + b * t.block_elems;
      for (int64_t j = 0; j < e; j++) lanes[j % 8] += block[j] * xb[j];
      if (t.block_elems == 1) b += e - 1;
    }
    float sum = 0.0f;
    for (float v : lanes) sum += v;
    y[r] = sum;
  }
}

template <Format F>
void decoded_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows, int64_t n) {
  const FormatTraits& t = format_traits(F);
  float block[256];
  for (int64_t r = 0; r < n_rows; r++) {
    const uint8_t* row = w + r * row_bytes;
    for (int64_t b = 0; b < n / t.block_elems; b++) {
      const int64_t e = t.block_elems == 1 ? std::min<int64_t>(256, n - b) : t.block_elems;
      t.dequantize_row(block, row + b * t.block_bytes, e);
      float* xb = dx + b * t.block_elems;
      for (int64_t j = 0; j < e; j++) xb[j] += s[r] * block[j];
      if (t.block_elems == 1) b += e - 1;
    }
  }
}

template <Format F>
void decoded_decode(float* y, const uint8_t* w, int64_t n) {
  format_traits(F).dequantize_row(y, w, n);
}

template <Format F>
const FrozenRowKernels& decoded_row_kernels() {
  static const FrozenRowKernels k{format_traits(F).name, format_traits(F).block_elems,
                                  format_traits(F).block_bytes, decoded_dot_rows<F>, decoded_axpy_rows<F>,
                                  decoded_decode<F>};
  return k;
}

}  // namespace q4t::cpu::detail
