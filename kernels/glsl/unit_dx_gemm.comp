#version 450
// dX[T, n_in] (+)= dY[T, j_start:j_end] · W[j_start:j_end, :] for T tokens, W in any unit format (wunit.glsl; FORMAT
// set by the variant): the tiled GEMM with B = W decoded into shared memory tile by tile (unit_tiles.glsl; each
// weight in f32 as GGML dequantises it). M = T, N = n_in, K = output rows j in [k_begin, k_end).
#extension GL_GOOGLE_include_directive : require
#ifndef FORMAT
#error "unit_dx_gemm.comp is built per format: FORMAT comes from its variant (kernels/CMakeLists.txt)"
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W1 { uint wq1[]; };
layout(std430, binding = 2) readonly buffer W4 { uvec4 wq4[]; };
#include "gemm_push.glsl"
#define GEMM_BK 16u  // K steps of 16 rows (gemm_tiled.glsl)
#include "gemm_tiled.glsl"
#include "gemm_load_a.glsl"
#define UNIT_F32_ONLY
// No UNIT_SHARED_TABLE: 128-wide tiles fill the 32 KiB of shared memory every device has, so the IQ4 levels come
// from registers here.
#include "wunit.glsl"
#include "unit_tiles.glsl"

void load_tile_b(uint n0, uint k0) { unit_load_w(n0, k0, p.k_end, 0u, p.N); }
