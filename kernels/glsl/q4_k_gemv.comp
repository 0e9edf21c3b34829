#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q4_K super-blocks (rows contiguous, n_in a multiple of 256), for one
// token.
//
// A workgroup owns NUM_ROWS consecutive rows, split into row sets of ROWS_PER_INVOCATION rows; each set gets
// an equal share of the invocations (SET_SIZE). A "unit" is 16 bytes of quants, one uvec4 (block b, chunk c,
// half h): 16 weights of sub-block 2c in the low nibbles and 16 of sub-block 2c+1 in the high ones. An
// invocation walks the units with a stride of SET_SIZE (neighbours read neighbouring uvec4s), loads the unit's
// 32 activations once, and for each of its rows reads the block header (d, dmin, scales: one uvec4) and the
// unit, and adds d·sc·Σ q·x − dmin·m·Σ x per sub-block (Σ x is shared by the rows; Σ q·x comes from the
// cheaper 1 + q/16 decode of q4_k.glsl). Sums are reduced per set
// with subgroupAdd, then across subgroups through shared memory; nothing depends on the subgroup size or on
// how invocations map to subgroups. Workgroups are numbered over x and y (more than 65535 row groups fit).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 8;
layout(constant_id = 2) const uint ROWS_PER_INVOCATION = 4;  // NUM_ROWS must be a multiple

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uvec4 w4[]; };  // 9 per block
layout(std430, binding = 2) readonly buffer X { vec4 x4[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;
#include "gemv_row_sets.glsl"

#include "q4_k.glsl"

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barrier below stays uniform
  const uint set = gl_LocalInvocationID.x / SET_SIZE, lane = gl_LocalInvocationID.x % SET_SIZE;
  const uint rows = row0 + set * ROWS_PER_INVOCATION;  // this set's first row
  const uint n_blocks = p.n_in / 256u;
  const uint n_units = n_blocks * 8u;

  float acc[ROWS_PER_INVOCATION];
  for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) acc[r] = 0.0;

  for (uint u = lane; u < n_units; u += SET_SIZE) {
    const uint b = u >> 3u, c = (u >> 1u) & 3u, h = u & 1u;
    // Activations 64c + 16h + [0, 16) (low nibbles) and 64c + 32 + 16h + [0, 16) (high) of block b.
    const uint xb = 64u * b + 16u * c + 4u * h;
    vec4 xl[4], xh[4];
    for (uint i = 0u; i < 4u; ++i) {
      xl[i] = x4[xb + i];
      xh[i] = x4[xb + 8u + i];
    }
    const float sum_l = dot((xl[0] + xl[1]) + (xl[2] + xl[3]), vec4(1.0));
    const float sum_h = dot((xh[0] + xh[1]) + (xh[2] + xh[3]), vec4(1.0));
    for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const uint row = min(rows + r, p.n_out - 1u);
      const uint blk = (row * n_blocks + b) * 9u;
      const uvec4 hd = w4[blk];
      const uvec4 qs = w4[blk + 1u + 2u * c + h];
      const vec2 dm = unpackHalf2x16(hd.x);
      const vec4 s = q4_k_chunk_scales(hd.yzw, c);
      // Σ (1 + q/16)·x per sub-block (q4_k_low_1p): Σ q·x = 16·(f − Σ x).
      const float f_l = dot(q4_k_low_1p(qs.x), xl[0]) + dot(q4_k_low_1p(qs.y), xl[1]) +
                        dot(q4_k_low_1p(qs.z), xl[2]) + dot(q4_k_low_1p(qs.w), xl[3]);
      const float f_h = dot(q4_k_high_1p(qs.x), xh[0]) + dot(q4_k_high_1p(qs.y), xh[1]) +
                        dot(q4_k_high_1p(qs.z), xh[2]) + dot(q4_k_high_1p(qs.w), xh[3]);
      acc[r] += (16.0 * dm.x) * (s.x * (f_l - sum_l) + s.y * (f_h - sum_h)) - dm.y * (s.z * sum_l + s.w * sum_h);
    }
  }

  write_row_sums(acc, set, row0);
}
