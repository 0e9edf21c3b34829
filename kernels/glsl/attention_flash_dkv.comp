#version 450
// Fused causal attention backward, second pass: for ROWS key rows of one kv head per workgroup,
//   dk_j (+)= s·Σ_{h in the head's group, i ≥ j} dS_ij q_i,   dv_j (+)= Σ P_ij dO_i,
// walking the query tiles of each of the G query heads in order and recomputing P and dS from LSE and Δ
// (attention_flash_dq.comp wrote Δ). u.flags says which of dK, dV to write (bits 0, 1). With bit 2 (G > 1, for
// parallelism) workgroup z takes query head g = z of the group alone and writes its sums, not adding, to
// slice g of dK and slice G + g of dV, both bound to one [2G, T, Hkv*D] scratch; attention_dkv_reduce.comp then
// adds the slices in order.
#extension GL_GOOGLE_include_directive : require

layout(std430, binding = 0) buffer DK { float dk_out[]; };
layout(std430, binding = 1) buffer DV { float dv_out[]; };
layout(std430, binding = 2) readonly buffer Q { float q[]; };
layout(std430, binding = 3) readonly buffer K { float k[]; };
layout(std430, binding = 4) readonly buffer V { float v[]; };
layout(std430, binding = 5) readonly buffer DOut { float dout[]; };
layout(std430, binding = 6) readonly buffer Lse { float lse[]; };
layout(std430, binding = 7) readonly buffer Delta { float delta[]; };
layout(std430, binding = 8) readonly buffer Seg { int seg[]; };
#define SEG_IDS seg
#include "attention_flash.glsl"

shared float qsh[TILE * DP], dosh[TILE * DP];
shared float lse_sh[TILE], delta_sh[TILE];

void main() {
  const uint lid = gl_LocalInvocationIndex, part = lid % SPLIT, r = lid / SPLIT;
  const uint hk = gl_WorkGroupID.y, G = u.H / u.Hkv;
  const uint j0 = gl_WorkGroupID.x * ROWS, j = j0 + r;
  const bool key_ok = j < u.T;
  const uint jc = min(j, u.T - 1u);
  const uint qs = u.H * u.D, kvs = u.Hkv * u.D;

  float kr[DPL], vr[DPL], dk[DPL], dv[DPL];
  for (uint t = 0u; t < DPL; ++t) {
    const uint d = part + SPLIT * t;
    kr[t] = d < u.D ? k[jc * kvs + hk * u.D + d] : 0.0;
    vr[t] = d < u.D ? v[jc * kvs + hk * u.D + d] : 0.0;
    dk[t] = 0.0;
    dv[t] = 0.0;
  }
  const int my_seg = u.segmented != 0u ? seg[jc] : 0;
  if (u.segmented != 0u) seg_range(j0, min(ROWS, u.T - j0), 0u);

  const bool split = (u.flags & 4u) != 0u;
  for (uint g = split ? gl_WorkGroupID.z : 0u; g < (split ? gl_WorkGroupID.z + 1u : G); ++g) {
    const uint h = hk * G + g;
    for (uint i0 = j0; i0 < u.T; i0 += TILE) {
      barrier();
      for (uint e = lid; e < TILE * DP; e += 64u) {
        const uint c = e / DP, d = e % DP, i = i0 + c;
        const bool ok = i < u.T && d < u.D;
        qsh[e] = ok ? u.s * q[i * qs + h * u.D + d] : 0.0;
        dosh[e] = ok ? dout[i * qs + h * u.D + d] : 0.0;
      }
      const uint n_rows = min(TILE, u.T - i0);
      if (lid < n_rows) {
        lse_sh[lid] = lse[h * u.T + i0 + lid];
        delta_sh[lid] = delta[h * u.T + i0 + lid];
        if (u.segmented != 0u) tile_seg[lid] = seg[i0 + lid];
      }
      if (u.segmented != 0u) seg_range(i0, n_rows, 2u);
      barrier();
      if (u.segmented != 0u && (range[3] < range[0] || range[2] > range[1])) continue;  // uniform
      for (uint c = 0u; c < TILE; ++c) {
        const uint i = i0 + c;
        float a = 0.0, b = 0.0;
        for (uint t = 0u; t < DPL; ++t) {
          a += kr[t] * qsh[c * DP + part + SPLIT * t];
          b += vr[t] * dosh[c * DP + part + SPLIT * t];
        }
        const float sc = row_sum(a), dp = row_sum(b);
        const bool ok = key_ok && i < u.T && j <= i && (u.segmented == 0u || tile_seg[c] == my_seg);
        const float p = ok ? exp(sc - lse_sh[c]) : 0.0;
        const float ds = ok ? p * (dp - delta_sh[c]) : 0.0;
        for (uint t = 0u; t < DPL; ++t) {
          dv[t] += p * dosh[c * DP + part + SPLIT * t];
          dk[t] += ds * qsh[c * DP + part + SPLIT * t];
        }
      }
    }
  }
  if (!key_ok) return;
  const uint slice = u.T * kvs;
  for (uint t = 0u; t < DPL; ++t) {
    const uint d = part + SPLIT * t;
    if (d >= u.D) continue;
    const uint a = j * kvs + hk * u.D + d;
    if (split) {
      dk_out[gl_WorkGroupID.z * slice + a] = dk[t];
      dv_out[(G + gl_WorkGroupID.z) * slice + a] = dv[t];
      continue;
    }
    if ((u.flags & 1u) != 0u) dk_out[a] += dk[t];
    if ((u.flags & 2u) != 0u) dv_out[a] += dv[t];
  }
}
