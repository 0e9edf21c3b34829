#include "kernels/formats.h"

#include <stdexcept>
#include <string>

#include "kernels/shapes.h"

namespace q4t {

const FormatTraits& format_traits(Format f) {
  static const FormatTraits q4_0{"q4_0", kQ4_0BlockElems, q4_0_row_bytes};
  static const FormatTraits q8_0{"q8_0", kQ8_0BlockElems, q8_0_row_bytes};
  static const FormatTraits f16{"f16", 1, f16_row_bytes};
  static const FormatTraits q4_k{"q4_k", kQK_KBlockElems, q4_k_row_bytes};
  static const FormatTraits q6_k{"q6_k", kQK_KBlockElems, q6_k_row_bytes};
  switch (f) {
    case Format::Q4_0: return q4_0;
    case Format::Q8_0: return q8_0;
    case Format::F16: return f16;
    case Format::Q4_K: return q4_k;
    case Format::Q6_K: return q6_k;
  }
  throw std::invalid_argument("format code " + std::to_string(uint32_t(f)) + " names no format");
}

int64_t device_weight_bytes(Format f, int64_t n_rows, int64_t n_in) {
  if (f == Format::Q6_K) return q6_k_device_bytes(n_rows, n_in);
  return n_rows * format_traits(f).row_bytes(n_in);
}

}  // namespace q4t
