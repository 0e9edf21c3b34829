#version 450
// One vocabulary tile of the vocab-tiled loss: logits[T, n] = x[T, C] · W[row0 : row0 + n, :]ᵀ, W [V, C] frozen:
// f32, or Q4_0 / Q8_0 blocks, halves or Q4_K / Q6_K super-blocks decoded into shared memory tile by tile. The
// tiled GEMM body of gemm_tiled.glsl with M = T, N = n, K = C; `row0` is the tile's first vocabulary row.
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

// Bs[k * BN + n] = W[row0 + n0 + n, k0 + k]. Q4_0: BN rows x one block = 4 BN quarters over 256 invocations.
void load_tile_b(uint n0, uint k0) {
  if (p.format == 2u) {
    q8_0_load_wt(n0, k0, p.row0, p.N, p.k_end);
    return;
  }
  if (p.format == 3u) {
    f16_load_wt(n0, k0, p.row0, p.N, p.k_end);
    return;
  }
  if (p.format == 4u) {
    q4_k_load_wt(n0, k0, p.row0, p.N, p.k_end);
    return;
  }
  if (p.format == 5u) {
    q6_k_load_wt(n0, k0, p.row0, p.N, p.k_end);
    return;
  }
  if (p.format == 0u) {
    const uint k = gl_LocalInvocationID.x % BK;
    for (uint i = 0u; i < BK * BN / 256u; ++i) {
      const uint n = gl_LocalInvocationID.x / BK + (256u / BK) * i;
      const bool ok = n0 + n < p.N && k0 + k < p.k_end;
      Bs[k * BN + n] = ok ? uintBitsToFloat(w[(p.row0 + n0 + n) * p.ldb + k0 + k]) : 0.0;
    }
    return;
  }
  for (uint t = gl_LocalInvocationID.x; t < 4u * BN; t += 256u) {
    const uint r = t / 4u, q = t % 4u;
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    if (n0 + r < p.N) {
      const uint bb = ((p.row0 + n0 + r) * (p.k_end / 32u) + k0 / 32u) * Q4_0_BLOCK_BYTES;
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
