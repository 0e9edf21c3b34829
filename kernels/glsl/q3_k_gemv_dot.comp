#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q3_K super-blocks (110 bytes: u8 hmask[32], u8 qs[64], u8 scales[12],
// f16 d; an odd block starts half-way into a word), for one token, on 8-bit integer dot products over the limbs of
// x_limbs.comp layout 4 (x's order, one scale per super-block, Σ x per 16). A unit is 16 bytes of qs,
// qs[32h + 16t ..+ 16), with hmask[16t ..+ 16): bits 2j of the qs bytes and bit 4h + j of the hmask bytes are the
// codes q (0..7) of the 16 weights of sub-block 8h + 2j + t (j = 0..3), value d·(sc − 32)·(q − 4) with the 6-bit
// scale sc of the sub-block. Per row and unit the four sub-blocks' Σ q·L are weighted by sc − 32 in integers
// (|Σ| < 2^22) and become a float once: y += d·(s·Σ (sc − 32)·q·A − 4·Σ (sc − 32)·Σx).
// Measurements: docs/kernels.md, "Integer-dot GEMVs".
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_spirv_intrinsics : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 2;
layout(constant_id = 2) const uint ROWS_PER_INVOCATION = 2;  // NUM_ROWS must be a multiple

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uint wq1[]; };
layout(std430, binding = 2) readonly buffer Limbs { uvec4 limb4[]; };
layout(std430, binding = 2) readonly buffer LimbFloats { float limbf[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;
#include "gemv_row_sets.glsl"

#include "int_dot.glsl"

#include "words.glsl"

// Four words of the block from its byte `off` (a multiple of 4): five loads, the fifth used by odd blocks.
uvec4 block_words(uint at, uint off, bool odd) {
  const uint m = (at + off) >> 2u;
  const uint w0 = wq1[m], w1 = wq1[m + 1u], w2 = wq1[m + 2u], w3 = wq1[m + 3u], w4 = wq1[m + 4u];
  return odd ? uvec4(mid_word(w0, w1), mid_word(w1, w2), mid_word(w2, w3), mid_word(w3, w4)) : uvec4(w0, w1, w2, w3);
}

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barrier below stays uniform
  const uint set = gl_LocalInvocationID.x / SET_SIZE, lane = gl_LocalInvocationID.x % SET_SIZE;
  const uint rows = row0 + set * ROWS_PER_INVOCATION;
  const uint n_blocks = p.n_in / 256u;
  const uint plane = p.n_in / 16u;  // uvec4s per limb plane
  const uint scales = 3u * p.n_in / 4u;
  const uint sums = scales + p.n_in / 32u;

  float acc[ROWS_PER_INVOCATION];
  [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) acc[r] = 0.0;

  for (uint u = lane; u < 4u * n_blocks; u += SET_SIZE) {
    const uint b = u >> 2u, h = (u >> 1u) & 1u, t = u & 1u;
    uvec4 q[ROWS_PER_INVOCATION], hm[ROWS_PER_INVOCATION], sw[ROWS_PER_INVOCATION];
    float d[ROWS_PER_INVOCATION];
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const uint blk = min(rows + r, p.n_out - 1u) * n_blocks + b, at = 110u * blk;
      const bool odd = (blk & 1u) != 0u;
      q[r] = block_words(at, 32u + 32u * h + 16u * t, odd);
      hm[r] = block_words(at, 16u * t, odd);
      // scales[0..12) and d: four words from byte 96 (an odd block's d is the high half of the fourth).
      const uint m = (at + 96u) >> 2u;
      const uint s0 = wq1[m], s1 = wq1[m + 1u], s2 = wq1[m + 2u], s3 = wq1[m + 3u];
      // Shifted by 8t: scales[2j + t] at bit 16(j & 1) of .x (j < 2) or .y, scales[8 + 2(j & 1) + t] of .z.
      sw[r] = (odd ? uvec4(mid_word(s0, s1), mid_word(s1, s2), mid_word(s2, s3), 0u) : uvec4(s0, s1, s2, 0u)) >> (8u * t);
      d[r] = unpackHalf2x16(odd ? s3 >> 16u : s3).x;
    }
    ivec3 dot[ROWS_PER_INVOCATION];
    float offs[ROWS_PER_INVOCATION];
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      dot[r] = ivec3(0);
      offs[r] = 0.0;
    }
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      const uint g = 16u * b + 8u * h + 2u * j + t;  // the sub-block: its limbs' uvec4 and its Σ x
      const uvec4 l0 = limb4[g], l1 = limb4[plane + g], l2 = limb4[2u * plane + g];
      const float sx = limbf[sums + g];
      [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
        ivec3 e = ivec3(0);
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
          const uint c = ((q[r][k] >> (2u * j)) & 0x03030303u) | (((hm[r][k] >> (4u * h + j)) & 0x01010101u) << 2u);
          e += limb_dot(c, l0[k], l1[k], l2[k]);
        }
        const uint half_ = 16u * (j & 1u);
        const uint lo4 = (sw[r][j >> 1u] >> (half_ + 4u * h)) & 15u;
        const uint hi2 = (sw[r].z >> (half_ + 2u * (2u * h + (j >> 1u)))) & 3u;
        const int sc = int(lo4 | (hi2 << 4u)) - 32;
        dot[r] += sc * e;
        offs[r] += float(sc) * sx;
      }
    }
    const float s = limbf[scales + b];
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r)
      acc[r] += d[r] * (s * limb_value_signed22(dot[r]) - 4.0 * offs[r]);
  }

  write_row_sums(acc, set, row0);
}
