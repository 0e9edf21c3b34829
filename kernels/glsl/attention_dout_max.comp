#version 450
// The largest |dO| of the tensor-core attention backward (attention_coop.glsl: dout_scale), first pass: workgroup
// g of GROUPS writes the largest |x[i]| over i = g·256 + lane + k·GROUPS·256 to partial[g] (a fixed-order tree in
// shared memory). The passes that need it take the maximum of the GROUPS partials themselves.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint GROUPS = 64;
layout(std430, binding = 0) writeonly buffer Partial { float partial[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(push_constant) uniform Push { uint n; } p;

shared float acc[256];

void main() {
  const uint lid = gl_LocalInvocationID.x;
  float m = 0.0;
  for (uint i = gl_WorkGroupID.x * 256u + lid; i < p.n; i += GROUPS * 256u) m = max(m, abs(x[i]));
  acc[lid] = m;
  barrier();
  for (uint stride = 128u; stride > 0u; stride >>= 1u) {
    if (lid < stride) acc[lid] = max(acc[lid], acc[lid + stride]);
    barrier();
  }
  if (lid == 0u) partial[gl_WorkGroupID.x] = acc[0];
}
