// CPU frozen Q8_0 linear: checks shapes and spans, then runs the shared frozen-linear driver with the Q8_0
// loops (kernels/cpu/frozen_linear.h). W is never decoded as a whole.
#include "kernels/cpu/frozen_linear.h"
#include "kernels/cpu/linear.h"
#include "kernels/shapes.h"

namespace q4t::cpu {

namespace {
void check_linear(const char* kernel, size_t w_bytes, int64_t n_out, int64_t n_in, int64_t T) {
  check_q8_0_linear(kernel, n_out, n_in, T);
  check_size(kernel, "w", w_bytes, size_t(n_out * q8_0_row_bytes(n_in)));
}
}  // namespace

void q8_0_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
               int64_t n_in) {
  check_linear("q8_0_gemv", w.size(), n_out, n_in, 1);
  check_size("q8_0_gemv", "y", y.size(), size_t(n_out), "floats");
  check_size("q8_0_gemv", "x", x.size(), size_t(n_in), "floats");
  detail::frozen_gemm(detail::q8_0_row_kernels(), y.data(), w.data(), x.data(), 1, n_out, n_in);
}

void q8_0_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
               int64_t n_out, int64_t n_in) {
  check_linear("q8_0_gemm", w.size(), n_out, n_in, T);
  check_size("q8_0_gemm", "Y", Y.size(), size_t(T * n_out), "floats");
  check_size("q8_0_gemm", "X", X.size(), size_t(T * n_in), "floats");
  detail::frozen_gemm(detail::q8_0_row_kernels(), Y.data(), w.data(), X.data(), T, n_out, n_in);
}

void q8_0_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
             int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) {
  check_linear("q8_0_dx", w.size(), n_out, n_in, T);
  check_j_range("q8_0_dx", j_start, j_end, n_out);
  check_size("q8_0_dx", "dX", dX.size(), size_t(T * n_in), "floats");
  check_size("q8_0_dx", "dY", dY.size(), size_t(T * n_out), "floats");
  detail::frozen_dx(detail::q8_0_row_kernels(), dX.data(), w.data(), dY.data(), T, n_out, n_in, j_start, j_end,
                    accumulate);
}

}  // namespace q4t::cpu
