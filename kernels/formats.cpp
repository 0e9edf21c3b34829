#include "kernels/formats.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "kernels/cpu/frozen_linear.h"
#include "kernels/cpu/frozen_rows.h"
#include "kernels/cpu/int_rows.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/iq4.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/legacy_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/shapes.h"

namespace q4t {

namespace {

// A block codec's typed row functions over raw bytes (GGML's blocks are 2-byte aligned structs of bytes and
// halves; rows and buffers start on even addresses).
template <typename Block, void (*Quantize)(Block*, const float*, int64_t)>
void quantize_bytes(uint8_t* out, const float* x, int64_t n) {
  Quantize(reinterpret_cast<Block*>(out), x, n);
}
template <typename Block, void (*Dequantize)(float*, const Block*, int64_t)>
void dequantize_bytes(float* y, const uint8_t* x, int64_t n) {
  Dequantize(y, reinterpret_cast<const Block*>(x), n);
}
template <typename Block, void (*Dequantize)(double*, const Block*, int64_t)>
void dequantize_bytes_f64(double* y, const uint8_t* x, int64_t n) {
  Dequantize(y, reinterpret_cast<const Block*>(x), n);
}

#define Q4T_CODEC(Block, fmt)                                                    \
  quantize_bytes<quant::Block, quant::quantize_row_##fmt>,                       \
      .dequantize_row = dequantize_bytes<quant::Block, quant::dequantize_row_##fmt>, \
      .dequantize_row_f64 = dequantize_bytes_f64<quant::Block, quant::dequantize_row_##fmt>

// The one-token kernels' tuning (16384 x 16384; docs/kernels.md has the measurements): the tuned kernels' GEMV
// workgroups of 128 invocations (256 for Q8_0 and F16), 2 rows each (4 for Q4_K and F16), dx split passes with 8
// row slots (Q2_K and Q3_K 4, IQ4_NL 2) and the rows each invocation keeps loading (16 for Q4_0 and IQ4_NL, 3 or
// 4 for the K-quants); the unit kernels' GEMV 64 invocations with 8 rows (4 for Q3_K; BF16 128 with 2), their dx
// 8 row slots (BF16 4), best on an H200.
constexpr uint32_t kDxSlots = 8;

const FormatTraits kTable[] = {
    {.format = Format::F16, .name = "f16", .block_elems = 1, .block_bytes = 2,
     .quantize_row = quant::f32_row_to_f16, .dequantize_row = quant::f16_row_to_f32,
     .dequantize_row_f64 = quant::f16_row_to_f64, .cpu_rows = cpu::detail::row_kernels<Format::F16>,
     .gpu_n_in_multiple = 2,
     .gpu = {.gemv = "f16_gemv", .gemv_workgroup = 256, .gemv_rows = 4, .gemm = "f16_gemm",
             .dx_gemm = "f16_dx_gemm", .dx_split = "f16_dx_split", .dx_cols = 256, .dx_row_slots = kDxSlots}},
    {.format = Format::Q4_0, .name = "q4_0", .block_elems = 32, .block_bytes = 18,
     .quantize_row = Q4T_CODEC(BlockQ4_0, q4_0),
     .llama_cpp_act_round = ActRound::Q8_0, .cpu_gemm = cpu::detail::q4_0_gemm, .cpu_dx = cpu::detail::q4_0_dx,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q4_0>,
     .gpu = {.gemv = "q4_0_gemv", .gemv_workgroup = 128, .gemv_rows = 2, .gemv_dot = "q4_0_gemv_dot",
             .gemv_dot_layout = 0, .gemm = "q4_0_gemm", .dx_gemm = "q4_0_dx_gemm", .dx_split = "q4_0_dx_split",
             .dx_cols = 512, .dx_row_slots = kDxSlots, .dx_rows_in_flight = 16,
             .dx_split_f16 = "q4_0_dx_split_pairs", .dx_split_f16_n_in = 64, .coop_gemm = "q4_0_gemm_coop",
             .coop_dx = "q4_0_dx_coop"}},
    {.format = Format::Q4_1, .name = "q4_1", .block_elems = 32, .block_bytes = 20,
     .quantize_row = Q4T_CODEC(BlockQ4_1, q4_1),
     .llama_cpp_act_round = ActRound::Q8_0, .cpu_rows = cpu::detail::row_kernels<Format::Q4_1>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q4_1>,
     .gpu = {.gemv_dot = "unit_gemv_dot_q4_1", .gemv_dot_layout = 3}},
    {.format = Format::Q5_0, .name = "q5_0", .block_elems = 32, .block_bytes = 22,
     .quantize_row = Q4T_CODEC(BlockQ5_0, q5_0),
     .llama_cpp_act_round = ActRound::Q8_0, .cpu_rows = cpu::detail::row_kernels<Format::Q5_0>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q5_0>,
     .gpu = {.gemv_dot = "unit_gemv_dot_q5_0", .gemv_dot_layout = 3}},
    {.format = Format::Q5_1, .name = "q5_1", .block_elems = 32, .block_bytes = 24,
     .quantize_row = Q4T_CODEC(BlockQ5_1, q5_1),
     .llama_cpp_act_round = ActRound::Q8_0, .cpu_rows = cpu::detail::row_kernels<Format::Q5_1>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q5_1>,
     .gpu = {.gemv_dot = "unit_gemv_dot_q5_1", .gemv_dot_layout = 3}},
    {.format = Format::Q8_0, .name = "q8_0", .block_elems = 32, .block_bytes = 34,
     .quantize_row = Q4T_CODEC(BlockQ8_0, q8_0),
     .llama_cpp_act_round = ActRound::Q8_0, .cpu_rows = cpu::detail::row_kernels<Format::Q8_0>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q8_0>,
     .gpu = {.gemv = "q8_0_gemv", .gemv_workgroup = 256, .gemv_rows = 2, .gemm = "q8_0_gemm",
             .dx_gemm = "q8_0_dx_gemm", .dx_split = "q8_0_dx_split", .dx_cols = 512, .dx_row_slots = kDxSlots}},
    {.format = Format::Q2_K, .name = "q2_k", .block_elems = 256, .block_bytes = 84,
     .quantize_row = Q4T_CODEC(BlockQ2_K, q2_k),
     .llama_cpp_act_round = ActRound::Q8_K, .cpu_rows = cpu::detail::row_kernels<Format::Q2_K>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q2_K>,
     .gpu = {.gemv_dot = "q2_k_gemv_dot", .gemv_dot_layout = 4, .gemv_dot_rows = 4, .dx_row_slots = 4,
             .dx_rows_in_flight = 4, .dx_split_f16 = "q2_k_dx_split", .dx_split_f16_n_in = 256}},
    {.format = Format::Q3_K, .name = "q3_k", .block_elems = 256, .block_bytes = 110,
     .quantize_row = Q4T_CODEC(BlockQ3_K, q3_k),
     .llama_cpp_act_round = ActRound::Q8_K, .cpu_rows = cpu::detail::row_kernels<Format::Q3_K>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q3_K>,
     .gpu = {.gemv_rows = 4, .gemv_dot = "q3_k_gemv_dot", .gemv_dot_layout = 4, .gemv_dot_rows = 4,
             .dx_row_slots = 4, .dx_rows_in_flight = 4, .dx_split_f16 = "q3_k_dx_split", .dx_split_f16_n_in = 256}},
    {.format = Format::Q4_K, .name = "q4_k", .block_elems = 256, .block_bytes = 144,
     .quantize_row = Q4T_CODEC(BlockQ4_K, q4_k),
     .llama_cpp_act_round = ActRound::Q8_K, .cpu_rows = cpu::detail::row_kernels<Format::Q4_K>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q4_K>,
     .gpu = {.gemv = "q4_k_gemv", .gemv_workgroup = 128, .gemv_rows = 4, .gemv_dot = "q4_k_gemv_dot",
             .gemv_dot_layout = 1, .gemm = "q4_k_gemm", .dx_gemm = "q4_k_dx_gemm", .dx_split = "q4_k_dx_split",
             .dx_cols = 256, .dx_row_slots = kDxSlots, .dx_rows_in_flight = 4, .dx_split_f16 = "q4_k_dx_split_f16",
             .dx_split_f16_n_in = 256}},
    {.format = Format::Q5_K, .name = "q5_k", .block_elems = 256, .block_bytes = 176,
     .quantize_row = Q4T_CODEC(BlockQ5_K, q5_k),
     .llama_cpp_act_round = ActRound::Q8_K, .cpu_rows = cpu::detail::row_kernels<Format::Q5_K>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q5_K>,
     .gpu = {.gemv_dot = "unit_gemv_dot_q5_k", .gemv_dot_layout = 3, .dx_split = "q5_k_dx_split", .dx_cols = 256,
             .dx_row_slots = kDxSlots, .dx_rows_in_flight = 3, .dx_split_f16 = "q5_k_dx_split_f16",
             .dx_split_f16_n_in = 256}},
    {.format = Format::Q6_K, .name = "q6_k", .block_elems = 256, .block_bytes = 210,
     .quantize_row = Q4T_CODEC(BlockQ6_K, q6_k),
     .llama_cpp_act_round = ActRound::Q8_K, .cpu_rows = cpu::detail::row_kernels<Format::Q6_K>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::Q6_K>, .grouped = true,
     .gpu = {.gemv = "q6_k_gemv", .gemv_workgroup = 128, .gemv_rows = 2, .gemv_dot = "q6_k_gemv_dot",
             .gemv_dot_layout = 2, .gemm = "q6_k_gemm", .dx_gemm = "q6_k_dx_gemm", .dx_split = "q6_k_dx_split",
             .dx_cols = 256, .dx_row_slots = kDxSlots, .dx_rows_in_flight = 4}},
    {.format = Format::IQ4_NL, .name = "iq4_nl", .block_elems = 32, .block_bytes = 18,
     .quantize_row = Q4T_CODEC(BlockIQ4_NL, iq4_nl),
     .llama_cpp_act_round = ActRound::Q8_0, .cpu_rows = cpu::detail::row_kernels<Format::IQ4_NL>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::IQ4_NL>,
     .gpu = {.gemv_dot = "unit_gemv_dot_iq4_nl", .gemv_dot_layout = 3, .dx_row_slots = 2,
             .dx_rows_in_flight = 16, .dx_split_f16 = "iq4_nl_dx_split_pairs", .dx_split_f16_n_in = 64}},
    {.format = Format::IQ4_XS, .name = "iq4_xs", .block_elems = 256, .block_bytes = 136,
     .quantize_row = Q4T_CODEC(BlockIQ4_XS, iq4_xs),
     .llama_cpp_act_round = ActRound::Q8_K, .cpu_rows = cpu::detail::row_kernels<Format::IQ4_XS>,
     .cpu_int_rows = cpu::detail::int_row_kernels<Format::IQ4_XS>,
     .gpu = {.gemv_dot = "unit_gemv_dot_iq4_xs", .gemv_dot_layout = 3}},
    {.format = Format::BF16, .name = "bf16", .block_elems = 1, .block_bytes = 2,
     .quantize_row = quant::f32_row_to_bf16, .dequantize_row = quant::bf16_row_to_f32,
     .dequantize_row_f64 = quant::bf16_row_to_f64, .cpu_rows = cpu::detail::row_kernels<Format::BF16>,
     .gpu = {.gemv_workgroup = 128, .gemv_rows = 2, .dx_row_slots = 4}},
};
#undef Q4T_CODEC

[[noreturn]] void fail(const char* kernel, const std::string& msg) { throw ShapeError(std::string(kernel) + ": " + msg); }

}  // namespace

std::span<const FormatTraits> format_table() { return kTable; }

std::vector<Format> all_formats() {
  std::vector<Format> out;
  for (const FormatTraits& t : kTable) out.push_back(t.format);
  return out;
}

const FormatTraits* find_format(uint32_t ggml_type) {
  for (const FormatTraits& t : kTable)
    if (uint32_t(t.format) == ggml_type) return &t;
  return nullptr;
}

const FormatTraits* find_format(std::string_view name) {
  for (const FormatTraits& t : kTable) {
    const std::string_view n = t.name;
    if (n.size() == name.size() &&
        std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) { return a == std::tolower(uint8_t(b)); }))
      return &t;
  }
  return nullptr;
}

std::string format_list() {
  std::string s;
  for (const FormatTraits& t : kTable) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

const FormatTraits& format_traits(Format f) {
  if (const FormatTraits* t = find_format(uint32_t(f))) return *t;
  throw std::invalid_argument("format code " + std::to_string(uint32_t(f)) + " names no format");
}

int64_t row_bytes(Format f, int64_t n_in) {
  const FormatTraits& t = format_traits(f);
  return n_in / t.block_elems * t.block_bytes;
}

int64_t device_weight_bytes(Format f, int64_t n_rows, int64_t n_in) {
  if (format_traits(f).grouped) return q6_k_device_bytes(n_rows, n_in);
  // Rounded up to 16 bytes: the unit kernels read whole words, and the units of 2-byte aligned blocks (Q4_0, Q5_0,
  // Q3_K, IQ4_NL) reach up to 2 bytes past the last block.
  return (n_rows * row_bytes(f, n_in) + 15) / 16 * 16;
}

std::vector<uint8_t> to_device_layout(Format f, std::span<const uint8_t> bytes) {
  if (format_traits(f).grouped) return quant::q6_k_to_device(bytes);
  std::vector<uint8_t> out(bytes.begin(), bytes.end());
  out.resize((out.size() + 15) / 16 * 16, 0);
  return out;
}

std::vector<uint8_t> from_device_layout(Format f, std::span<const uint8_t> device, int64_t n_blocks) {
  const FormatTraits& t = format_traits(f);
  if (t.grouped) return quant::q6_k_from_device(device, n_blocks);
  return {device.begin(), device.begin() + n_blocks * t.block_bytes};
}

void check_frozen_linear(Format f, const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  const FormatTraits& t = format_traits(f);
  if (n_out <= 0) fail(kernel, "n_out = " + std::to_string(n_out) + " must be positive");
  if (n_in <= 0) fail(kernel, "n_in = " + std::to_string(n_in) + " must be positive");
  if (n_in % t.block_elems != 0)
    fail(kernel, "n_in = " + std::to_string(n_in) + " is not a multiple of " + std::to_string(t.block_elems) +
                     " (the " + t.name + " block size)");
  if (T <= 0) fail(kernel, "T = " + std::to_string(T) + " must be positive");
  // Offsets inside the shaders are 32-bit byte addresses.
  if (n_out * row_bytes(f, n_in) > (int64_t(1) << 32) - 64)
    fail(kernel, "weight of " + std::to_string(n_out) + "x" + std::to_string(n_in) + " exceeds 4 GiB");
}

void check_gpu_frozen_linear(Format f, const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  check_frozen_linear(f, kernel, n_out, n_in, T);
  const int64_t m = format_traits(f).gpu_n_in_multiple;
  if (n_in % m != 0)
    fail(kernel, "n_in = " + std::to_string(n_in) + " is not a multiple of " + std::to_string(m) +
                     "; the Vulkan " + format_name(f) + " kernels read rows in whole units of " + std::to_string(m) +
                     " weights");
}

std::vector<uint8_t> quantize_matrix(Format f, std::span<const float> w, int64_t n_out, int64_t n_in) {
  const char* k = "quantize";
  check_frozen_linear(f, k, n_out, n_in, 1);
  check_size(k, "W", w.size(), size_t(n_out * n_in), "floats");
  const FormatTraits& t = format_traits(f);
  const int64_t rb = row_bytes(f, n_in);
  std::vector<uint8_t> out(size_t(n_out * rb));
  for (int64_t r = 0; r < n_out; r++) t.quantize_row(out.data() + r * rb, w.data() + r * n_in, n_in);
  return out;
}

std::vector<float> dequantize_matrix(Format f, std::span<const uint8_t> bytes, int64_t n_out, int64_t n_in) {
  const char* k = "dequantize";
  check_frozen_linear(f, k, n_out, n_in, 1);
  const int64_t rb = row_bytes(f, n_in);
  check_size(k, "W", bytes.size(), size_t(n_out * rb));
  const FormatTraits& t = format_traits(f);
  std::vector<float> out(size_t(n_out * n_in));
  for (int64_t r = 0; r < n_out; r++) t.dequantize_row(out.data() + r * n_in, bytes.data() + r * rb, n_in);
  return out;
}

}  // namespace q4t
