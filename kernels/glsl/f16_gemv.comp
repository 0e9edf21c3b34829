#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in halves (rows contiguous, n_in even), for one token.
//
// As q4_0_gemv.comp: a workgroup owns NUM_ROWS consecutive rows; its invocations walk the row's words (two
// weights each) with a stride of the workgroup size, so neighbouring invocations read neighbouring words; each
// invocation loads its 2 activations once and reuses them for all NUM_ROWS rows. Partial sums are reduced with
// subgroupAdd, then across subgroups through shared memory. Workgroups are numbered over x and y (more than
// 65535 row groups fit).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 4;
const uint MAX_SUBGROUPS = 64;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer X { vec2 x2[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;

shared float partial[NUM_ROWS * MAX_SUBGROUPS];

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barrier below stays uniform
  const uint n_words = p.n_in / 2u;

  float acc[NUM_ROWS];
  for (uint r = 0u; r < NUM_ROWS; ++r) acc[r] = 0.0;

  for (uint u = gl_LocalInvocationID.x; u < n_words; u += gl_WorkGroupSize.x) {
    const vec2 xv = x2[u];
    for (uint r = 0u; r < NUM_ROWS; ++r) {
      const uint row = min(row0 + r, p.n_out - 1u);
      acc[r] += dot(unpackHalf2x16(w[row * n_words + u]), xv);
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
