#version 450
// dX[T, n_in] (+)= dY[T, j_start:j_end] · W[j_start:j_end, :] for T tokens: the tiled GEMM with B = W decoded
// from Q4_0 blocks into shared memory (M = T, N = n_in, K = output rows j in [k_begin, k_end)).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#define GEMM_BK 16u  // K steps of 16 rows (gemm_tiled.glsl)
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define Q4_0_WORDS w
#include "q4_0.glsl"

// BK rows x BN/32 blocks = 4 BK BN/32 quarters, spread over the 256 invocations.
void load_tile_b(uint n0, uint k0) {
  const uint blocks_per_row = BN / 32u;
  const uint n_blocks = p.N / 32u;
  for (uint t = gl_LocalInvocationID.x; t < 4u * BK * blocks_per_row; t += 256u) {
    const uint bi = t / 4u, q = t % 4u;
    const uint kr = bi / blocks_per_row, bc = bi % blocks_per_row;
    const uint blk = n0 / 32u + bc;
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    if (k0 + kr < p.k_end && blk < n_blocks) {
      const uint bb = (k0 + kr) * n_blocks * Q4_0_BLOCK_BYTES + blk * Q4_0_BLOCK_BYTES;
      const float d = q4_0_scale(bb);
      const uint qs = q4_0_quarter(bb, q);
      lo = d * q4_0_low(qs);
      hi = d * q4_0_high(qs);
    }
    for (uint i = 0u; i < 4u; ++i) {
      Bs[kr * BN + bc * 32u + 4u * q + i] = lo[i];
      Bs[kr * BN + bc * 32u + 16u + 4u * q + i] = hi[i];
    }
  }
}
