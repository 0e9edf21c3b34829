// The inner loops of the CPU Q4_0 linear, one set per instruction set, chosen once at startup from what the
// CPU supports (linear_q4_0.cpp tiles and threads them). Weights are raw GGML Q4_0 bytes with no alignment
// assumed; a row of n_in weights is nb = n_in/32 blocks of 18 bytes, rows row_bytes apart.
#pragma once
#include <cstdint>

namespace q4t::cpu::detail {

enum class Isa { Portable, Avx2, Avx512 };

struct Q4_0Kernels {
  Isa isa;
  const char* name;
  // y[r] = W[r, :] · x for r in [0, n_rows); w points at row 0, x is [nb*32]. Activations stay f32.
  void (*dot_rows)(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows, int64_t nb);
  // y[nb*32] = nb blocks dequantised, block i at w + i*stride (stride = 18 walks a row, row_bytes a column).
  // Exact: (q - 8) * d has no rounding.
  void (*dequant)(float* y, const uint8_t* w, int64_t nb, int64_t stride);
  // dx[nb*32] += sum_r s[r] * W[r, :] over n_rows rows of nb blocks each, starting at w (T = 1 backward).
  void (*axpy_rows)(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows, int64_t nb);
  // The T > 1 products, on one packed panel: C[M, :n] (+)= A[M, K] · P[K, :n], n <= kPanelCols. A comes
  // packed by pack_panel_tokens in tiles of panel_tokens rows; P is [K][kPanelCols]. Null in the portable
  // set, which multiplies dequantised tiles with Eigen instead (vectorised for whatever the build targets).
  void (*panel_gemm)(float* C, int64_t ldc, const float* A_packed, const float* P, int64_t M, int64_t n,
                     int64_t K, bool accumulate);
  int64_t panel_tokens;  // rows of A per register tile of panel_gemm
};

inline constexpr int64_t kPanelCols = 32;

// A[M, K] (row stride lda) -> ceil(M/mr) tiles of [K][mr], zero-padded past row M: each k of a tile is mr
// consecutive floats, ready to broadcast.
void pack_panel_tokens(float* packed, const float* A, int64_t lda, int64_t M, int64_t K, int64_t mr);

// GEMV helper shared by the SIMD kernel sets: x rearranged once per call so that each (row, block) costs
// one byte expansion, one low-nibble lookup, one int->float conversion and three FMAs. In lane j of block b,
// with x = x[32b + j], y = x[32b + 16 + j], L = the low nibble and V = the whole byte (= L + 16H) of qs[j]:
//   (L - 8)x + (H - 8)y = L(x - y/16) + V(y/16) - 8(x + y)
// Stored per block as kXTermFloats floats: a[16] = x - y/16, b[16] = y/16, c[16] = -8(x + y).
inline constexpr int64_t kXTermFloats = 48;
void prepare_x_terms(float* t, const float* x, int64_t nb);
// A 64-byte aligned per-thread buffer of n floats, kept between calls.
float* thread_scratch(int64_t n);

// The kernel set for isa, or nullptr when this CPU (or this build's target) cannot run it.
const Q4_0Kernels* q4_0_kernels_for(Isa isa);
// The set the CPU kernels use: the best supported one unless use_q4_0_kernels picked another.
const Q4_0Kernels& q4_0_kernels();
// Forces a kernel set (tests compare every set against the reference; benches compare them).
// Throws std::invalid_argument when the CPU cannot run it.
void use_q4_0_kernels(Isa isa);

#if defined(__x86_64__) || defined(__i386__)
extern const Q4_0Kernels kQ4_0Avx2;
extern const Q4_0Kernels kQ4_0Avx512;
#endif

}  // namespace q4t::cpu::detail
