// The frozen weight formats the kernels read, named once: the C++ side of kernels/glsl/formats.glsl (the same
// codes), with each format's block geometry (the constants of kernels/shapes.h).
#pragma once
#include <cstdint>

namespace q4t {

enum class Format : uint32_t { Q4_0 = 1, Q8_0 = 2, F16 = 3, Q4_K = 4, Q6_K = 5 };

struct FormatTraits {
  const char* name;                     // as in kernel and shader names: "q4_0"
  int64_t block_elems;                  // weights per block (a row is whole blocks)
  int64_t (*row_bytes)(int64_t n_in);   // bytes of a row as GGML stores it
};

const FormatTraits& format_traits(Format f);
inline const char* format_name(Format f) { return format_traits(f).name; }
// The bytes of n_rows rows of W as a Vulkan device holds them: GGML's, but for Q6_K's groups of 8 blocks.
int64_t device_weight_bytes(Format f, int64_t n_rows, int64_t n_in);
// Every format, in code order.
inline constexpr Format kFormats[] = {Format::Q4_0, Format::Q8_0, Format::F16, Format::Q4_K, Format::Q6_K};

}  // namespace q4t
