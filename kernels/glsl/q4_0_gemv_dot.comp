#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q4_0 blocks, for one token, on 8-bit integer dot products. A
// workgroup owns NUM_ROWS rows in row sets of ROWS_PER_INVOCATION; an invocation takes whole blocks (a stride of
// SET_SIZE apart), loads the block's activations as limbs once (x_limbs.comp, one scale per block) and, for
// each of its rows, the block's 18 bytes as five words, whose quants it realigns when the block starts on a
// 16-bit boundary. Then y += d·(s·Σ q·A − 8·Σ x), with Σ q·A from eight dot instructions per limb.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_spirv_intrinsics : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 4;
layout(constant_id = 2) const uint ROWS_PER_INVOCATION = 4;  // NUM_ROWS must be a multiple

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
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
  const uint n_blocks = p.n_in / 32u;
  const uint row_bytes = n_blocks * 18u;
  const uint plane = p.n_in / 16u;  // uvec4s per limb plane
  const uint scales = 3u * p.n_in / 4u;
  const uint sums = scales + n_blocks;

  float acc[ROWS_PER_INVOCATION];
  for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) acc[r] = 0.0;

  for (uint b = lane; b < n_blocks; b += SET_SIZE) {
    // Limb words k = 0..7 of the block: activations 4k..4k+3, the low nibbles of quant word k (k < 4) and the
    // high nibbles of quant word k - 4.
    const uvec4 l0a = limb4[2u * b], l0b = limb4[2u * b + 1u];
    const uvec4 l1a = limb4[plane + 2u * b], l1b = limb4[plane + 2u * b + 1u];
    const uvec4 l2a = limb4[2u * plane + 2u * b], l2b = limb4[2u * plane + 2u * b + 1u];
    const float s = limbf[scales + b], sum_x = limbf[sums + b];
    for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const uint row = min(rows + r, p.n_out - 1u);
      const uint bb = row * row_bytes + b * 18u;  // even
      const uint w0 = bb >> 2u;
      const bool odd = (bb & 2u) != 0u;  // d in the high half of word w0, the quants in w0+1 .. w0+4
      const uint u0 = w[w0], u1 = w[w0 + 1u], u2 = w[w0 + 2u], u3 = w[w0 + 3u], u4 = w[w0 + 4u];
      const uvec4 qs = odd ? uvec4(u1, u2, u3, u4)
                           : uvec4((u0 >> 16u) | (u1 << 16u), (u1 >> 16u) | (u2 << 16u),
                                   (u2 >> 16u) | (u3 << 16u), (u3 >> 16u) | (u4 << 16u));
      const float d = unpackHalf2x16(odd ? u0 >> 16u : u0).x;
      const uvec4 lo = qs & 0x0F0F0F0Fu, hi = (qs >> 4u) & 0x0F0F0F0Fu;
      ivec3 q = ivec3(0);
      for (uint k = 0u; k < 4u; ++k) {
        q += limb_dot(lo[k], l0a[k], l1a[k], l2a[k]);
        q += limb_dot(hi[k], l0b[k], l1b[k], l2b[k]);
      }
      acc[r] += d * (s * limb_value(q) - 8.0 * sum_x);
    }
  }

  write_row_sums(acc, set, row0);
}
