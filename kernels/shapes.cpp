#include "kernels/shapes.h"

namespace q4t {

namespace {
[[noreturn]] void fail(const char* kernel, const std::string& msg) {
  throw ShapeError(std::string(kernel) + ": " + msg);
}
}  // namespace

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
