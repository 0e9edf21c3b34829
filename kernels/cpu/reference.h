// Plain double-precision references for every linear kernel: the ground truth for tests and `q4tune selftest`.
// Every format's weights widen exactly into double, so these are exact up to double rounding.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/formats.h"

namespace q4t::ref {

// Y[T, n_out] = X[T, n_in] · Wᵀ, W in format f (GGML's layout)
std::vector<double> frozen_gemm(Format f, const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in);
// dX[T, n_in] = base + dY[:, j_start:j_end] · W[j_start:j_end, :]; base = dX_in when accumulating, else 0.
std::vector<double> frozen_dx(Format f, const uint8_t* w, const float* dY, const float* dX_in, int64_t T,
                              int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end);
// Row r of W as doubles: the format's exact values (its codec's dequantize_row_f64).
std::vector<double> frozen_row(Format f, const uint8_t* w, int64_t r, int64_t n_in);
// f32 GEMMs (see kernels/cpu/linear.h): C_in + alpha·op(A)·op(B); C_in may be null (no accumulate).
std::vector<double> gemm_nt(const float* A, const float* B, const float* C_in, int64_t M, int64_t N, int64_t K,
                            double alpha = 1);
std::vector<double> gemm_nn(const float* A, const float* B, const float* C_in, int64_t M, int64_t N, int64_t K,
                            double alpha = 1);
std::vector<double> gemm_tn(const float* A, const float* B, const float* C_in, int64_t M, int64_t N, int64_t K,
                            double alpha = 1);

// --- Mixed precision (vk::LinearKernels, "Mixed precision") ---------------------------------------------------
// The same products over the inputs the mixed kernels multiply, summed exactly: each row of X (or of dY's columns
// j_start .. j_end) as rows_to_f16.comp rounds it, and each weight as wunit.glsl decodes it. W in GGML's layout.
std::vector<double> mixed_gemm(Format f, const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in);
std::vector<double> mixed_dx(Format f, const uint8_t* w, const float* dY, const float* dX_in, int64_t T, int64_t n_out,
                             int64_t n_in, int64_t j_start, int64_t j_end);
// Row r of W as the mixed kernels decode it: f16 values (exact in double). Formats with a (sub-)block scale product
// (the K-quants, IQ4_XS) round it to f16 first; then one rounding where the scale meets the code, and for formats
// with an offset (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) one more after it. The others: their exact value rounded once.
std::vector<double> mixed_row(Format f, const uint8_t* w, int64_t r, int64_t n_in);
// Columns col0 .. col0 + K of `rows` rows (stride lda) of x as rows_to_f16.comp rounds them: each row times the
// power of two that brings its largest |value| into [2^14, 2^15), rounded to f16, and scaled back.
std::vector<double> mixed_rows(const float* x, int64_t rows, int64_t K, int64_t lda, int64_t col0);
// v rounded to the nearest f16 (ties to even; subnormals at 2^-24 steps; past 65504, infinity).
double round_to_f16(double v);

// --- The CPU's mixed precision (kernels/cpu/int_rows.h) ----------------------------------------------------------
// x[0:n) (n whole blocks) rounded as llama.cpp's CPU matmuls round the input of a format-f weight (the rule of its
// llama_cpp_act_round, kernels/quant/act_round.h): the values d·q, exact in f32. ref::frozen_gemm over these
// values is the reference of the CPU's mixed products.
std::vector<float> act_rounded(Format f, const float* x, int64_t n);

// max_i |got_i - want_i| / max(max_i |want_i|, 1e-30): the norm-wise relative error all kernel checks use.
double max_rel_error(const float* got, const std::vector<double>& want);

}  // namespace q4t::ref
