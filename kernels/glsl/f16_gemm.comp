#version 450
// Y[T, n_out] = X[T, n_in] · Wᵀ for T tokens, W in halves (n_in even): the tiled GEMM with B = Wᵀ widened into
// shared memory tile by tile (M = T, N = n_out, K = n_in; BK = 32 is 16 words of each row).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define F16_WORDS w
#include "f16_tiles.glsl"

void load_tile_b(uint n0, uint k0) { f16_load_wt(n0, k0, 0u, p.N, p.k_end); }
