#version 450
// y[n_out] = W[n_out, n_in] · x[n_in] for one token, W in a unit format (wunit.glsl; FORMAT set by the variant),
// on 8-bit integer dot products (int_dot.glsl). The activations come as limbs in x's order at one scale per 32,
// with Σ x per 16 (x_limbs.comp, LAYOUT 3). Each unit (32 weights) gives its codes as bytes (unit_codes) and
// (s, s', o, o') of its halves (unit_affine): the weights are s·c + o over weights 0-15 and s'·c + o' over 16-31,
// so Σ w·x = s·(σ·Σ c·A) + o·Σ x + s'·(σ·Σ c'·A') + o'·Σ x', σ the limbs' scale. Unsigned codes (UNIT_CODE_BITS,
// at most 7) take the unsigned dot; UNIT_SIGNED_CODES (IQ4: table levels as int8) the signed one, o = o' = 0.
// A workgroup owns NUM_ROWS rows in row sets of ROWS_PER_INVOCATION (gemv_row_sets.glsl); an invocation takes
// whole units, SET_SIZE apart, loads the unit's limbs once and, for each of its rows, fetches the unit. n_in is a
// multiple of 32 (256 for the K-quants and IQ4_XS). IQ4 levels come from a 16-word shared table.
// Measurements: docs/kernels.md, "Integer-dot GEMVs".
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_spirv_intrinsics : require
#ifndef FORMAT
#error "unit_gemv_dot.comp is built per format: FORMAT comes from its variant (kernels/CMakeLists.txt)"
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 2;
layout(constant_id = 2) const uint ROWS_PER_INVOCATION = 2;  // NUM_ROWS must be a multiple

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W1 { uint wq1[]; };
layout(std430, binding = 1) readonly buffer W4 { uvec4 wq4[]; };
layout(std430, binding = 2) readonly buffer Limbs { uvec4 limb4[]; };
layout(std430, binding = 2) readonly buffer LimbFloats { float limbf[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;

#define UNIT_F32_ONLY
#include "wunit.glsl"
#include "gemv_row_sets.glsl"
#include "int_dot.glsl"

// i.x + 2^8·i.y + 2^16·i.z for the signed dot's sums (|i| < 2^24: each conversion exact).
float limb_value_signed(ivec3 i) { return (float(i.x) + 256.0 * float(i.y)) + 65536.0 * float(i.z); }

#if !defined(UNIT_CODE_BITS) && !defined(UNIT_SIGNED_CODES)
#error "unit_gemv_dot.comp needs a format with unit_codes (UNIT_CODE_BITS or UNIT_SIGNED_CODES)"
#endif

#ifdef UNIT_SIGNED_CODES
// The level of each nibble q as an int8 byte, repeated in all 4 bytes (16 words: the lanes of a subgroup that
// read the same entry are served by one broadcast, and no two entries share a bank).
shared uint levels4[16];
// The codes of the 4 low nibbles (.x) and the 4 high nibbles (.y) of q, as int8 bytes.
uvec2 codes_of_nibbles(uint q) {
  uvec2 c = uvec2(0u);
  [[unroll]] for (uint b = 0u; b < 4u; ++b) {
    const uint mask = 0xFFu << (8u * b);
    c.x |= levels4[bitfieldExtract(q, int(8u * b), 4)] & mask;
    c.y |= levels4[bitfieldExtract(q, int(8u * b + 4u), 4)] & mask;
  }
  return c;
}
#endif

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barriers below stay uniform
#ifdef UNIT_SIGNED_CODES
  if (gl_LocalInvocationID.x < 16u)
    levels4[gl_LocalInvocationID.x] = (iq4_level(gl_LocalInvocationID.x) ^ 0x80u) * 0x01010101u;
  barrier();
#endif
  const uint set = gl_LocalInvocationID.x / SET_SIZE, lane = gl_LocalInvocationID.x % SET_SIZE;
  const uint rows = row0 + set * ROWS_PER_INVOCATION;
  const uint n_units = p.n_in / 32u;
  const uint plane = p.n_in / 16u;  // uvec4s per limb plane
  const uint scales = 3u * p.n_in / 4u;
  const uint sums = scales + n_units;  // Σ x per 16

  float acc[ROWS_PER_INVOCATION];
  [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) acc[r] = 0.0;

  for (uint u = lane; u < n_units; u += SET_SIZE) {
    WUnit wu[ROWS_PER_INVOCATION];
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r)
      wu[r] = unit_fetch(min(rows + r, p.n_out - 1u), u, 0u, p.n_in);
    const uvec4 l0a = limb4[2u * u], l0b = limb4[2u * u + 1u];
    const uvec4 l1a = limb4[plane + 2u * u], l1b = limb4[plane + 2u * u + 1u];
    const uvec4 l2a = limb4[2u * plane + 2u * u], l2b = limb4[2u * plane + 2u * u + 1u];
    const float s = limbf[scales + u];
#ifdef UNIT_CODE_BITS
    const vec2 sx = vec2(limbf[sums + 2u * u], limbf[sums + 2u * u + 1u]);
#endif
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      ivec3 qa = ivec3(0), qb = ivec3(0);
      [[unroll]] for (uint k = 0u; k < 4u; ++k) {
#ifdef UNIT_CODE_BITS
        qa += limb_dot(unit_codes(wu[r], k), l0a[k], l1a[k], l2a[k]);
        qb += limb_dot(unit_codes(wu[r], k + 4u), l0b[k], l1b[k], l2b[k]);
#else
        const uvec2 c = codes_of_nibbles(unit_nibbles(wu[r], k));
        qa += limb_dot_signed(c.x, l0a[k], l1a[k], l2a[k]);
        qb += limb_dot_signed(c.y, l0b[k], l1b[k], l2b[k]);
#endif
      }
      const vec4 a = unit_affine(wu[r]);
#ifdef UNIT_CODE_BITS
      acc[r] += (a.x * (s * limb_value(qa)) + a.z * sx.x) + (a.y * (s * limb_value(qb)) + a.w * sx.y);
#else
      acc[r] += a.x * (s * limb_value_signed(qa)) + a.y * (s * limb_value_signed(qb));
#endif
    }
  }

  write_row_sums(acc, set, row0);
}
