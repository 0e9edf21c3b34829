#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q2_K super-blocks (84 bytes: u8 scales[16], u8 qs[64], f16 d, dmin),
// for one token, on 8-bit integer dot products over the limbs of x_limbs.comp layout 4 (x's order, one scale per
// super-block, Σ x per 16). A unit is 16 bytes of qs, qs[32h + 16t ..+ 16): bits 2j of its bytes are the 16 weights
// of sub-block 8h + 2j + t (j = 0..3), so one unit's four code words give 64 weights of four sub-blocks, each of one
// scale byte (scale sc in the low nibble, min m in the high). Per row and unit the four sub-blocks' Σ q·L are
// weighted by sc in integers (|Σ| < 2^20) and become a float once: y += d·s·Σ sc·q·A − dmin·Σ m·Σx.
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
layout(std430, binding = 1) readonly buffer W { uint wq1[]; };  // 21 per block
layout(std430, binding = 2) readonly buffer Limbs { uvec4 limb4[]; };
layout(std430, binding = 2) readonly buffer LimbFloats { float limbf[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;
#include "gemv_row_sets.glsl"

#include "int_dot.glsl"

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
    uint q[ROWS_PER_INVOCATION][4], sc[ROWS_PER_INVOCATION][2];
    vec2 dm[ROWS_PER_INVOCATION];
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const uint blk = 21u * (min(rows + r, p.n_out - 1u) * n_blocks + b);
      [[unroll]] for (uint k = 0u; k < 4u; ++k) q[r][k] = wq1[blk + 4u + 8u * h + 4u * t + k];
      // scales[8h + 2j + t]: j = 0, 1 in the first word (bits 0 and 16 after the shift), j = 2, 3 in the second.
      sc[r][0] = wq1[blk + 2u * h] >> (8u * t);
      sc[r][1] = wq1[blk + 2u * h + 1u] >> (8u * t);
      dm[r] = unpackHalf2x16(wq1[blk + 20u]);
    }
    ivec3 dot[ROWS_PER_INVOCATION];
    float mins[ROWS_PER_INVOCATION];
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      dot[r] = ivec3(0);
      mins[r] = 0.0;
    }
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      const uint g = 16u * b + 8u * h + 2u * j + t;  // the sub-block: its limbs' uvec4 and its Σ x
      const uvec4 l0 = limb4[g], l1 = limb4[plane + g], l2 = limb4[2u * plane + g];
      const float sx = limbf[sums + g];
      [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
        ivec3 d = ivec3(0);
        [[unroll]] for (uint k = 0u; k < 4u; ++k)
          d += limb_dot((q[r][k] >> (2u * j)) & 0x03030303u, l0[k], l1[k], l2[k]);
        const uint s8 = (sc[r][j >> 1u] >> (16u * (j & 1u))) & 0xFFu;
        dot[r] += int(s8 & 15u) * d;
        mins[r] += float(s8 >> 4u) * sx;
      }
    }
    const float s = limbf[scales + b];
    [[unroll]] for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r)
      acc[r] += (dm[r].x * s) * limb_value(dot[r]) - dm[r].y * mins[r];
  }

  write_row_sums(acc, set, row0);
}
