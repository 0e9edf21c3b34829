// The AVX2 build of int_rows.h's loops (int_rows_skeleton.h). Compiled for every x86 build through target
// attributes and only called when the CPU has the instruction set (int_rows.cpp).
#if defined(__x86_64__) || defined(__i386__)
#include "kernels/cpu/frozen_rows_x86.h"

#define Q4T_INT_TARGET Q4T_AVX2_TARGET
#define Q4T_INT_VNNI 0
#define Q4T_INT_NAME "avx2_int"
#define Q4T_INT_SET avx2_int_rows
#include "kernels/cpu/int_rows_skeleton.h"
#endif
