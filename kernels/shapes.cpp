#include "kernels/shapes.h"

namespace q4t {

namespace {
[[noreturn]] void fail(const char* kernel, const std::string& msg) {
  throw ShapeError(std::string(kernel) + ": " + msg);
}
}  // namespace

void check_q4_0_linear(const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  if (n_out <= 0) fail(kernel, "n_out = " + std::to_string(n_out) + " must be positive");
  if (n_in <= 0) fail(kernel, "n_in = " + std::to_string(n_in) + " must be positive");
  if (n_in % kQ4_0BlockElems != 0)
    fail(kernel, "n_in = " + std::to_string(n_in) + " is not a multiple of 32 (the Q4_0 block size)");
  if (T <= 0) fail(kernel, "T = " + std::to_string(T) + " must be positive");
  // Offsets inside the shaders are 32-bit byte addresses.
  if (n_out * q4_0_row_bytes(n_in) > (int64_t(1) << 32) - 64)
    fail(kernel, "weight of " + std::to_string(n_out) + "x" + std::to_string(n_in) + " exceeds 4 GiB");
}

void check_j_range(const char* kernel, int64_t j_start, int64_t j_end, int64_t n_out) {
  if (j_start < 0 || j_end > n_out || j_start >= j_end)
    fail(kernel, "row range [" + std::to_string(j_start) + ", " + std::to_string(j_end) +
                     ") is empty or outside [0, " + std::to_string(n_out) + ")");
}

void check_gemm(const char* kernel, int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0)
    fail(kernel, "dims M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                     " must all be positive");
}

void check_size(const char* kernel, const char* what, size_t have, size_t want, const char* unit) {
  if (have != want)
    fail(kernel, std::string(what) + " has " + std::to_string(have) + " " + unit + ", expected " +
                     std::to_string(want));
}

void check_min_size(const char* kernel, const char* what, size_t have, size_t want, const char* unit) {
  if (have < want)
    fail(kernel, std::string(what) + " has " + std::to_string(have) + " " + unit + ", needs at least " +
                     std::to_string(want));
}

}  // namespace q4t
