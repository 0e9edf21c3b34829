#version 450
// Global gradient norm, second pass: sumsq[0] = Σ partial[0 .. count) in one workgroup (each invocation sums a
// stride-256 slice in order, then a fixed-order tree), so the result is the same on every run.
layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer SumSq { float sumsq[]; };
layout(std430, binding = 1) readonly buffer Partial { float partial[]; };
layout(push_constant) uniform Push { uint count; } p;

shared float acc[256];

void main() {
  const uint lid = gl_LocalInvocationID.x;
  float s = 0.0;
  for (uint i = lid; i < p.count; i += 256u) s += partial[i];
  acc[lid] = s;
  barrier();
  for (uint stride = 128u; stride > 0u; stride >>= 1u) {
    if (lid < stride) acc[lid] += acc[lid + stride];
    barrier();
  }
  if (lid == 0u) sumsq[0] = acc[0];
}
