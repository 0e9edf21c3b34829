// The formats with integer loops, and the x86 builds of int_rows.h's loops (int_rows_skeleton.h): the AVX2 set and
// the AVX-512 set (AVX-512 BW, VL and VNNI). Internal to kernels/cpu.
#pragma once
#include "kernels/cpu/int_rows.h"

// Every format but the float ones.
#define Q4T_INT_FORMATS(X) \
  X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(IQ4_NL) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_XS)

#if defined(__x86_64__) || defined(__i386__)
namespace q4t::cpu::detail {

template <Format F>
const IntRowKernels* avx2_int_rows();
template <Format F>
const IntRowKernels* avx512_int_rows();
// Whether this CPU runs the AVX-512 set (AVX-512 F, BW, VL and VNNI).
bool avx512_int_supported();

}  // namespace q4t::cpu::detail
#endif
