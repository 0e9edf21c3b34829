#version 450
// Y[T, n_out] = X[T, n_in] · Wᵀ for T tokens: the tiled GEMM with B = Wᵀ decoded from Q4_0 blocks into shared
// memory tile by tile (M = T, N = n_out, K = n_in; BK = 32 is exactly one block per row).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define Q4_0_WORDS w
#include "q4_0.glsl"

// BN rows x one block = 4 BN quarters, spread over the 256 invocations.
void load_tile_b(uint n0, uint k0) {
  for (uint t = gl_LocalInvocationID.x; t < 4u * BN; t += 256u) {
    const uint r = t / 4u, q = t % 4u;
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    if (n0 + r < p.N) {
      const uint bb = (n0 + r) * (p.k_end / 32u) * Q4_0_BLOCK_BYTES + (k0 / 32u) * Q4_0_BLOCK_BYTES;
      const float d = q4_0_scale(bb);
      const uint qs = q4_0_quarter(bb, q);
      lo = d * q4_0_low(qs);
      hi = d * q4_0_high(qs);
    }
    for (uint i = 0u; i < 4u; ++i) {
      Bs[(4u * q + i) * BN + r] = lo[i];
      Bs[(16u + 4u * q + i) * BN + r] = hi[i];
    }
  }
}
