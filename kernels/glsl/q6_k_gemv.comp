#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q6_K super-blocks (rows contiguous, n_in a multiple of 256), for one
// token.
//
// Laid out as q4_k_gemv.comp: a workgroup owns NUM_ROWS consecutive rows, split into row sets of
// ROWS_PER_INVOCATION rows, each set walking the rows' units with SET_SIZE invocations. A unit is (block b,
// half h, l-group g): l = 8g .. 8g+7 of the half's four quadrants, i.e. 8 bytes of ql at l, 8 at l + 32 and 8 of
// qh at l: 32 weights, at columns 128h + 32·k4 + l (k4 = 0..3), each quadrant's 8 under one scale. The
// activations are loaded once per unit and reused for every row. Sums are reduced per set with subgroupAdd,
// then across subgroups through shared memory. Workgroups are numbered over x and y.
//
// The blocks are in the GPU's grouped layout (q6_k.glsl): a unit's pieces are 8-byte loads.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 8;
layout(constant_id = 2) const uint ROWS_PER_INVOCATION = 2;  // NUM_ROWS must be a multiple

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer W2 { uvec2 w2[]; };  // the same words in pairs
layout(std430, binding = 2) readonly buffer X { vec4 x4[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;
#include "gemv_row_sets.glsl"

#define Q6_K_WORDS w
#define Q6_K_PAIRS w2
#include "q6_k.glsl"

// Σ over the unit's 32 weights of (q − 32)·x, each quadrant times its scale, for block blk.
// x: the unit's activations times Q6_K_SCALE (q6_k_unpack_scaled).
float unit_dot(uint blk, uint h, uint g, vec4 x[8]) {
  const uint base = q6_k_base(blk);
  const uvec2 ql0 = q6_k_pair(base + 16u * h + 2u * g);
  const uvec2 ql1 = q6_k_pair(base + 16u * h + 8u + 2u * g);
  const uvec2 qh = q6_k_pair(base + Q6_K_QH + 8u * h + 2u * g);
  // Scales 2·k4 + g/2 in bytes 0 and 2.
  const uvec2 sw = q6_k_pair(base + Q6_K_SCALES + 2u * h) >> (8u * (g >> 1u));
  float sum = 0.0;
  for (uint k4 = 0u; k4 < 4u; ++k4) {
    const uvec2 ql = (k4 & 1u) != 0u ? ql1 : ql0;
    const float d = dot(q6_k_unpack_scaled(q6_k_quants(ql.x, qh.x, k4)), x[2u * k4]) +
                    dot(q6_k_unpack_scaled(q6_k_quants(ql.y, qh.y, k4)), x[2u * k4 + 1u]);
    sum += q6_k_i8(sw[k4 >> 1u], 2u * (k4 & 1u)) * d;
  }
  return q6_k_d(blk) * sum;
}

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
    const uint b = u >> 3u, h = (u >> 2u) & 1u, g = u & 3u;
    // Activations 128h + 32·k4 + 8g + [0, 8) of block b, two vec4s per quadrant.
    vec4 x[8];
    for (uint k4 = 0u; k4 < 4u; ++k4) {
      const uint xi = 64u * b + 32u * h + 8u * k4 + 2u * g;
      x[2u * k4] = x4[xi] * Q6_K_SCALE;
      x[2u * k4 + 1u] = x4[xi + 1u] * Q6_K_SCALE;
    }
    for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const uint row = min(rows + r, p.n_out - 1u);
      acc[r] += unit_dot(row * n_blocks + b, h, g, x);
    }
  }

  write_row_sums(acc, set, row0);
}
