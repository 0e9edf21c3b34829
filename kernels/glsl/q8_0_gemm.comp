#version 450
// Y[T, n_out] = X[T, n_in] · Wᵀ for T tokens: the tiled GEMM with B = Wᵀ decoded from Q8_0 blocks into shared
// memory tile by tile (M = T, N = n_out, K = n_in; BK = 32 is exactly one block per row).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define Q8_0_WORDS w
#include "q8_0.glsl"
#include "q8_0_tiles.glsl"

void load_tile_b(uint n0, uint k0) { q8_0_load_wt(n0, k0, 0u, p.N, p.k_end); }
