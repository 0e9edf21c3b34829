#version 450
// C[M, N] (+)= A[K, M]ᵀ · B[K, N]  (LoRA: dA = dhᵀ·x)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
#define A_TRANSPOSED
#include "gemm_push.glsl"
#define GEMM_BK 16u  // K steps of 16 rows (gemm_tiled.glsl)
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#include "gemm_load_b_kn.glsl"
