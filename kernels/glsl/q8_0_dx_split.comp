#version 450
// First pass of dx[n_in] = dy[j_start:j_end] · W[j_start:j_end, :] for one token, W in Q8_0 blocks (the
// transposed GEMV), laid out as q4_0_dx_split.comp: the row range is cut into chunks of rows_per_chunk rows
// (gl_WorkGroupID.y); a workgroup is 64 quarters of block columns (gl_LocalInvocationID.x; 8 columns of dx each)
// times ROW_SLOTS row slots (.y), slot s walking rows s, s + ROW_SLOTS, ... of the chunk. The slots are summed
// through shared memory and chunk c writes its sums to partial[c, cols]; q4_0_dx_reduce.comp adds the chunks in
// order (deterministic, no float atomics).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;

layout(std430, binding = 0) writeonly buffer Partial { vec4 partial4[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

#define Q8_0_WORDS w
#include "q8_0.glsl"

shared vec4 red[ROW_SLOTS * 64 * 2];

void main() {
  const uint n_blocks = p.n_in / 32u;
  const uint lx = gl_LocalInvocationID.x, slot = gl_LocalInvocationID.y;
  const uint u = gl_WorkGroupID.x * 64u + lx;
  const bool in_range = u < n_blocks * 4u;
  const uint b = in_range ? u >> 2u : 0u, q = u & 3u;
  const uint row_bytes = n_blocks * Q8_0_BLOCK_BYTES;
  const uint c = gl_WorkGroupID.y;
  const uint j0 = p.j_start + c * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);
  const uint S = ROW_SLOTS;

  // Columns 32b + 8q .. +3 (a0) and +4 .. +7 (a1).
  vec4 a0 = vec4(0.0), a1 = vec4(0.0);
  uint j = j0 + slot;
  for (; j + 3u * S < j1; j += 4u * S) {
    uvec2 qs[4];
    float g[4];
    for (uint i = 0u; i < 4u; ++i) {
      const uint bb = (j + i * S) * row_bytes + b * Q8_0_BLOCK_BYTES;
      qs[i] = q8_0_words2(bb + 2u + 8u * q);
      g[i] = dy[j + i * S] * q8_0_scale(bb);
    }
    for (uint i = 0u; i < 4u; ++i) {
      a0 += g[i] * q8_0_unpack(qs[i].x);
      a1 += g[i] * q8_0_unpack(qs[i].y);
    }
  }
  for (; j < j1; j += S) {
    const uint bb = j * row_bytes + b * Q8_0_BLOCK_BYTES;
    const uvec2 qs = q8_0_words2(bb + 2u + 8u * q);
    const float g = dy[j] * q8_0_scale(bb);
    a0 += g * q8_0_unpack(qs.x);
    a1 += g * q8_0_unpack(qs.y);
  }

  red[(slot * 64u + lx) * 2u] = a0;
  red[(slot * 64u + lx) * 2u + 1u] = a1;
  barrier();
  if (slot != 0u || !in_range) return;
  for (uint s = 1u; s < S; ++s) {
    a0 += red[(s * 64u + lx) * 2u];
    a1 += red[(s * 64u + lx) * 2u + 1u];
  }
  const uint base = (c * p.n_in) / 4u + b * 8u + 2u * q;
  partial4[base] = a0;
  partial4[base + 1u] = a1;
}
