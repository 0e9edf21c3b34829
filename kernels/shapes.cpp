#include "kernels/shapes.h"

namespace q4t {

namespace {
[[noreturn]] void fail(const char* kernel, const std::string& msg) {
  throw ShapeError(std::string(kernel) + ": " + msg);
}

// The checks every frozen linear shares; `block` > 1 names the block format n_in must be a multiple of.
void check_frozen_linear(const char* kernel, int64_t n_out, int64_t n_in, int64_t T, int64_t block,
                         const char* format, int64_t row_bytes) {
  if (n_out <= 0) fail(kernel, "n_out = " + std::to_string(n_out) + " must be positive");
  if (n_in <= 0) fail(kernel, "n_in = " + std::to_string(n_in) + " must be positive");
  if (n_in % block != 0)
    fail(kernel, "n_in = " + std::to_string(n_in) + " is not a multiple of " + std::to_string(block) + " (the " +
                     format + " block size)");
  if (T <= 0) fail(kernel, "T = " + std::to_string(T) + " must be positive");
  // Offsets inside the shaders are 32-bit byte addresses.
  if (n_out * row_bytes > (int64_t(1) << 32) - 64)
    fail(kernel, "weight of " + std::to_string(n_out) + "x" + std::to_string(n_in) + " exceeds 4 GiB");
}

}  // namespace

void check_q4_0_linear(const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  check_frozen_linear(kernel, n_out, n_in, T, kQ4_0BlockElems, "Q4_0", q4_0_row_bytes(n_in));
}

void check_q8_0_linear(const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  check_frozen_linear(kernel, n_out, n_in, T, kQ8_0BlockElems, "Q8_0", q8_0_row_bytes(n_in));
}

void check_q4_k_linear(const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  check_frozen_linear(kernel, n_out, n_in, T, kQK_KBlockElems, "Q4_K", q4_k_row_bytes(n_in));
}

void check_q6_k_linear(const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  check_frozen_linear(kernel, n_out, n_in, T, kQK_KBlockElems, "Q6_K", q6_k_row_bytes(n_in));
}

void check_f16_linear(const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  check_frozen_linear(kernel, n_out, n_in, T, 1, "F16", f16_row_bytes(n_in));
}

void check_f16_pairs(const char* kernel, int64_t n_in) {
  if (n_in % 2 != 0)
    fail(kernel, "n_in = " + std::to_string(n_in) +
                     " is odd; the Vulkan F16 kernels read weights in pairs (32-bit words) and need an even n_in");
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
