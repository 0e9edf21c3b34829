#version 450
// Second pass of the one-token dx: dx[i] = (accumulate ? dx[i] : 0) + Σ_c partial[c, i], chunks in order. The
// f32 GEMMs split over K (gemm_tiled.glsl) add their slices with it too.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer DX { float dx[]; };
layout(std430, binding = 1) readonly buffer Partial { float partial[]; };  // [n_chunks, n]
layout(push_constant) uniform Push { uint n; uint n_chunks; uint accumulate; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  float s = p.accumulate != 0u ? dx[i] : 0.0;
  for (uint c = 0u; c < p.n_chunks; ++c) s += partial[c * p.n + i];
  dx[i] = s;
}
