#version 450
// dX[T, n_in] (+)= dY[T, j_start:j_end] · W[j_start:j_end, :] for T tokens: the tiled GEMM with B = W decoded
// from Q6_K blocks into shared memory (M = T, N = n_in, K = output rows j in [k_begin, k_end)).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#define GEMM_BK 16u  // K steps of 16 rows (gemm_tiled.glsl)
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define Q6_K_WORDS w
#include "q6_k.glsl"
#include "q6_k_tiles.glsl"

void load_tile_b(uint n0, uint k0) { q6_k_load_w(n0, k0, p.k_end, 0u, p.N); }
