#include "kernels/formats.h"

#include <stdexcept>
#include <string>

namespace q4t {

const FormatTraits& format_traits(Format f) {
  static const FormatTraits q4_0{.name = "q4_0", .block_elems = 32, .block_bytes = 18};
  static const FormatTraits q8_0{.name = "q8_0", .block_elems = 32, .block_bytes = 34};
  static const FormatTraits f16{.name = "f16", .block_elems = 1, .block_bytes = 2};
  static const FormatTraits q4_k{.name = "q4_k", .block_elems = 256, .block_bytes = 144};
  static const FormatTraits q6_k{.name = "q6_k", .block_elems = 256, .block_bytes = 210};
  switch (f) {
    case Format::Q4_0: return q4_0;
    case Format::Q8_0: return q8_0;
    case Format::F16: return f16;
    case Format::Q4_K: return q4_k;
    case Format::Q6_K: return q6_k;
  }
  throw std::invalid_argument("format code " + std::to_string(uint32_t(f)) + " names no format");
}

}  // namespace q4t
