// The inner loops of the CPU frozen linears of every format but Q4_0, one set per instruction set
// (frozen_linear.cpp tiles and threads them). A weight row is a run of blocks of block_elems weights stored in
// block_bytes bytes each (Q8_0: 32 weights in 34 bytes; the K-quants and IQ4_XS: 256; F16 and BF16: 1 weight in
// 2 bytes), raw GGML bytes with no alignment assumed; rows lie row_bytes apart. Every range of weights below
// starts at a block boundary and is a whole number of blocks.
//
// Every format runs the same loop skeleton over a small block decoder of its own (frozen_rows_skeleton.h), built
// once per instruction set: portable (frozen_rows.cpp), AVX2 (frozen_rows_avx2.cpp) and AVX-512
// (frozen_rows_avx512.cpp).
#pragma once
#include <cstdint>

namespace q4t {
enum class Format : uint32_t;
}

namespace q4t::cpu::detail {

struct FrozenRowKernels {
  const char* name;
  int64_t block_elems, block_bytes;
  // y[r] = W[r, 0:n) · x[0:n) for r in [0, n_rows); w points at row 0. Activations stay f32.
  void (*dot_rows)(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows, int64_t n);
  // dx[0:n) += Σ_r s[r] · W[r, 0:n) over n_rows rows; w points at the range's first weight in row 0
  // (the T = 1 backward).
  void (*axpy_rows)(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows, int64_t n);
  // y[0:n) = the n weights starting at w, widened to f32: bit for bit the codec's float dequantisation (GGML's):
  // exact, except the formats with an offset (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), whose scale·q + offset rounds once.
  void (*decode)(float* y, const uint8_t* w, int64_t n);
};

// Byte offset of weight `col` within a row (col on a block boundary).
inline int64_t byte_offset(const FrozenRowKernels& k, int64_t col) { return col / k.block_elems * k.block_bytes; }

// The loops of format F (any format but Q4_0) matching the Q4_0 kernel set in use (q4_0_kernels().isa), so
// use_q4_0_kernels switches these too and the tests cover each set.
template <Format F>
const FrozenRowKernels& row_kernels();

#if defined(__x86_64__) || defined(__i386__)
// The AVX2 and AVX-512 loops of format f (frozen_rows_avx2.cpp, frozen_rows_avx512.cpp); null for Q4_0.
const FrozenRowKernels* avx2_row_kernels(Format f);
const FrozenRowKernels* avx512_row_kernels(Format f);
#endif

}  // namespace q4t::cpu::detail
