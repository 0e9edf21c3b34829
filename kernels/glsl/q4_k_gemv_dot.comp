#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q4_K super-blocks, for one token, on 8-bit integer dot products:
// the work split of q4_k_gemv.comp (row sets, 16-byte units walked with a stride of SET_SIZE), with the
// activations as limbs (x_limbs.comp layout 1: one scale per super-block, each unit's 16 + 16 activations in
// neighbouring slots). Per row and unit, Σ q·L of the two sub-blocks comes from dot instructions (four weights
// each, no nibble-to-float decode), is weighted by the 6-bit scales in integers, and becomes a float once:
// y += d·s·Σ sc·q·A − dmin·(m_lo·Σ x_lo + m_hi·Σ x_hi).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_spirv_intrinsics : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 4;
layout(constant_id = 2) const uint ROWS_PER_INVOCATION = 4;  // NUM_ROWS must be a multiple

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uvec4 w4[]; };  // 9 per block
layout(std430, binding = 2) readonly buffer Limbs { uvec4 limb4[]; };
layout(std430, binding = 2) readonly buffer LimbFloats { float limbf[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;
#include "gemv_row_sets.glsl"

#include "int_dot.glsl"
#include "q4_k.glsl"

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barrier below stays uniform
  const uint set = gl_LocalInvocationID.x / SET_SIZE, lane = gl_LocalInvocationID.x % SET_SIZE;
  const uint rows = row0 + set * ROWS_PER_INVOCATION;
  const uint n_blocks = p.n_in / 256u;
  const uint n_units = n_blocks * 8u;
  const uint plane = p.n_in / 16u;        // uvec4s per limb plane
  const uint scales = 3u * p.n_in / 4u;   // float index of the block scales
  const uint sums = scales + p.n_in / 32u;

  float acc[ROWS_PER_INVOCATION];
  for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) acc[r] = 0.0;

  for (uint u = lane; u < n_units; u += SET_SIZE) {
    const uint b = u >> 3u, c = (u >> 1u) & 3u, h = u & 1u;
    const uint slot = b * 16u + (u & 7u);  // the low nibbles' slot; the high ones' is 8 further
    const uvec4 l0 = limb4[slot], l1 = limb4[plane + slot], l2 = limb4[2u * plane + slot];
    const uvec4 h0 = limb4[slot + 8u], h1 = limb4[plane + slot + 8u], h2 = limb4[2u * plane + slot + 8u];
    const float s = limbf[scales + b];
    const float sum_l = limbf[sums + slot], sum_h = limbf[sums + slot + 8u];
    for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const uint row = min(rows + r, p.n_out - 1u);
      const uint blk = (row * n_blocks + b) * 9u;
      const uvec4 hd = w4[blk];
      const uvec4 qs = w4[blk + 1u + 2u * c + h];
      const uvec4 lo = qs & 0x0F0F0F0Fu, hi = (qs >> 4u) & 0x0F0F0F0Fu;
      ivec3 dl = ivec3(0), dh = ivec3(0);
      for (uint k = 0u; k < 4u; ++k) {
        dl += limb_dot(lo[k], l0[k], l1[k], l2[k]);
        dh += limb_dot(hi[k], h0[k], h1[k], h2[k]);
      }
      // The sub-blocks' 6-bit scales and mins (q4_k_chunk_scales, as integers): |sc·Σ| stays below 2^22.
      const uvec4 sm = q4_k_scales_mins(hd.y, hd.z, hd.w);
      const uvec2 pair = ((c < 2u ? sm.xz : sm.yw) >> ((c & 1u) * 16u)) & 0xFFFFu;
      const int sc_l = int(pair.x & 0xFFu), sc_h = int(pair.x >> 8u);
      const vec2 dm = unpackHalf2x16(hd.x);
      acc[r] += (dm.x * s) * limb_value(sc_l * dl + sc_h * dh) -
                dm.y * (q4_k_u2f(pair.y & 0xFFu) * sum_l + q4_k_u2f(pair.y >> 8u) * sum_h);
    }
  }

  write_row_sums(acc, set, row0);
}
