// CPU kernels of the frozen linears (Q4_0, Q8_0, Q4_K, Q6_K, F16 weights) and the f32 GEMMs LoRA needs. Same contracts as
// the Vulkan kernels (kernels/vulkan/linear_kernels.h). Shapes: T tokens, W[n_out, n_in] as raw GGML bytes
// (Q4_0 or Q8_0 blocks, or halves), rows contiguous.
// Every function checks shapes and span sizes and throws q4t::ShapeError on a mismatch.
#pragma once
#include <cstdint>
#include <span>

namespace q4t::cpu {

// y[n_out] = W · x[n_in]
void q4_0_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
               int64_t n_in);
// Y[T, n_out] = X[T, n_in] · Wᵀ   (T = 1 is the GEMV)
void q4_0_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
               int64_t n_out, int64_t n_in);
// dX[T, n_in] (+)= dY[T, n_out][:, j_start:j_end] · W[j_start:j_end, :]
// accumulate = false overwrites dX, true adds into it (vocab-tiled backward).
void q4_0_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
             int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate);

// The same three for a Q8_0 weight (n_in a multiple of 32).
void q8_0_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
               int64_t n_in);
void q8_0_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
               int64_t n_out, int64_t n_in);
void q8_0_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
             int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate);

// The same three for an F16 weight (rows of n_in halves, any n_in).
void f16_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
              int64_t n_in);
void f16_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
              int64_t n_out, int64_t n_in);
void f16_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
            int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate);

// The same three for a Q4_K and a Q6_K weight (n_in a multiple of 256; kernels/quant/k_quants.h).
void q4_k_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
               int64_t n_in);
void q4_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
               int64_t n_out, int64_t n_in);
void q4_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
             int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate);
void q6_k_gemv(std::span<float> y, std::span<const uint8_t> w, std::span<const float> x, int64_t n_out,
               int64_t n_in);
void q6_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
               int64_t n_out, int64_t n_in);
void q6_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
             int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate);

// f32 GEMMs, row-major, C (+)= alpha · op(A) · op(B):
// C[M, N] (+)= A[M, K] · B[N, K]ᵀ      (h = x·Aᵀ)
void gemm_nt(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
             int64_t K, bool accumulate, float alpha = 1);
// C[M, N] (+)= A[M, K] · B[K, N]       (dx = dh·A)
void gemm_nn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
             int64_t K, bool accumulate, float alpha = 1);
// C[M, N] (+)= A[K, M]ᵀ · B[K, N]      (dA = dhᵀ·x)
void gemm_tn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
             int64_t K, bool accumulate, float alpha = 1);

}  // namespace q4t::cpu
