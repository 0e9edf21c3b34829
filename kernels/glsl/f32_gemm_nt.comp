#version 450
// C[M, N] (+)= A[M, K] · B[N, K]ᵀ  (LoRA: h = x·Aᵀ)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
#include "gemm_push.glsl"
#define GEMM_BK 16u  // K steps of 16 rows (gemm_tiled.glsl)
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"

void load_tile_b(uint n0, uint k0) {
  const uint t = gl_LocalInvocationID.x;
  const uint k = t % BK;
  for (uint i = 0u; i < BK * BN / 256u; ++i) {
    const uint n = t / BK + (256u / BK) * i;
    const bool ok = n0 + n < p.N && k0 + k < p.k_end;
    Bs[k * BN + n] = ok ? b[(n0 + n) * p.ldb + k0 + k] : 0.0;
  }
}
