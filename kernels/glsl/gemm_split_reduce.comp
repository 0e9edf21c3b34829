#version 450
// Second pass of a GEMM split over K (gemm_tiled.glsl): C[i] = (accumulate ? C[i] : 0) + Σ_s part[s, i], the
// slices added in order (deterministic).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer Part { float part[]; };  // [n_slices, n]
layout(push_constant) uniform Push { uint n; uint n_slices; uint accumulate; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  float s = p.accumulate != 0u ? c[i] : 0.0;
  for (uint k = 0u; k < p.n_slices; ++k) s += part[k * p.n + i];
  c[i] = s;
}
