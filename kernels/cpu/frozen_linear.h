// The CPU frozen linear for any weight format: the format's fused row loops (FrozenRowKernels) for one token, and
// for more tokens small tiles of W decoded to f32 and multiplied with the Q4_0 kernel set's packed-panel GEMM
// (x86 SIMD sets) or with Eigen (portable set). Q4_0 has a driver of its own over its kernel sets
// (linear_q4_0.cpp). W is never decoded as a whole. Shapes and sizes are checked by the caller (linear.cpp).
#pragma once
#include <cstdint>

#include "kernels/cpu/frozen_rows.h"

namespace q4t::cpu::detail {

// Y[T, n_out] = X[T, n_in] · Wᵀ
void frozen_gemm(const FrozenRowKernels& k, float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
                 int64_t n_in);
// dX[T, n_in] (+)= dY[T, n_out][:, j_start:j_end] · W[j_start:j_end, :]
void frozen_dx(const FrozenRowKernels& k, float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate);
// The same for Q4_0 weights.
void q4_0_gemm(float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in);
void q4_0_dx(float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start,
             int64_t j_end, bool accumulate);

}  // namespace q4t::cpu::detail
