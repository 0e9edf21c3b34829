// The CPU frozen linears of every format: check shapes and spans against the format's row of kernels/formats.h,
// then run its loops through the shared driver (or Q4_0's own).
#include <string>

#include "kernels/cpu/frozen_linear.h"
#include "kernels/cpu/int_rows.h"
#include "kernels/cpu/linear.h"
#include "kernels/shapes.h"

namespace q4t::cpu {

namespace {
void check_w(Format f, const std::string& k, size_t w_bytes, int64_t n_out, int64_t n_in, int64_t T) {
  check_frozen_linear(f, k.c_str(), n_out, n_in, T);
  check_size(k.c_str(), "w", w_bytes, size_t(n_out * row_bytes(f, n_in)));
}
}  // namespace

void frozen_gemm(Format f, std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
                 int64_t n_out, int64_t n_in, Precision precision) {
  const std::string k = std::string(format_name(f)) + (T == 1 ? "_gemv" : "_gemm");
  check_w(f, k, w.size(), n_out, n_in, T);
  check_size(k.c_str(), T == 1 ? "y" : "Y", Y.size(), size_t(T * n_out), "floats");
  check_size(k.c_str(), T == 1 ? "x" : "X", X.size(), size_t(T * n_in), "floats");
  const FormatTraits& t = format_traits(f);
  if (precision == Precision::Mixed && T < kMixedTokens && has_mixed(f))
    return detail::int_gemm(*t.cpu_int_rows(), Y.data(), w.data(), X.data(), T, n_out, n_in);
  if (t.cpu_gemm) return t.cpu_gemm(Y.data(), w.data(), X.data(), T, n_out, n_in);
  detail::frozen_gemm(t.cpu_rows(), Y.data(), w.data(), X.data(), T, n_out, n_in);
}

bool has_mixed(Format f) {
  const FormatTraits& t = format_traits(f);
  return t.cpu_int_rows && t.cpu_int_rows();
}

void frozen_dx(Format f, std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
               int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) {
  const std::string k = std::string(format_name(f)) + "_dx";
  check_w(f, k, w.size(), n_out, n_in, T);
  check_j_range(k.c_str(), j_start, j_end, n_out);
  check_size(k.c_str(), "dX", dX.size(), size_t(T * n_in), "floats");
  check_size(k.c_str(), "dY", dY.size(), size_t(T * n_out), "floats");
  const FormatTraits& t = format_traits(f);
  if (t.cpu_dx) return t.cpu_dx(dX.data(), w.data(), dY.data(), T, n_out, n_in, j_start, j_end, accumulate);
  detail::frozen_dx(t.cpu_rows(), dX.data(), w.data(), dY.data(), T, n_out, n_in, j_start, j_end, accumulate);
}

}  // namespace q4t::cpu
