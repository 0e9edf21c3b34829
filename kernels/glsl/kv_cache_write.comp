#version 450
// cache[start + t, c] = x[t, c] for x [T, C] and the cache [S, C]: the new keys (or values) of a decode step
// stored at their positions. One invocation per element of x; rows past S - 1 are dropped (a shader cannot
// throw; the host keeps start + T <= S).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Cache { float cache[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer Start { int start[]; };
layout(push_constant) uniform Push { uint n; uint cols; uint cache_rows; } p;

void main() {
  const uint g = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (g >= p.n) return;
  const uint row = uint(max(start[0], 0)) + g / p.cols;
  if (row >= p.cache_rows) return;
  cache[row * p.cols + g % p.cols] = x[g];
}
