#version 450
// Activations x[n_in] as integer limbs at one scale per group (int_dot.glsl has the layouts), for the
// integer-dot GEMVs: LAYOUT 0 for q4_0_gemv_dot.comp (groups of 32, x's order, Σ x per 32), 1 for
// q4_k_gemv_dot.comp (groups of 256 reordered into slots, Σ x per 16), 2 for q6_k_gemv_dot.comp (groups of
// 256 in unit order; its sums go unused), 3 for unit_gemv_dot.comp (groups of 32, x's order, Σ x per 16), 4 for
// q2_k_gemv_dot.comp and q3_k_gemv_dot.comp (groups of 256, x's order, Σ x per 16). A workgroup covers 256
// activations, each invocation 4 of them (one word of each plane); n_in is a multiple of 32 (of 256 for layouts 1,
// 2 and 4). LIMBS (2 or 3) as in int_dot.glsl.

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint LAYOUT = 0;
layout(constant_id = 1) const uint LIMBS = 3;  // 2: 16-bit limbs, the mixed precision's (int_dot.glsl)

layout(std430, binding = 0) writeonly buffer Limbs { uint limbs[]; };
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };
layout(push_constant) uniform Push { uint n_in; } p;

const uint GROUP = LAYOUT == 0u || LAYOUT == 3u ? 8u : 64u;  // invocations per scale group
const uint PIECE = LAYOUT == 1u || LAYOUT == 3u || LAYOUT == 4u ? 4u : 8u;   // invocations per Σ x
const float LIMB_MAX = LIMBS == 2u ? 32767.0 : 8388607.0;  // 2^15 - 1 or 2^23 - 1

shared float group_max[64];
shared float piece_sum[64];

void main() {
  const uint t = gl_LocalInvocationID.x;
  const uint e = gl_WorkGroupID.x * 256u + 4u * t;  // this invocation's first activation
  const bool live = e < p.n_in;
  const vec4 v = live ? x4[e / 4u] : vec4(0.0);
  const vec4 a = abs(v);
  group_max[t] = max(max(a.x, a.y), max(a.z, a.w));
  piece_sum[t] = (v.x + v.y) + (v.z + v.w);
  barrier();
  if (!live) return;
  const uint g0 = t / GROUP * GROUP;
  float m = 0.0;
  for (uint i = 0u; i < GROUP; ++i) m = max(m, group_max[g0 + i]);

  const float inv = m > 0.0 ? LIMB_MAX / m : 0.0;
  const uvec4 A = uvec4(clamp(ivec4(round(v * inv)), ivec4(-int(LIMB_MAX)), ivec4(int(LIMB_MAX))));
  const uvec4 b0 = A & 255u, b1 = (A >> 8u) & 255u, b2 = (A >> 16u) & 255u;  // two's complement bytes

  uint word = e / 4u;  // within a plane
  uint piece = LAYOUT == 3u || LAYOUT == 4u ? e / 16u : e / 32u;
  if (LAYOUT == 1u) {
    const uint o = 4u * t, c = o / 64u, r = o % 64u;
    const uint slot = r < 32u ? 2u * c + r / 16u : 8u + 2u * c + (r - 32u) / 16u;
    word = gl_WorkGroupID.x * 64u + slot * 4u + (r % 16u) / 4u;
    piece = gl_WorkGroupID.x * 16u + slot;
  } else if (LAYOUT == 2u) {
    // Activation 128h + 32·k4 + 8g + i of the block goes to unit 4h + g, byte 8·k4 + i.
    const uint o = 4u * t, h = o / 128u, k4 = (o % 128u) / 32u, l = o % 32u;
    word = gl_WorkGroupID.x * 64u + (4u * h + l / 8u) * 8u + 2u * k4 + (l % 8u) / 4u;
  }
  const uint P = p.n_in / 4u;
  limbs[word] = b0.x | (b0.y << 8u) | (b0.z << 16u) | (b0.w << 24u);
  limbs[P + word] = b1.x | (b1.y << 8u) | (b1.z << 16u) | (b1.w << 24u);
  if (LIMBS == 3u) limbs[2u * P + word] = b2.x | (b2.y << 8u) | (b2.z << 16u) | (b2.w << 24u);
  const uint scales = 3u * P, sums = scales + p.n_in / 32u;
  if (t % GROUP == 0u) limbs[scales + e / (GROUP * 4u)] = floatBitsToUint(m / LIMB_MAX);
  if (t % PIECE == 0u) {
    float s = 0.0;
    for (uint i = 0u; i < PIECE; ++i) s += piece_sum[t + i];
    limbs[sums + piece] = floatBitsToUint(s);
  }
}
