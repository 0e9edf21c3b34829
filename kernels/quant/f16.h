// IEEE half <-> float, round-to-nearest-even (what F16C and GGML's tables produce).
#pragma once
#include <cstdint>

namespace q4t::quant {
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
}  // namespace q4t::quant
