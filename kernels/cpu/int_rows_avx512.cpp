// The AVX-512 build (32 vector registers, vpdpbusd) of int_rows.h's loops (int_rows_skeleton.h). Compiled for every x86 build through target
// attributes and only called when the CPU has the instruction set (int_rows.cpp).
#if defined(__x86_64__) || defined(__i386__)
#include "kernels/cpu/frozen_rows_x86.h"

#define Q4T_INT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define Q4T_INT_VNNI 1
#define Q4T_INT_NAME "avx512_int"
#define Q4T_INT_SET avx512_int_rows
#include "kernels/cpu/int_rows_skeleton.h"
#endif
