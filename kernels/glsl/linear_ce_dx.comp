#version 450
// The vocab-tiled loss's share of dx for one tile: dx[T, C] += dlogits[T, n] · W[row0 : row0 + n, :], W [V, C]
// frozen: f32, or Q4_0 / Q8_0 blocks, halves or Q4_K / Q6_K super-blocks decoded into shared memory. The tiled
// GEMM body of gemm_tiled.glsl with M = T, N = C and K = the n rows of the tile (lda = n, the tile's row stride).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };  // f32 bits, raw blocks, or halves
layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint k_begin;
  uint k_end;
  uint lda;
  uint ldb;  // row stride of an f32 W
  uint accumulate;
  uint row0;
  uint format;  // 0 = f32, 1 = Q4_0, 2 = Q8_0, 3 = f16 (C even), 4 = Q4_K, 5 = Q6_K (C % 256 == 0)
  uint k_slice;  // gemm_tiled.glsl's split of K: always 0 here
} p;
#define GEMM_BK 16u  // K steps of 16 vocabulary rows (gemm_tiled.glsl)
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define Q4_0_WORDS w
#include "q4_0.glsl"
#define Q8_0_WORDS w
#include "q8_0.glsl"
#include "q8_0_tiles.glsl"
#define F16_WORDS w
#include "f16_tiles.glsl"
#define Q4_K_WORDS w
#include "q4_k.glsl"
#include "q4_k_tiles.glsl"
#define Q6_K_WORDS w
#include "q6_k.glsl"
#include "q6_k_tiles.glsl"

// Bs[k * BN + n] = W[row0 + k0 + k, n0 + n]. Q4_0: BK rows x BN/32 blocks = 4 BK BN/32 quarters.
void load_tile_b(uint n0, uint k0) {
  if (p.format == 2u) {
    q8_0_load_w(n0, k0, p.k_end, p.row0, p.N);
    return;
  }
  if (p.format == 3u) {
    f16_load_w(n0, k0, p.k_end, p.row0, p.N);
    return;
  }
  if (p.format == 4u) {
    q4_k_load_w(n0, k0, p.k_end, p.row0, p.N);
    return;
  }
  if (p.format == 5u) {
    q6_k_load_w(n0, k0, p.k_end, p.row0, p.N);
    return;
  }
  if (p.format == 0u) {
    const uint n = gl_LocalInvocationID.x % BN;
    for (uint i = 0u; i < BK * BN / 256u; ++i) {
      const uint k = (gl_LocalInvocationID.x + 256u * i) / BN;
      const bool ok = n0 + n < p.N && k0 + k < p.k_end;
      Bs[k * BN + n] = ok ? uintBitsToFloat(w[(p.row0 + k0 + k) * p.ldb + n0 + n]) : 0.0;
    }
    return;
  }
  const uint blocks_per_tile = BN / 32u, n_blocks = p.N / 32u;
  for (uint t = gl_LocalInvocationID.x; t < 4u * BK * blocks_per_tile; t += 256u) {
    const uint bi = t / 4u, q = t % 4u;
    const uint kr = bi / blocks_per_tile, bc = bi % blocks_per_tile;
    const uint blk = n0 / 32u + bc;
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    if (k0 + kr < p.k_end && blk < n_blocks) {
      const uint bb = ((p.row0 + k0 + kr) * n_blocks + blk) * Q4_0_BLOCK_BYTES;
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
