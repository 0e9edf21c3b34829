// CPU kernels of the frozen linears (every format of kernels/formats.h) and the f32 GEMMs LoRA needs. Same contracts as
// the Vulkan kernels (kernels/vulkan/linear_kernels.h). Shapes: T tokens, W[n_out, n_in] as raw GGML bytes
// (the format's blocks), rows contiguous.
// Every function checks shapes and span sizes and throws q4t::ShapeError on a mismatch.
#pragma once
#include <cstdint>
#include <span>

#include "kernels/formats.h"
#include "kernels/precision.h"

namespace q4t::cpu {

// Y[T, n_out] = X[T, n_in] · Wᵀ, W [n_out, n_in] in format f (T = 1 is the GEMV). Mixed: products of fewer than
// kMixedTokens tokens round each token's activation to 8-bit blocks and multiply in integers (int_rows.h), where
// the format and the CPU have those loops; every other product is f32.
inline constexpr int64_t kMixedTokens = 12;
void frozen_gemm(Format f, std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
                 int64_t n_out, int64_t n_in, Precision precision = Precision::F32);
// Whether the CPU runs format f's products in mixed precision when asked (the format has integer loops and the
// CPU has AVX2).
bool has_mixed(Format f);
// dX[T, n_in] (+)= dY[T, n_out][:, j_start:j_end] · W[j_start:j_end, :]
// accumulate = false overwrites dX, true adds into it (vocab-tiled backward).
void frozen_dx(Format f, std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
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
