#version 450
// silu(x) = x * sigmoid(x) and swiglu(gate, up) = silu(gate) * up over n values, forward and backward;
// silu'(x) = s (1 + x (1 - s)) with s = sigmoid(x). a = x or gate, b = up, dy = the output gradient.
// op: 0 o = silu(a), 1 o = silu(a) * b, 2 o += dy * silu'(a), 3 o += dy * silu'(a) * b, 4 o += dy * silu(a).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(std430, binding = 3) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push { uint n; uint op; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  const float x = a[i];
  const float s = 1.0 / (1.0 + exp(-x));  // exp(-x) = inf for x < -88 gives s = 0, not NaN
  switch (p.op) {
    case 0u: o[i] = x * s; break;
    case 1u: o[i] = x * s * b[i]; break;
    case 2u: o[i] += dy[i] * s * (1.0 + x * (1.0 - s)); break;
    case 3u: o[i] += dy[i] * s * (1.0 + x * (1.0 - s)) * b[i]; break;
    case 4u: o[i] += dy[i] * x * s; break;
  }
}
