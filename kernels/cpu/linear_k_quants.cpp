// CPU frozen Q4_K and Q6_K linears: check shapes and spans, then run the shared frozen-linear driver with the
// format's loops (kernels/cpu/frozen_linear.h). W is never decoded as a whole.
#include <string>

#include "kernels/cpu/frozen_linear.h"
#include "kernels/cpu/linear.h"
#include "kernels/shapes.h"

namespace q4t::cpu {

namespace {

struct KFormat {
  const char* name;  // "q4_k" or "q6_k"
  void (*check)(const char* kernel, int64_t n_out, int64_t n_in, int64_t T);
  int64_t (*row_bytes)(int64_t n_in);
  const detail::FrozenRowKernels& (*rows)();
};
const KFormat kQ4_K{"q4_k", check_q4_k_linear, q4_k_row_bytes, detail::q4_k_row_kernels};
const KFormat kQ6_K{"q6_k", check_q6_k_linear, q6_k_row_bytes, detail::q6_k_row_kernels};

void check_linear(const KFormat& f, const std::string& kernel, size_t w_bytes, int64_t n_out, int64_t n_in,
                  int64_t T) {
  f.check(kernel.c_str(), n_out, n_in, T);
  check_size(kernel.c_str(), "w", w_bytes, size_t(n_out * f.row_bytes(n_in)));
}

void gemm(const KFormat& f, const char* op, std::span<float> Y, std::span<const uint8_t> w,
          std::span<const float> X, int64_t T, int64_t n_out, int64_t n_in) {
  const std::string k = std::string(f.name) + op;
  const bool gemv = T == 1 && std::string(op) == "_gemv";
  check_linear(f, k, w.size(), n_out, n_in, T);
  check_size(k.c_str(), gemv ? "y" : "Y", Y.size(), size_t(T * n_out), "floats");
  check_size(k.c_str(), gemv ? "x" : "X", X.size(), size_t(T * n_in), "floats");
  detail::frozen_gemm(f.rows(), Y.data(), w.data(), X.data(), T, n_out, n_in);
}

void dx(const KFormat& f, std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
        int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) {
  const std::string k = std::string(f.name) + "_dx";
  check_linear(f, k, w.size(), n_out, n_in, T);
  check_j_range(k.c_str(), j_start, j_end, n_out);
  check_size(k.c_str(), "dX", dX.size(), size_t(T * n_in), "floats");
  check_size(k.c_str(), "dY", dY.size(), size_t(T * n_out), "floats");
  detail::frozen_dx(f.rows(), dX.data(), w.data(), dY.data(), T, n_out, n_in, j_start, j_end, accumulate);
}

}  // namespace

void q4_k_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
               int64_t n_in) {
  gemm(kQ4_K, "_gemv", y, w, x, 1, n_out, n_in);
}
void q4_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
               int64_t n_out, int64_t n_in) {
  gemm(kQ4_K, "_gemm", Y, w, X, T, n_out, n_in);
}
void q4_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
             int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) {
  dx(kQ4_K, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
}
void q6_k_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
               int64_t n_in) {
  gemm(kQ6_K, "_gemv", y, w, x, 1, n_out, n_in);
}
void q6_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
               int64_t n_out, int64_t n_in) {
  gemm(kQ6_K, "_gemm", Y, w, X, T, n_out, n_in);
}
void q6_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
             int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) {
  dx(kQ6_K, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
}

}  // namespace q4t::cpu
