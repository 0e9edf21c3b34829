#version 450
// First pass of dx[n_in] = dy[j_start:j_end] · W[j_start:j_end, :] for one token (the transposed GEMV), W in any unit
// format (wunit.glsl; FORMAT set by the variant), in f32: the weights as GGML dequantises them times dy, summed in
// f32 (unit_axpy_f32, which factors the scales out where the format has codes: the rounding is not that of adding
// unit_decode_f32's products one by one).
//
// The row range is cut into chunks of rows_per_chunk rows (gl_WorkGroupID.y). A workgroup is 32 units of columns
// (gl_LocalInvocationID.x: one unit, 32 columns of dx, each; so 1024 columns per workgroup, gl_WorkGroupID.x·1024 ..;
// units past n_in / 32 idle but take part in the barriers) times ROW_SLOTS row slots (.y), slot s walking rows s,
// s + ROW_SLOTS, ... of the chunk, the loads of IN_FLIGHT rows issued before any of them is decoded. The slots are
// summed through shared memory (at most 16 KiB, in rounds where the slots are many) and slot 0 writes chunk c's sums
// to partial[c, cols]; q4_0_dx_reduce.comp adds the chunks in order (deterministic, no float atomics). n_in is a
// multiple of 32 (256 for the K-quants and IQ4_XS).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifndef FORMAT
#error "unit_dx_split.comp is built per format: FORMAT comes from its variant (kernels/CMakeLists.txt)"
#endif

layout(local_size_x = 32, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 4;

layout(std430, binding = 0) writeonly buffer Partial { vec4 partial4[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W1 { uint wq1[]; };
layout(std430, binding = 1) readonly buffer W4 { uvec4 wq4[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

#define UNIT_F32_ONLY
#define UNIT_SHARED_TABLE
#include "wunit.glsl"

const uint XV = 2u * UNIT_VECS;  // vec4s per piece
// Rows whose units an invocation loads together: fewer where a unit takes many registers.
const uint IN_FLIGHT = UNIT_WORDS * UNIT_PARTS <= 13 ? 8u : 4u;
// The slots' sums go through shared memory CH vec4s (of an invocation's 8) at a time: (ROW_SLOTS - 1)·32·CH
// vec4s of at most 16 KiB.
const uint CH = ROW_SLOTS <= 5u ? 8u : ROW_SLOTS <= 9u ? 4u : ROW_SLOTS <= 17u ? 2u : 1u;
shared vec4 red[(ROW_SLOTS > 1u ? ROW_SLOTS - 1u : 1u) * 32u * CH];

// acc + off += g · a row's unit (all its parts; unit_axpy_f32).
void add_row(inout vec4 acc[8], inout vec2 off, WUnit w[UNIT_PARTS], float g) {
  [[unroll]] for (uint part = 0u; part < UNIT_PARTS; ++part) {
    vec4 a[XV];
    [[unroll]] for (uint e = 0u; e < XV; ++e) a[e] = acc[part * XV + e];
    unit_axpy_f32(w[part], g, a, off);
    [[unroll]] for (uint e = 0u; e < XV; ++e) acc[part * XV + e] = a[e];
  }
}

void main() {
  unit_setup();
  const uint lx = gl_LocalInvocationID.x, slot = gl_LocalInvocationID.y, S = ROW_SLOTS;
  const uint u = gl_WorkGroupID.x * 32u + lx;
  const bool in_range = u < p.n_in / 32u;
  const uint uu = in_range ? u : 0u;
  const uint c = gl_WorkGroupID.y;
  const uint j0 = p.j_start + c * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);
  barrier();  // unit_setup's table

  vec4 acc[8];  // columns 32u .. 32u + 31, but for off
  [[unroll]] for (uint e = 0u; e < 8u; ++e) acc[e] = vec4(0.0);
  vec2 off = vec2(0.0);  // added to columns 32u .. 32u + 15 (.x) and 32u + 16 .. (.y) at the end
  uint j = j0 + slot;
  for (; j + (IN_FLIGHT - 1u) * S < j1; j += IN_FLIGHT * S) {
    WUnit w[IN_FLIGHT][UNIT_PARTS];
    float g[IN_FLIGHT];
    [[unroll]] for (uint i = 0u; i < IN_FLIGHT; ++i) {
      [[unroll]] for (uint part = 0u; part < UNIT_PARTS; ++part) w[i][part] = unit_fetch(j + i * S, uu, part, p.n_in);
      g[i] = dy[j + i * S];
    }
    [[unroll]] for (uint i = 0u; i < IN_FLIGHT; ++i) add_row(acc, off, w[i], g[i]);
  }
  for (; j < j1; j += S) {
    WUnit w[UNIT_PARTS];
    [[unroll]] for (uint part = 0u; part < UNIT_PARTS; ++part) w[part] = unit_fetch(j, uu, part, p.n_in);
    add_row(acc, off, w, dy[j]);
  }
  [[unroll]] for (uint e = 0u; e < 8u; ++e) acc[e] += vec4(e < 4u ? off.x : off.y);

  [[unroll]] for (uint c0 = 0u; c0 < 8u; c0 += CH) {
    if (slot != 0u)
      [[unroll]] for (uint k = 0u; k < CH; ++k) red[((slot - 1u) * 32u + lx) * CH + k] = acc[c0 + k];
    barrier();
    if (slot == 0u)
      for (uint s = 1u; s < S; ++s)
        [[unroll]] for (uint k = 0u; k < CH; ++k) acc[c0 + k] += red[((s - 1u) * 32u + lx) * CH + k];
    barrier();
  }
  if (slot != 0u || !in_range) return;
  const uint base = (c * p.n_in) / 4u + 8u * u;
  [[unroll]] for (uint e = 0u; e < 8u; ++e) partial4[base + e] = acc[e];
}
