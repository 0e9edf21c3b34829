#version 450
// Columns begin .. begin + n - 1 of x [T, C]: forward y [T, n] = x[:, begin:begin+n]; backward (accumulate = 1)
// dx[:, begin:begin+n] += dy. One invocation per value of y.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer In { float x[]; };
layout(push_constant) uniform Push { uint rows; uint cols; uint begin; uint n; uint accumulate; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.rows * p.n) return;
  const uint t = i / p.n, c = i % p.n, wide = t * p.cols + p.begin + c;
  if (p.accumulate != 0u) o[wide] += x[i];
  else o[i] = x[wide];
}
