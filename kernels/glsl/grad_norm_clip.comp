#version 450
// Clipping by global norm: g *= max_norm / norm when norm = sqrt(sumsq[0]) (from grad_norm_reduce.comp) exceeds
// max_norm; otherwise g is left as it is. Reading the norm here keeps the whole clip on the device.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer SumSq { float sumsq[]; };
layout(push_constant) uniform Push { uint n; float max_norm; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  const float norm = sqrt(sumsq[0]);
  if (i >= p.n || !(norm > p.max_norm)) return;
  g[i] *= p.max_norm / norm;
}
