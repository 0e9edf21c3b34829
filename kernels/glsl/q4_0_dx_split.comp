#version 450
// First pass of dx[n_in] = dy[j_start:j_end] · W[j_start:j_end, :] for one token (the transposed GEMV).
//
// The row range is cut into chunks of rows_per_chunk rows (gl_WorkGroupID.y). A workgroup is 64 quarters of
// block columns (gl_LocalInvocationID.x; 8 columns of dx each) times ROW_SLOTS row slots (.y): slot s walks
// rows s, s + ROW_SLOTS, ... of the chunk, so a subgroup reads contiguous bytes of each row and each
// invocation issues the loads of ROWS_IN_FLIGHT rows together. The slots are summed through shared memory and
// chunk c writes its sums to partial[c, cols]; q4_0_dx_reduce.comp adds the chunks in order (deterministic, no
// float atomics).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;
layout(constant_id = 1) const uint ROWS_IN_FLIGHT = 4;  // rows whose loads an invocation issues together

layout(std430, binding = 0) writeonly buffer Partial { vec4 partial4[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

#define Q4_0_WORDS w
#include "q4_0.glsl"

shared vec4 red[ROW_SLOTS * 64 * 2];

void main() {
  const uint n_blocks = p.n_in / 32u;
  const uint lx = gl_LocalInvocationID.x, slot = gl_LocalInvocationID.y;
  const uint u = gl_WorkGroupID.x * 64u + lx;
  const bool in_range = u < n_blocks * 4u;
  const uint b = in_range ? u >> 2u : 0u, q = u & 3u;
  const uint row_bytes = n_blocks * Q4_0_BLOCK_BYTES;
  const uint c = gl_WorkGroupID.y;
  const uint j0 = p.j_start + c * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);
  const uint S = ROW_SLOTS;

  // Σ g·(n − 8) = 16·Σ g·f − 24·Σ g with f = 1 + n/16 (q4_0.glsl), g = dy·d: the 24·Σ g is one scalar.
  vec4 lo = vec4(0.0), hi = vec4(0.0);
  float corr = 0.0;
  uint j = j0 + slot;
  for (; j + (ROWS_IN_FLIGHT - 1u) * S < j1; j += ROWS_IN_FLIGHT * S) {
    uint qs[ROWS_IN_FLIGHT];
    float g[ROWS_IN_FLIGHT];
    for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
      const uint bb = (j + i * S) * row_bytes + b * Q4_0_BLOCK_BYTES;
      qs[i] = q4_0_quarter(bb, q);
      g[i] = 16.0 * dy[j + i * S] * q4_0_scale(bb);
    }
    for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
      lo += g[i] * q4_0_low_1p(qs[i]);
      hi += g[i] * q4_0_high_1p(qs[i]);
      corr += g[i];
    }
  }
  for (; j < j1; j += S) {
    const uint bb = j * row_bytes + b * Q4_0_BLOCK_BYTES;
    const uint qs = q4_0_quarter(bb, q);
    const float g = 16.0 * dy[j] * q4_0_scale(bb);
    lo += g * q4_0_low_1p(qs);
    hi += g * q4_0_high_1p(qs);
    corr += g;
  }
  lo -= 1.5 * corr;
  hi -= 1.5 * corr;

  red[(slot * 64u + lx) * 2u] = lo;
  red[(slot * 64u + lx) * 2u + 1u] = hi;
  barrier();
  if (slot != 0u || !in_range) return;
  for (uint s = 1u; s < S; ++s) {
    lo += red[(s * 64u + lx) * 2u];
    hi += red[(s * 64u + lx) * 2u + 1u];
  }
  const uint base = (c * p.n_in) / 4u + b * 8u + q;
  partial4[base] = lo;
  partial4[base + 4u] = hi;
}
