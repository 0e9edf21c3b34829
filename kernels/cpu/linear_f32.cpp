// f32 GEMMs for the LoRA matrices, row-major, through Eigen. Eigen is built without OpenMP, so the threads
// come from parallel_for: each takes a range of rows of C, which no other thread touches.
#include <Eigen/Core>
#include <algorithm>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/threads.h"
#include "kernels/shapes.h"

namespace q4t::cpu {

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstView = Eigen::Map<const RowMajor>;
using View = Eigen::Map<RowMajor>;

void check_f32_gemm(const char* kernel, size_t c, size_t a, size_t b, int64_t M, int64_t N, int64_t K) {
  check_gemm(kernel, M, N, K);
  check_size(kernel, "C", c, size_t(M * N), "floats");
  check_size(kernel, "A", a, size_t(M * K), "floats");
  check_size(kernel, "B", b, size_t(K * N), "floats");
}

// Rows of C per chunk: enough work (>= ~64K multiply-adds) that a chunk outweighs waking a thread.
int64_t row_grain(int64_t N, int64_t K) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N * K)); }

template <typename Product>
void store(View C, const Product& p, bool accumulate) {
  if (accumulate)
    C.noalias() += p;
  else
    C.noalias() = p;
}

}  // namespace

void gemm_nt(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
             int64_t K, bool accumulate, float alpha) {
  check_f32_gemm("gemm_nt", C.size(), A.size(), B.size(), M, N, K);
  const ConstView Bm(B.data(), N, K);
  parallel_for(M, row_grain(N, K), [&](int64_t m0, int64_t m1) {
    const ConstView Am(A.data() + m0 * K, m1 - m0, K);
    store(View(C.data() + m0 * N, m1 - m0, N), alpha * (Am * Bm.transpose()), accumulate);
  });
}

void gemm_nn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
             int64_t K, bool accumulate, float alpha) {
  check_f32_gemm("gemm_nn", C.size(), A.size(), B.size(), M, N, K);
  const ConstView Bm(B.data(), K, N);
  parallel_for(M, row_grain(N, K), [&](int64_t m0, int64_t m1) {
    const ConstView Am(A.data() + m0 * K, m1 - m0, K);
    store(View(C.data() + m0 * N, m1 - m0, N), alpha * (Am * Bm), accumulate);
  });
}

// A is [K, M]: rows m0..m1 of C are columns m0..m1 of A.
void gemm_tn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
             int64_t K, bool accumulate, float alpha) {
  check_f32_gemm("gemm_tn", C.size(), A.size(), B.size(), M, N, K);
  const ConstView Am(A.data(), K, M);
  const ConstView Bm(B.data(), K, N);
  parallel_for(M, row_grain(N, K), [&](int64_t m0, int64_t m1) {
    store(View(C.data() + m0 * N, m1 - m0, N), alpha * (Am.middleCols(m0, m1 - m0).transpose() * Bm), accumulate);
  });
}

}  // namespace q4t::cpu
