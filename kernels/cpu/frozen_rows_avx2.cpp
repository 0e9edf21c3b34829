// The AVX2 build of the row loops (frozen_rows_skeleton.h over the Avx2 layer of frozen_rows_x86.h): 8 f32 lanes.
// Compiled for every x86 build through target attributes and only called when the CPU reports AVX2, FMA and F16C
// (the Q4_0 AVX2 or AVX-512 set is in use).
#if defined(__x86_64__) || defined(__i386__)
#include "kernels/cpu/frozen_rows_x86.h"

#define Q4T_ROWS_TARGET Q4T_AVX2_TARGET
#include "kernels/cpu/frozen_rows_skeleton.h"

namespace q4t::cpu::detail {

namespace {
template <class D>
constexpr FrozenRowKernels kAvx2 = rows::kernels<Avx2, D>("avx2");
}  // namespace

const FrozenRowKernels* avx2_row_kernels(Format f) {
  switch (f) {
    case Format::F16: return &kAvx2<rows::F16>;
    case Format::BF16: return &kAvx2<rows::BF16>;
    case Format::Q8_0: return &kAvx2<rows::Q8_0>;
    case Format::Q4_1: return &kAvx2<rows::Q4_1>;
    case Format::Q5_0: return &kAvx2<rows::Q5_0>;
    case Format::Q5_1: return &kAvx2<rows::Q5_1>;
    case Format::IQ4_NL: return &kAvx2<rows::IQ4_NL>;
    case Format::Q2_K: return &kAvx2<rows::Q2_K>;
    case Format::Q3_K: return &kAvx2<rows::Q3_K>;
    case Format::Q4_K: return &kAvx2<rows::Q4_K>;
    case Format::Q5_K: return &kAvx2<rows::Q5_K>;
    case Format::Q6_K: return &kAvx2<rows::Q6_K>;
    case Format::IQ4_XS: return &kAvx2<rows::IQ4_XS>;
    default: return nullptr;
  }
}

}  // namespace q4t::cpu::detail
#endif
