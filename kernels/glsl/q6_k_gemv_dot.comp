#version 450
// y[n_out] = W[n_out, n_in] · x[n_in], W in Q6_K super-blocks, for one token, on 8-bit integer dot products:
// the work split of q6_k_gemv.comp (row sets, units of 32 weights), with the activations as limbs (x_limbs.comp
// layout 2: one scale per super-block, a unit's 32 activations side by side). The codes become signed bytes
// q − 32 in place (add 96 to each byte, no carry since q < 64, and flip the top bit), so each quadrant's
// Σ (q − 32)·A is six dot instructions, exact in integers, weighted by the quadrant's int8 scale, and the unit's
// sum turns into a float once: y += d·s·Σ sc·(q − 32)·A.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_spirv_intrinsics : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 2;
layout(constant_id = 2) const uint ROWS_PER_INVOCATION = 2;  // NUM_ROWS must be a multiple

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer W2 { uvec2 w2[]; };  // the same words in pairs
layout(std430, binding = 2) readonly buffer Limbs { uvec4 limb4[]; };
layout(std430, binding = 2) readonly buffer LimbFloats { float limbf[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;
#include "gemv_row_sets.glsl"

#define Q6_K_WORDS w
#define Q6_K_PAIRS w2
#include "int_dot.glsl"
#include "q6_k.glsl"

// Σ over the unit's 32 weights of sc·(q − 32)·A for block blk, as the three limb sums. l[i][j]: limb plane i,
// quadrants 2j and 2j + 1 (two words each).
ivec3 unit_dot(uint blk, uint h, uint g, uvec4 l[3][2]) {
  const uint base = q6_k_base(blk);
  const uvec2 ql0 = q6_k_pair(base + 16u * h + 2u * g);
  const uvec2 ql1 = q6_k_pair(base + 16u * h + 8u + 2u * g);
  const uvec2 qh = q6_k_pair(base + Q6_K_QH + 8u * h + 2u * g);
  // Scales 2·k4 + g/2 in bytes 0 and 2.
  const uvec2 sw = q6_k_pair(base + Q6_K_SCALES + 2u * h) >> (8u * (g >> 1u));
  ivec3 sum = ivec3(0);
  for (uint k4 = 0u; k4 < 4u; ++k4) {
    const uvec2 ql = (k4 & 1u) != 0u ? ql1 : ql0;
    const uvec2 q = (uvec2(q6_k_quants(ql.x, qh.x, k4), q6_k_quants(ql.y, qh.y, k4)) + 0x60606060u) ^ 0x80808080u;
    const uint j = k4 >> 1u, c = 2u * (k4 & 1u);  // the quadrant's words c, c + 1 of l[.][j]
    const ivec3 s = limb_dot_signed(q.x, l[0][j][c], l[1][j][c], l[2][j][c]) +
                    limb_dot_signed(q.y, l[0][j][c + 1u], l[1][j][c + 1u], l[2][j][c + 1u]);
    sum += bitfieldExtract(int(sw[j]), int(8u * c), 8) * s;
  }
  return sum;
}

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barrier below stays uniform
  const uint set = gl_LocalInvocationID.x / SET_SIZE, lane = gl_LocalInvocationID.x % SET_SIZE;
  const uint rows = row0 + set * ROWS_PER_INVOCATION;
  const uint n_blocks = p.n_in / 256u;
  const uint n_units = n_blocks * 8u;
  const uint plane = p.n_in / 16u;  // uvec4s per limb plane
  const uint scales = 3u * p.n_in / 4u;

  float acc[ROWS_PER_INVOCATION];
  for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) acc[r] = 0.0;

  for (uint u = lane; u < n_units; u += SET_SIZE) {
    const uint b = u >> 3u, h = (u >> 2u) & 1u, g = u & 3u;
    uvec4 l[3][2];
    for (uint i = 0u; i < 3u; ++i)
      for (uint j = 0u; j < 2u; ++j) l[i][j] = limb4[i * plane + 16u * b + 2u * (4u * h + g) + j];
    const float s = limbf[scales + b];
    for (uint r = 0u; r < ROWS_PER_INVOCATION; ++r) {
      const uint row = min(rows + r, p.n_out - 1u);
      const uint blk = row * n_blocks + b;
      // |Σ| < 2^26 per part: float() rounds the first two at 2^-24 relative, as f32 sums would.
      const ivec3 i = unit_dot(blk, h, g, l);
      const float v = (float(i.x) + 256.0 * float(i.y)) + 65536.0 * float(i.z);
      acc[r] += q6_k_d(blk) * s * v;
    }
  }

  write_row_sums(acc, set, row0);
}
