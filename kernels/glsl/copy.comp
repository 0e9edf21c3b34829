#version 450
// dst[i] = src[i] over vec4s: the memory roofline the benchmarks compare against.
layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer Dst { vec4 dst[]; };
layout(std430, binding = 1) readonly buffer Src { vec4 src[]; };
layout(push_constant) uniform Push { uint n_vec4; } p;

void main() {
  uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i < p.n_vec4) dst[i] = src[i];
}
