// Shape and size checks shared by the CPU and Vulkan kernels, so every path rejects bad input with the
// same message.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace q4t {

// ceil(a / b) for a >= 0 and b > 0: how many blocks, tiles or workgroups of b cover a. Loop bounds take it as
// int64_t; Vulkan workgroup counts as ceil_div<uint32_t>.
template <class Int = int64_t>
constexpr Int ceil_div(int64_t a, int64_t b) {
  return Int((a + b - 1) / b);
}

// Thrown for shapes a kernel cannot run (n_in not a multiple of 32, empty dims) and mismatched buffer sizes.
struct ShapeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Q4_0: 32 weights per block, 18 bytes per block (f16 d; u8 qs[16]).
inline constexpr int64_t kQ4_0BlockElems = 32;
inline constexpr int64_t kQ4_0BlockBytes = 18;

// Q8_0: 32 weights per block, 34 bytes per block (f16 d; i8 qs[32]).
inline constexpr int64_t kQ8_0BlockElems = 32;
inline constexpr int64_t kQ8_0BlockBytes = 34;

// Q4_K and Q6_K: 256 weights per super-block, 144 and 210 bytes (kernels/quant/k_quants.h).
inline constexpr int64_t kQK_KBlockElems = 256;
inline constexpr int64_t kQ4_KBlockBytes = 144;
inline constexpr int64_t kQ6_KBlockBytes = 210;

// Q6_K on a Vulkan device (kernels/glsl/q6_k.glsl): the blocks of a matrix, counted row after row, in groups of
// 8 blocks (1680 bytes): the first 208 bytes of each block (ql, qh, scales), then the 8 blocks' f16 d's. A last
// group that the matrix does not fill is completed with zero blocks. Every 8-byte piece of a block then lies on
// an 8-byte boundary (GGML's 210-byte blocks start on 2-byte ones), in as many bytes as GGML's rounded up to 8
// blocks. kernels/quant/k_quants.h converts.
inline constexpr int64_t kQ6_KGroupBlocks = 8;
inline int64_t q6_k_device_bytes(int64_t n_out, int64_t n_in) {
  const int64_t blocks = n_out * (n_in / kQK_KBlockElems);
  return (blocks + kQ6_KGroupBlocks - 1) / kQ6_KGroupBlocks * kQ6_KGroupBlocks * kQ6_KBlockBytes;
}

// Checks 0 <= j_start < j_end <= n_out for the dx output-row range.
void check_j_range(const char* kernel, int64_t j_start, int64_t j_end, int64_t n_out);
// Checks M, N, K > 0 for an f32 GEMM.
void check_gemm(const char* kernel, int64_t M, int64_t N, int64_t K);
// Checks a buffer holds exactly `want` bytes (or elements): "<kernel>: <what> has 10 bytes, expected 12".
void check_size(const char* kernel, const char* what, size_t have, size_t want, const char* unit = "bytes");
// Like check_size but a larger buffer is accepted (device buffers are often reused for smaller shapes).
void check_min_size(const char* kernel, const char* what, size_t have, size_t want, const char* unit = "bytes");

// The other GGML block formats with a codec in kernels/quant (legacy_quants.h, k_quants.h, iq4.h): bytes per
// block. Q4_1, Q5_0, Q5_1 and IQ4_NL hold 32 weights a block; Q2_K, Q3_K, Q5_K and IQ4_XS 256 (kQK_KBlockElems).
inline constexpr int64_t kQ4_1BlockBytes = 20;
inline constexpr int64_t kQ5_0BlockBytes = 22;
inline constexpr int64_t kQ5_1BlockBytes = 24;
inline constexpr int64_t kQ2_KBlockBytes = 84;
inline constexpr int64_t kQ3_KBlockBytes = 110;
inline constexpr int64_t kQ5_KBlockBytes = 176;
inline constexpr int64_t kIQ4_NLBlockBytes = 18;
inline constexpr int64_t kIQ4_XSBlockBytes = 136;

}  // namespace q4t
