#version 450
// One vocabulary tile of the vocab-tiled loss: logits[T, n] = x[T, C] · W[row0 : row0 + n, :]ᵀ, W [V, C] frozen, stored
// as FORMAT (built per format by its variant): FORMAT_F32, or a unit format of wunit.glsl decoded into shared memory
// tile by tile (unit_tiles.glsl; each weight in f32 as GGML dequantises it; Q6_K in the grouped layout of
// q6_k.glsl). The tiled GEMM body of gemm_tiled.glsl with M = T, N = n, K = C; `row0` is the tile's first
// vocabulary row. The push block is the host's TileGemmPush as ever; its `format` is no longer read (the variant
// fixes the format) but keeps its place.
#extension GL_GOOGLE_include_directive : require
#ifndef FORMAT
#error "linear_ce_logits.comp is built per format: FORMAT comes from its variant (kernels/CMakeLists.txt)"
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W1 { uint wq1[]; };  // f32 bits, raw blocks, or halves
layout(std430, binding = 2) readonly buffer W4 { uvec4 wq4[]; };
layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint k_begin;
  uint k_end;
  uint lda;
  uint ldb;  // row stride of an f32 W
  uint accumulate;
  uint row0;
  uint format;   // unused: the variant fixes the format
  uint k_slice;  // gemm_tiled.glsl's split of K: always 0 here
} p;
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#include "formats.glsl"

#if FORMAT == FORMAT_F32
// Bs[k * BN + n] = W[row0 + n0 + n, k0 + k].
void load_tile_b(uint n0, uint k0) {
  const uint k = gl_LocalInvocationID.x % BK;
  for (uint i = 0u; i < BK * BN / 256u; ++i) {
    const uint n = gl_LocalInvocationID.x / BK + (256u / BK) * i;
    const bool ok = n0 + n < p.N && k0 + k < p.k_end;
    Bs[k * BN + n] = ok ? uintBitsToFloat(wq1[(p.row0 + n0 + n) * p.ldb + k0 + k]) : 0.0;
  }
}
#else
#define UNIT_F32_ONLY
// No UNIT_SHARED_TABLE: 128-wide tiles fill the 32 KiB of shared memory every device has, so the IQ4 levels come
// from registers here.
#include "wunit.glsl"
#include "unit_tiles.glsl"

void load_tile_b(uint n0, uint k0) { unit_load_wt(n0, k0, p.row0, p.N, p.k_end); }
#endif
