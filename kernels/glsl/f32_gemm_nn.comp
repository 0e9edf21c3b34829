#version 450
// C[M, N] (+)= A[M, K] · B[K, N]  (LoRA: dx = dh·A)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
#include "gemm_push.glsl"
#define GEMM_BK 16u  // K steps of 16 rows (gemm_tiled.glsl)
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#include "gemm_load_b_kn.glsl"
