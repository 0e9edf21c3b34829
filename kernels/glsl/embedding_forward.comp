#version 450
// y[T, C] = table[ids[t], :], the table [V, C] either f32 or Q4_0 blocks (q4 = 1: rows dequantised on the fly,
// one weight per invocation). An id outside [0, V) is clamped to the nearest row: a shader cannot throw, and
// the CPU backend reports such ids as an error instead.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Table { uint table[]; };  // f32 bits or raw Q4_0 blocks
layout(std430, binding = 2) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Push { uint T; uint C; uint V; uint q4; } p;

#define Q4_0_WORDS table
#include "q4_0.glsl"

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.T * p.C) return;
  const uint t = i / p.C, c = i % p.C;
  const uint id = uint(clamp(ids[t], 0, int(p.V) - 1));
  if (p.q4 == 0u) {
    y[i] = uintBitsToFloat(table[id * p.C + c]);
    return;
  }
  // Weight k of a block sits in quarter (k % 16) / 4, lane k % 4, low nibble for k < 16, high otherwise.
  const uint bb = (id * (p.C / 32u) + c / 32u) * Q4_0_BLOCK_BYTES, k = c % 32u;
  const uint qs = q4_0_quarter(bb, (k % 16u) / 4u);
  const vec4 q = k < 16u ? q4_0_low(qs) : q4_0_high(qs);
  y[i] = q4_0_scale(bb) * q[k % 4u];
}
