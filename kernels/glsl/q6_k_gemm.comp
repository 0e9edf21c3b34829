#version 450
// Y[T, n_out] = X[T, n_in] · Wᵀ for T tokens: the tiled GEMM with B = Wᵀ decoded from Q6_K blocks into shared
// memory tile by tile (M = T, N = n_out, K = n_in; a BK = 32 slice of a row lies inside one super-block).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define Q6_K_WORDS w
#include "q6_k.glsl"
#include "q6_k_tiles.glsl"

void load_tile_b(uint n0, uint k0) { q6_k_load_wt(n0, k0, 0u, p.N, p.k_end); }
