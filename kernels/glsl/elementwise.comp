#version 450
// Elementwise ops over n values; b is either n values or one row of bn values broadcast over the rows of a
// (index i % bn). op: 0 y = a + b, 1 y = a * b, 2 y = s * a, 3 y += s * a, 4 y += a * b. VEC4 (n and bn
// multiples of 4): each invocation takes 4 values as one vec4, n and bn counted in vec4s.
layout(local_size_x = 256) in;
layout(constant_id = 0) const bool VEC4 = false;
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(std430, binding = 0) buffer Y4 { vec4 y4[]; };
layout(std430, binding = 1) readonly buffer A4 { vec4 a4[]; };
layout(std430, binding = 2) readonly buffer B4 { vec4 b4[]; };
layout(push_constant) uniform Push { uint n; uint bn; uint op; float s; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  if (VEC4) {
    switch (p.op) {
      case 0u: y4[i] = a4[i] + b4[i % p.bn]; break;
      case 1u: y4[i] = a4[i] * b4[i % p.bn]; break;
      case 2u: y4[i] = p.s * a4[i]; break;
      case 3u: y4[i] += p.s * a4[i]; break;
      case 4u: y4[i] += a4[i] * b4[i % p.bn]; break;
    }
    return;
  }
  switch (p.op) {
    case 0u: y[i] = a[i] + b[i % p.bn]; break;
    case 1u: y[i] = a[i] * b[i % p.bn]; break;
    case 2u: y[i] = p.s * a[i]; break;
    case 3u: y[i] += p.s * a[i]; break;
    case 4u: y[i] += a[i] * b[i % p.bn]; break;
  }
}
