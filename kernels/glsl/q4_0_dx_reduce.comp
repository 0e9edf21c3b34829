#version 450
// Second pass of the one-token dx: dx[i] = (accumulate ? dx[i] : 0) + Σ_c partial[c, i], chunks in order. The
// f32 GEMMs split over K (gemm_tiled.glsl) add their slices with it too.
//
// The loads of BATCH chunks are issued before any of them is added, so their latencies overlap; the sum still
// runs over the chunks in order (docs/kernels.md, "One-token dx").
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer DX { float dx[]; };
layout(std430, binding = 1) readonly buffer Partial { float partial[]; };  // [n_chunks, n]
layout(push_constant) uniform Push { uint n; uint n_chunks; uint accumulate; } p;

const uint BATCH = 4u;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  float s = p.accumulate != 0u ? dx[i] : 0.0;
  uint c = 0u;
  for (; c + BATCH <= p.n_chunks; c += BATCH) {
    float v[BATCH];
    [[unroll]] for (uint k = 0u; k < BATCH; ++k) v[k] = partial[(c + k) * p.n + i];
    [[unroll]] for (uint k = 0u; k < BATCH; ++k) s += v[k];
  }
  for (; c < p.n_chunks; ++c) s += partial[c * p.n + i];
  dx[i] = s;
}
