// The frozen weight formats, one table row each (kernels/formats.cpp): block geometry, the codec, the CPU row
// kernels and the Vulkan shaders. Every layer reads this table; nothing else lists the formats. The codes are
// GGML's type numbers, shared with the shaders through kernels/glsl/formats.glsl.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/glsl/formats.glsl"

namespace q4t {

namespace cpu::detail {
struct FrozenRowKernels;
struct IntRowKernels;
}

enum class Format : uint32_t {
  F16 = FORMAT_F16,
  Q4_0 = FORMAT_Q4_0,
  Q4_1 = FORMAT_Q4_1,
  Q5_0 = FORMAT_Q5_0,
  Q5_1 = FORMAT_Q5_1,
  Q8_0 = FORMAT_Q8_0,
  Q2_K = FORMAT_Q2_K,
  Q3_K = FORMAT_Q3_K,
  Q4_K = FORMAT_Q4_K,
  Q5_K = FORMAT_Q5_K,
  Q6_K = FORMAT_Q6_K,
  IQ4_NL = FORMAT_IQ4_NL,
  IQ4_XS = FORMAT_IQ4_XS,
  BF16 = FORMAT_BF16,
};

// The Vulkan kernels of a format (shader names; kernels/vulkan/linear_kernels.cpp runs them). A format with its
// own tuned shaders names them; the others take the unit kernels (unit_*.comp over its unit_<name>.glsl).
struct GpuKernels {
  const char* gemv = nullptr;      // one token: y = W·x; null: unit_gemv_<name>
  uint32_t gemv_workgroup = 64;    // invocations per workgroup
  uint32_t gemv_rows = 8;          // rows per workgroup
  const char* gemv_dot = nullptr;  // the GEMV on 8-bit integer dot products (x_limbs.comp), if any
  uint32_t gemv_dot_layout = 0;    // its limbs' layout
  uint32_t gemv_dot_rows = 2;      // its rows per workgroup (docs/kernels.md, "Integer-dot GEMVs")
  const char* gemm = nullptr;      // T > 1 in f32: W tiles decoded into shared memory; null: unit_gemm_<name>
  const char* dx_gemm = nullptr;   // the dx of T > 1; null: unit_dx_gemm_<name>
  const char* dx_split = nullptr;  // the one-token dx's first pass; null: unit_dx_split_<name>
  int64_t dx_cols = 1024;          // dx columns per workgroup of that pass
  uint32_t dx_row_slots = 8;       // its row slots (specialization constant 0)
  uint32_t dx_rows_in_flight = 0;  // its rows in flight (constant 1; 0: the shader has none)
  // The same pass for devices with f16 arithmetic (codes through f16 pairs; IQ4_NL's: a shared level table), with
  // the same dx_cols and constants.
  const char* dx_split_f16 = nullptr;
  int64_t dx_split_f16_n_in = 1;       // ... for rows of a multiple of this many weights
  // Tensor-core GEMM and dx at f32-level numerics (f16 hi + lo parts), if the format has them.
  const char* coop_gemm = nullptr;
  const char* coop_dx = nullptr;
};

// How llama.cpp's CPU matmuls round the activations a matrix of the format multiplies (GGML's vec_dot_type):
// Q8_0 blocks of 32 (Q8_1 rounds the values alike), Q8_K blocks of 256, or not reproduced (the 16-bit floats).
enum class ActRound { None, Q8_0, Q8_K };

struct FormatTraits {
  Format format;
  const char* name;     // GGUF's type name in lower case ("q4_k"); the suffix of the kernels' names
  int64_t block_elems;  // weights per block (a row is whole blocks)
  int64_t block_bytes;
  // Rows of n weights (n a multiple of block_elems) as GGML's bytes: llama.cpp's reference quantizer (no
  // importance matrix); GGML's float dequantisation, bit for bit; and the exact values in double.
  void (*quantize_row)(uint8_t* out, const float* x, int64_t n);
  void (*dequantize_row)(float* y, const uint8_t* x, int64_t n);
  void (*dequantize_row_f64)(double* y, const uint8_t* x, int64_t n);
  ActRound llama_cpp_act_round = ActRound::None;
  // The CPU row loops (kernels/cpu/frozen_rows.h) that the shared driver (frozen_linear.cpp) tiles and threads; or
  // a driver of the format's own (Q4_0: its kernel sets of kernels/cpu/q4_0_rows.h), Y = X·Wᵀ and dX (+)= dY·W.
  const cpu::detail::FrozenRowKernels& (*cpu_rows)() = nullptr;
  void (*cpu_gemm)(float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) = nullptr;
  void (*cpu_dx)(float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out, int64_t n_in,
                 int64_t j_start, int64_t j_end, bool accumulate) = nullptr;
  // The CPU's mixed precision loops (kernels/cpu/int_rows.h: the activation rounded as llama_cpp_act_round says,
  // integer dot products); null for the float formats. The function returns null where the CPU has none.
  const cpu::detail::IntRowKernels* (*cpu_int_rows)() = nullptr;
  // The Vulkan kernels need n_in a multiple of this (whole units of 32 weights; F16: pairs).
  int64_t gpu_n_in_multiple = 32;
  // Whether a Vulkan device holds W in the grouped layout of kernels/shapes.h (Q6_K) rather than GGML's bytes.
  bool grouped = false;
  GpuKernels gpu;
};

// Every row, in code order.
std::span<const FormatTraits> format_table();
std::vector<Format> all_formats();
const FormatTraits& format_traits(Format f);
// The row of a GGML type number or of a name ("q5_k", any case); null for none.
const FormatTraits* find_format(uint32_t ggml_type);
const FormatTraits* find_format(std::string_view name);
inline const char* format_name(Format f) { return format_traits(f).name; }
// The names of every format, comma-separated ("f16, q4_0, ..."), for help texts and errors.
std::string format_list();

// Bytes of a row of n_in weights as GGML stores it (n_in a multiple of the block).
int64_t row_bytes(Format f, int64_t n_in);
// The bytes of n_rows rows of W as a Vulkan device holds them.
int64_t device_weight_bytes(Format f, int64_t n_rows, int64_t n_in);
// GGML's bytes of a whole matrix in the device's layout, and back (the first n_blocks blocks).
std::vector<uint8_t> to_device_layout(Format f, std::span<const uint8_t> bytes);
std::vector<uint8_t> from_device_layout(Format f, std::span<const uint8_t> device, int64_t n_blocks);

// Checks a frozen linear W[n_out, n_in] in format f applied to T tokens (ShapeError naming `kernel`); the GPU
// check adds the Vulkan kernels' n_in multiple.
void check_frozen_linear(Format f, const char* kernel, int64_t n_out, int64_t n_in, int64_t T);
void check_gpu_frozen_linear(Format f, const char* kernel, int64_t n_out, int64_t n_in, int64_t T);

// W[n_out, n_in] (row-major f32) quantized row by row, and back.
std::vector<uint8_t> quantize_matrix(Format f, std::span<const float> w, int64_t n_out, int64_t n_in);
std::vector<float> dequantize_matrix(Format f, std::span<const uint8_t> bytes, int64_t n_out, int64_t n_in);

}  // namespace q4t
