#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q4_0 blocks (rows contiguous), for one token.
//
// A workgroup owns NUM_ROWS consecutive rows. Its invocations walk the row's quarters (8 weights each:
// 4 bytes of quants) with a stride of the workgroup size; neighbouring invocations read neighbouring bytes,
// so loads coalesce. Each invocation loads its 8 activations once and reuses them for all NUM_ROWS rows,
// which keeps activation traffic below weight traffic. Weights are decoded as 1 + n/16 (q4_0.glsl). Partial sums are reduced with subgroupAdd, then
// across subgroups through shared memory; nothing here depends on the subgroup size. Workgroups are numbered over
// x and y (more than 65535 row groups fit).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 2;
const uint MAX_SUBGROUPS = 64;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer X { vec4 x4[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;

#define Q4_0_WORDS w
#include "q4_0.glsl"

shared float partial[NUM_ROWS * MAX_SUBGROUPS];

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barrier below stays uniform
  const uint n_blocks = p.n_in / 32u;
  const uint row_bytes = n_blocks * Q4_0_BLOCK_BYTES;
  const uint n_quarters = n_blocks * 4u;

  float acc[NUM_ROWS];
  for (uint r = 0u; r < NUM_ROWS; ++r) acc[r] = 0.0;

  for (uint u = gl_LocalInvocationID.x; u < n_quarters; u += gl_WorkGroupSize.x) {
    const uint b = u >> 2u, q = u & 3u;
    const vec4 xl = x4[b * 8u + q];
    const vec4 xh = x4[b * 8u + 4u + q];
    const float sum_x = dot(xl + xh, vec4(1.0));
    for (uint r = 0u; r < NUM_ROWS; ++r) {
      const uint row = min(row0 + r, p.n_out - 1u);
      const uint bb = row * row_bytes + b * Q4_0_BLOCK_BYTES;
      const uint qs = q4_0_quarter(bb, q);
      // d·Σ (n − 8)·x = d·(16·Σ f·x − 24·Σ x) with f = 1 + n/16 (q4_0.glsl).
      const float f = dot(q4_0_low_1p(qs), xl) + dot(q4_0_high_1p(qs), xh);
      acc[r] += q4_0_scale(bb) * (16.0 * f - 24.0 * sum_x);
    }
  }

  for (uint r = 0u; r < NUM_ROWS; ++r) {
    const float s = subgroupAdd(acc[r]);
    if (subgroupElect()) partial[r * MAX_SUBGROUPS + gl_SubgroupID] = s;
  }
  barrier();
  if (gl_LocalInvocationID.x < NUM_ROWS) {
    const uint r = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) s += partial[r * MAX_SUBGROUPS + g];
    if (row0 + r < p.n_out) y[row0 + r] = s;
  }
}
