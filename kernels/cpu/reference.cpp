#include "kernels/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant/act_round.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q8_0.h"
#include "kernels/quant/iq4.h"
#include "kernels/quant/legacy_quants.h"

namespace q4t::ref {

namespace {

// The bytes are copied into real blocks first: w carries no alignment.
template <class Block, int64_t kElems>
std::vector<Block> blocks_of_row(const uint8_t* w, int64_t r, int64_t n_in) {
  std::vector<Block> blocks(size_t(n_in / kElems));
  std::memcpy(blocks.data(), w + r * int64_t(blocks.size() * sizeof(Block)), blocks.size() * sizeof(Block));
  return blocks;
}

// Y[T, n_out] = X · Wᵀ with W's rows from `row_of`.
std::vector<double> linear_gemm(Format f, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
                                int64_t n_in) {
  std::vector<double> Y(size_t(T * n_out));
  for (int64_t o = 0; o < n_out; o++) {
    const std::vector<double> row = frozen_row(f, w, o, n_in);
    for (int64_t t = 0; t < T; t++) {
      double s = 0;
      for (int64_t i = 0; i < n_in; i++) s += double(X[t * n_in + i]) * row[i];
      Y[t * n_out + o] = s;
    }
  }
  return Y;
}

// dX[T, n_in] = base + dY[:, j_start:j_end] · W[j_start:j_end, :].
std::vector<double> linear_dx(Format f, const uint8_t* w, const float* dY, const float* dX_in, int64_t T,
                              int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end) {
  std::vector<double> dX(size_t(T * n_in), 0.0);
  if (dX_in)
    for (size_t i = 0; i < dX.size(); i++) dX[i] = dX_in[i];
  for (int64_t j = j_start; j < j_end; j++) {
    const std::vector<double> row = frozen_row(f, w, j, n_in);
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

std::vector<double> frozen_row(Format f, const uint8_t* w, int64_t r, int64_t n_in) {
  // A copy of the row first: w carries no alignment.
  const int64_t rb = row_bytes(f, n_in);
  std::vector<uint8_t> bytes(w + r * rb, w + (r + 1) * rb);
  std::vector<double> row(static_cast<size_t>(n_in));
  format_traits(f).dequantize_row_f64(row.data(), bytes.data(), n_in);
  return row;
}

std::vector<double> frozen_gemm(Format f, const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  return linear_gemm(f, w, X, T, n_out, n_in);
}

std::vector<double> frozen_dx(Format f, const uint8_t* w, const float* dY, const float* dX_in, int64_t T,
                              int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end) {
  return linear_dx(f, w, dY, dX_in, T, n_out, n_in, j_start, j_end);
}

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

double round_to_f16(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  int e = 0;
  std::frexp(v, &e);                      // |v| = f·2^e, f in [0.5, 1)
  const int quantum = std::max(e - 11, -24);  // 11 significant bits, or the subnormal step
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -quantum)), quantum);
  return std::abs(r) > 65504.0 ? std::copysign(INFINITY, v) : r;
}

namespace {
// A weight w = code·s + o (exact in double) as a mixed decode computes it: the scale s and the offset o rounded to
// f16 first, then code·s rounded once, then (for formats with an offset) the sum rounded once more.
double mixed_from_exact(double w, double s, double o, bool offset) {
  const double code = s == 0 ? 0 : (w - o) / s;
  const double p = round_to_f16(code * round_to_f16(s));
  return offset ? round_to_f16(p + round_to_f16(o)) : p;
}

// The (scale, offset) of every weight of a row of the formats whose mixed decode rounds a block or sub-block scale
// to f16 before it meets the code (unit_<format>.glsl), from the format's blocks.
template <class Block>
std::vector<Block> row_blocks(const uint8_t* w, int64_t r, int64_t n_in, int64_t elems) {
  std::vector<Block> b(size_t(n_in / elems));
  std::memcpy(b.data(), w + r * int64_t(b.size() * sizeof(Block)), b.size() * sizeof(Block));
  return b;
}
}  // namespace

std::vector<double> mixed_row(Format f, const uint8_t* w, int64_t r, int64_t n_in) {
  std::vector<double> row(static_cast<size_t>(n_in));
  switch (f) {
    case Format::F16: return frozen_row(f, w, r, n_in);
    case Format::Q4_K: {
      const auto blocks = blocks_of_row<quant::BlockQ4_K, kQK_KBlockElems>(w, r, n_in);
      for (size_t b = 0; b < blocks.size(); ++b) {
        const quant::BlockQ4_K& q = blocks[b];
        const double d = quant::f16_to_f32(q.d), dmin = quant::f16_to_f32(q.dmin);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc = 0, m = 0;
          quant::k4_scale_min(q.scales, j, &sc, &m);
          const double ds = round_to_f16(d * sc), dm = round_to_f16(dmin * m);
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = q.qs[32 * (j / 2) + l];
            const int code = (j % 2 == 0) ? (byte & 15) : (byte >> 4);
            row[256 * b + 32 * size_t(j) + size_t(l)] = round_to_f16(round_to_f16(code * ds) - dm);
          }
        }
      }
      return row;
    }
    case Format::Q6_K: {
      const auto blocks = blocks_of_row<quant::BlockQ6_K, kQK_KBlockElems>(w, r, n_in);
      for (size_t b = 0; b < blocks.size(); ++b) {
        const quant::BlockQ6_K& q = blocks[b];
        const double d = quant::f16_to_f32(q.d);
        for (int h = 0; h < 2; ++h)
          for (int k4 = 0; k4 < 4; ++k4)
            for (int l = 0; l < 32; ++l) {
              const uint8_t lbyte = q.ql[64 * h + 32 * (k4 & 1) + l], hbyte = q.qh[32 * h + l];
              const int code = ((k4 < 2 ? lbyte & 15 : lbyte >> 4) | (((hbyte >> (2 * k4)) & 3) << 4)) - 32;
              const double ds = round_to_f16(d * q.scales[8 * h + 2 * k4 + l / 16]);
              row[256 * b + 128 * size_t(h) + 32 * size_t(k4) + size_t(l)] = round_to_f16(code * ds);
            }
      }
      return row;
    }
    case Format::Q4_1:
    case Format::Q5_1:
    case Format::Q2_K:
    case Format::Q3_K:
    case Format::Q5_K:
    case Format::IQ4_XS: {
      row = frozen_row(f, w, r, n_in);
      for (int64_t i = 0; i < n_in; ++i) {
        double sc = 0, off = 0;
        bool has_offset = true;
        if (f == Format::Q4_1) {
          const auto b = row_blocks<quant::BlockQ4_1>(w, r, n_in, 32)[size_t(i / 32)];
          sc = quant::f16_to_f32(b.d), off = quant::f16_to_f32(b.m);
        } else if (f == Format::Q5_1) {
          const auto b = row_blocks<quant::BlockQ5_1>(w, r, n_in, 32)[size_t(i / 32)];
          sc = quant::f16_to_f32(b.d), off = quant::f16_to_f32(b.m);
        } else if (f == Format::Q2_K) {
          const auto b = row_blocks<quant::BlockQ2_K>(w, r, n_in, 256)[size_t(i / 256)];
          const uint8_t v = b.scales[(i % 256) / 16];
          sc = double(quant::f16_to_f32(b.d)) * (v & 15), off = -double(quant::f16_to_f32(b.dmin)) * (v >> 4);
        } else if (f == Format::Q5_K) {
          const auto b = row_blocks<quant::BlockQ5_K>(w, r, n_in, 256)[size_t(i / 256)];
          uint8_t scale = 0, min = 0;
          quant::k4_scale_min(b.scales, int((i % 256) / 32), &scale, &min);
          sc = double(quant::f16_to_f32(b.d)) * scale, off = -double(quant::f16_to_f32(b.dmin)) * min;
        } else if (f == Format::Q3_K) {
          const auto b = row_blocks<quant::BlockQ3_K>(w, r, n_in, 256)[size_t(i / 256)];
          sc = double(quant::f16_to_f32(b.d)) * quant::k3_scale(b.scales, int((i % 256) / 16)), has_offset = false;
        } else {
          const auto b = row_blocks<quant::BlockIQ4_XS>(w, r, n_in, 256)[size_t(i / 256)];
          sc = double(quant::f16_to_f32(b.d)) * quant::iq4_xs_scale(b, int((i % 256) / 32)), has_offset = false;
        }
        row[size_t(i)] = mixed_from_exact(row[size_t(i)], sc, off, has_offset);
      }
      return row;
    }
    default: row = frozen_row(f, w, r, n_in); break;  // Q4_0's d·(q − 8), Q8_0's d·q: exact, one rounding below
  }
  for (double& v : row) v = round_to_f16(v);
  return row;
}

std::vector<double> mixed_rows(const float* x, int64_t rows, int64_t K, int64_t lda, int64_t col0) {
  std::vector<double> out(size_t(rows * K));
  for (int64_t m = 0; m < rows; ++m) {
    const float* row = x + m * lda + col0;
    double amax = 0;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::abs(double(row[k])));
    int e = 0;
    if (amax > 0 && std::isfinite(amax)) {
      int x2 = 0;
      std::frexp(amax, &x2);
      e = std::clamp(15 - x2, -126, 126);
    }
    for (int64_t k = 0; k < K; ++k) out[size_t(m * K + k)] = std::ldexp(round_to_f16(std::ldexp(double(row[k]), e)), -e);
  }
  return out;
}

std::vector<double> mixed_gemm(Format f, const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  const std::vector<double> x = mixed_rows(X, T, n_in, n_in, 0);
  std::vector<double> Y(size_t(T * n_out));
  for (int64_t o = 0; o < n_out; o++) {
    const std::vector<double> row = mixed_row(f, w, o, n_in);
    for (int64_t t = 0; t < T; t++) {
      double s = 0;
      for (int64_t i = 0; i < n_in; i++) s += x[size_t(t * n_in + i)] * row[size_t(i)];
      Y[size_t(t * n_out + o)] = s;
    }
  }
  return Y;
}

std::vector<double> mixed_dx(Format f, const uint8_t* w, const float* dY, const float* dX_in, int64_t T, int64_t n_out,
                             int64_t n_in, int64_t j_start, int64_t j_end) {
  const int64_t K = j_end - j_start;
  const std::vector<double> dy = mixed_rows(dY, T, K, n_out, j_start);
  std::vector<double> dX(size_t(T * n_in), 0.0);
  if (dX_in)
    for (size_t i = 0; i < dX.size(); i++) dX[i] = dX_in[i];
  for (int64_t j = j_start; j < j_end; j++) {
    const std::vector<double> row = mixed_row(f, w, j, n_in);
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < n_in; i++) dX[size_t(t * n_in + i)] += dy[size_t(t * K + j - j_start)] * row[size_t(i)];
  }
  return dX;
}

std::vector<float> act_rounded(Format f, const float* x, int64_t n) {
  const bool k = format_traits(f).llama_cpp_act_round == ActRound::Q8_K;
  const int64_t block = k ? 256 : 32;
  std::vector<float> y(static_cast<size_t>(n));
  std::vector<int8_t> q(static_cast<size_t>(block));
  for (int64_t b = 0; b < n; b += block) {
    const float d = k ? quant::round_q8_k_block(x + b, q.data()) : quant::round_q8_0_block(x + b, q.data());
    for (int64_t i = 0; i < block; i++) y[size_t(b + i)] = d * float(q[size_t(i)]);
  }
  return y;
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
