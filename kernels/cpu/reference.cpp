#include "kernels/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant/f16.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q8_0.h"

namespace q4t::ref {

namespace {

// Row r of W as doubles (exact), for one weight format.
using RowDecoder = std::vector<double> (*)(const uint8_t* w, int64_t r, int64_t n_in);

// The bytes are copied into real blocks first: w carries no alignment.
template <class Block, int64_t kElems>
std::vector<Block> blocks_of_row(const uint8_t* w, int64_t r, int64_t n_in) {
  std::vector<Block> blocks(size_t(n_in / kElems));
  std::memcpy(blocks.data(), w + r * int64_t(blocks.size() * sizeof(Block)), blocks.size() * sizeof(Block));
  return blocks;
}

std::vector<double> q4_0_row(const uint8_t* w, int64_t r, int64_t n_in) {
  const auto blocks = blocks_of_row<quant::BlockQ4_0, kQ4_0BlockElems>(w, r, n_in);
  std::vector<double> row(static_cast<size_t>(n_in));
  quant::dequantize_row_q4_0(row.data(), blocks.data(), n_in);
  return row;
}

std::vector<double> q8_0_row(const uint8_t* w, int64_t r, int64_t n_in) {
  const auto blocks = blocks_of_row<quant::BlockQ8_0, kQ8_0BlockElems>(w, r, n_in);
  std::vector<double> row(static_cast<size_t>(n_in));
  quant::dequantize_row_q8_0(row.data(), blocks.data(), n_in);
  return row;
}

std::vector<double> q4_k_row(const uint8_t* w, int64_t r, int64_t n_in) {
  const auto blocks = blocks_of_row<quant::BlockQ4_K, kQK_KBlockElems>(w, r, n_in);
  std::vector<double> row(static_cast<size_t>(n_in));
  quant::dequantize_row_q4_k(row.data(), blocks.data(), n_in);
  return row;
}

std::vector<double> q6_k_row(const uint8_t* w, int64_t r, int64_t n_in) {
  const auto blocks = blocks_of_row<quant::BlockQ6_K, kQK_KBlockElems>(w, r, n_in);
  std::vector<double> row(static_cast<size_t>(n_in));
  quant::dequantize_row_q6_k(row.data(), blocks.data(), n_in);
  return row;
}

std::vector<double> f16_row(const uint8_t* w, int64_t r, int64_t n_in) {
  std::vector<double> row(static_cast<size_t>(n_in));
  quant::f16_row_to_f64(row.data(), w + r * f16_row_bytes(n_in), n_in);
  return row;
}

// Y[T, n_out] = X · Wᵀ with W's rows from `row_of`.
std::vector<double> linear_gemm(RowDecoder row_of, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
                                int64_t n_in) {
  std::vector<double> Y(size_t(T * n_out));
  for (int64_t o = 0; o < n_out; o++) {
    const std::vector<double> row = row_of(w, o, n_in);
    for (int64_t t = 0; t < T; t++) {
      double s = 0;
      for (int64_t i = 0; i < n_in; i++) s += double(X[t * n_in + i]) * row[i];
      Y[t * n_out + o] = s;
    }
  }
  return Y;
}

// dX[T, n_in] = base + dY[:, j_start:j_end] · W[j_start:j_end, :].
std::vector<double> linear_dx(RowDecoder row_of, const uint8_t* w, const float* dY, const float* dX_in, int64_t T,
                              int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end) {
  std::vector<double> dX(size_t(T * n_in), 0.0);
  if (dX_in)
    for (size_t i = 0; i < dX.size(); i++) dX[i] = dX_in[i];
  for (int64_t j = j_start; j < j_end; j++) {
    const std::vector<double> row = row_of(w, j, n_in);
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < n_in; i++) dX[t * n_in + i] += double(dY[t * n_out + j]) * row[i];
  }
  return dX;
}

// C[M, N] = base + sum_k A(m, k) * B(k, n), with A(m, k) = A[m*am + k*ak] and B(k, n) = B[k*bk + n*bn], so
// one loop serves every transposition.
std::vector<double> gemm(const float* A, int64_t am, int64_t ak, const float* B, int64_t bk, int64_t bn,
                         const float* C_in, int64_t M, int64_t N, int64_t K, double alpha) {
  std::vector<double> C(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0.0;
      for (int64_t k = 0; k < K; k++) s += double(A[m * am + k * ak]) * double(B[k * bk + n * bn]);
      C[m * N + n] = (C_in ? double(C_in[m * N + n]) : 0.0) + alpha * s;
    }
  return C;
}
}  // namespace

std::vector<double> q4_0_gemm(const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  return linear_gemm(q4_0_row, w, X, T, n_out, n_in);
}

std::vector<double> q4_0_dx(const uint8_t* w, const float* dY, const float* dX_in, int64_t T, int64_t n_out,
                            int64_t n_in, int64_t j_start, int64_t j_end) {
  return linear_dx(q4_0_row, w, dY, dX_in, T, n_out, n_in, j_start, j_end);
}

std::vector<double> q8_0_gemm(const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  return linear_gemm(q8_0_row, w, X, T, n_out, n_in);
}

std::vector<double> q8_0_dx(const uint8_t* w, const float* dY, const float* dX_in, int64_t T, int64_t n_out,
                            int64_t n_in, int64_t j_start, int64_t j_end) {
  return linear_dx(q8_0_row, w, dY, dX_in, T, n_out, n_in, j_start, j_end);
}

std::vector<double> q4_k_gemm(const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  return linear_gemm(q4_k_row, w, X, T, n_out, n_in);
}

std::vector<double> q4_k_dx(const uint8_t* w, const float* dY, const float* dX_in, int64_t T, int64_t n_out,
                            int64_t n_in, int64_t j_start, int64_t j_end) {
  return linear_dx(q4_k_row, w, dY, dX_in, T, n_out, n_in, j_start, j_end);
}

std::vector<double> q6_k_gemm(const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  return linear_gemm(q6_k_row, w, X, T, n_out, n_in);
}

std::vector<double> q6_k_dx(const uint8_t* w, const float* dY, const float* dX_in, int64_t T, int64_t n_out,
                            int64_t n_in, int64_t j_start, int64_t j_end) {
  return linear_dx(q6_k_row, w, dY, dX_in, T, n_out, n_in, j_start, j_end);
}

std::vector<double> f16_gemm(const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  return linear_gemm(f16_row, w, X, T, n_out, n_in);
}

std::vector<double> f16_dx(const uint8_t* w, const float* dY, const float* dX_in, int64_t T, int64_t n_out,
                           int64_t n_in, int64_t j_start, int64_t j_end) {
  return linear_dx(f16_row, w, dY, dX_in, T, n_out, n_in, j_start, j_end);
}

// A[M, K] · B[N, K]ᵀ
std::vector<double> gemm_nt(const float* A, const float* B, const float* C_in, int64_t M, int64_t N,
                            int64_t K, double alpha) {
  return gemm(A, K, 1, B, 1, K, C_in, M, N, K, alpha);
}

// A[M, K] · B[K, N]
std::vector<double> gemm_nn(const float* A, const float* B, const float* C_in, int64_t M, int64_t N,
                            int64_t K, double alpha) {
  return gemm(A, K, 1, B, N, 1, C_in, M, N, K, alpha);
}

// A[K, M]ᵀ · B[K, N]
std::vector<double> gemm_tn(const float* A, const float* B, const float* C_in, int64_t M, int64_t N,
                            int64_t K, double alpha) {
  return gemm(A, 1, M, B, N, 1, C_in, M, N, K, alpha);
}

double max_rel_error(const float* got, const std::vector<double>& want) {
  double max_err = 0, max_want = 0;
  for (size_t i = 0; i < want.size(); i++) {
    // A NaN or inf in the output is an infinite error (std::max would silently skip a NaN).
    if (!std::isfinite(got[i])) return INFINITY;
    max_err = std::max(max_err, std::abs(double(got[i]) - want[i]));
    max_want = std::max(max_want, std::abs(want[i]));
  }
  return max_err / std::max(max_want, 1e-30);
}

}  // namespace q4t::ref
