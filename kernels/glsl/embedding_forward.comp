#version 450
// y[T, C] = table[ids[t], :], the table [V, C] stored as `format`: 0 = f32, 1 = Q4_0 blocks, 2 = Q8_0 blocks,
// 3 = f16, 4 = Q4_K and 5 = Q6_K super-blocks (C a multiple of 256; Q6_K in the grouped layout of q6_k.glsl);
// rows are dequantised or widened on the fly, one weight per invocation. An id outside [0, V) is clamped to the
// nearest row: a shader cannot throw, and the CPU backend reports such ids as an error instead.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Table { uint table[]; };  // f32 bits, raw blocks or halves
layout(std430, binding = 2) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Push { uint T; uint C; uint V; uint format; } p;

#define Q4_0_WORDS table
#include "q4_0.glsl"
#define Q8_0_WORDS table
#include "q8_0.glsl"
#define Q4_K_WORDS table
#include "q4_k.glsl"
#define Q6_K_WORDS table
#include "q6_k.glsl"

// Weight k of a block sits in quarter (k % 16) / 4, lane k % 4, low nibble for k < 16, high otherwise.
float q4_0_weight(uint id, uint c) {
  const uint bb = (id * (p.C / 32u) + c / 32u) * Q4_0_BLOCK_BYTES, k = c % 32u;
  const uint qs = q4_0_quarter(bb, (k % 16u) / 4u);
  const vec4 q = k < 16u ? q4_0_low(qs) : q4_0_high(qs);
  return q4_0_scale(bb) * q[k % 4u];
}

// Weight k of a block is the signed byte qs[k], at byte bb + 2 + k.
float q8_0_weight(uint id, uint c) {
  const uint bb = (id * (p.C / 32u) + c / 32u) * Q8_0_BLOCK_BYTES, a = bb + 2u + c % 32u;
  const int q = int(table[a >> 2u] << (24u - 8u * (a & 3u))) >> 24;
  return q8_0_scale(bb) * float(q);
}

// The K-quants decode the 4 weights around c (q4_k.glsl, q6_k.glsl) and keep one.
float q4_k_weight(uint id, uint c) {
  const uint bw = (id * (p.C / 256u) + c / 256u) * Q4_K_BLOCK_WORDS, k = c % 256u;
  return q4_k_weights4(bw, k & ~3u)[k & 3u];
}
float q6_k_weight(uint id, uint c) {
  const uint k = c % 256u;
  return q6_k_weights4(id * (p.C / 256u) + c / 256u, k & ~3u)[k & 3u];
}

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.T * p.C) return;
  const uint t = i / p.C, c = i % p.C;
  const uint id = uint(clamp(ids[t], 0, int(p.V) - 1));
  const uint e = id * p.C + c;  // element index in the table
  if (p.format == 0u) y[i] = uintBitsToFloat(table[e]);
  else if (p.format == 1u) y[i] = q4_0_weight(id, c);
  else if (p.format == 2u) y[i] = q8_0_weight(id, c);
  else if (p.format == 4u) y[i] = q4_k_weight(id, c);
  else if (p.format == 5u) y[i] = q6_k_weight(id, c);
  else y[i] = unpackHalf2x16(table[e >> 1u])[e & 1u];
}
