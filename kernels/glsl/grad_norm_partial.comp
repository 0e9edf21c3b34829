#version 450
// Global gradient norm, first pass: partial[offset + group] = Σ g[i]² over one parameter's block of 4096 values
// (256 invocations x 16 strided values each, then a fixed-order tree in shared memory). grad_norm_reduce.comp sums
// the partials of all parameters in order: deterministic, no float atomics, and loops stay short (lavapipe stops
// a loop past 65535 iterations).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Partial { float partial[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(push_constant) uniform Push { uint n; uint offset; uint groups; } p;

shared float acc[256];

void main() {
  const uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  if (group >= p.groups) return;  // whole workgroups only (the 2-D grid's tail), so no barrier is skipped
  const uint lid = gl_LocalInvocationID.x;
  float s = 0.0;
  for (uint k = 0u; k < 16u; ++k) {
    const uint i = group * 4096u + k * 256u + lid;
    if (i < p.n) s += g[i] * g[i];
  }
  acc[lid] = s;
  barrier();
  for (uint stride = 128u; stride > 0u; stride >>= 1u) {
    if (lid < stride) acc[lid] += acc[lid + stride];
    barrier();
  }
  if (lid == 0u) partial[p.offset + group] = acc[0];
}
