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

shared vec4 qsh[TILE * DP4], dosh[TILE * DP4];
shared float lse_sh[TILE], delta_sh[TILE];

void main() {
  const uint lid = gl_LocalInvocationIndex, part = lid % SPLIT, r = lid / SPLIT;
  const uint hk = gl_WorkGroupID.y, G = u.H / u.Hkv;
  const uint j0 = gl_WorkGroupID.x * ROWS, j = j0 + r;
  const bool key_ok = j < u.T;
  const uint jc = min(j, u.T - 1u);
  const uint qs = u.H * u.D, kvs = u.Hkv * u.D;

  vec4 kr[DPL4], vr[DPL4], dk[DPL4], dv[DPL4];
  for (uint t = 0u; t < DPL4; ++t) {
    const uint slot = part + SPLIT * t, base = jc * kvs + hk * u.D;
    kr[t] = LOAD_DIMS4(k, base, slot, 1.0);
    vr[t] = LOAD_DIMS4(v, base, slot, 1.0);
    dk[t] = vec4(0.0);
    dv[t] = vec4(0.0);
  }
  const int my_seg = u.segmented != 0u ? seg[jc] : 0;
  if (u.segmented != 0u) seg_range(j0, min(ROWS, u.T - j0));
  meet_lo = j0;  // the query tiles asked about

  const bool split = (u.flags & 4u) != 0u;
  for (uint g = split ? gl_WorkGroupID.z : 0u; g < (split ? gl_WorkGroupID.z + 1u : G); ++g) {
    const uint h = hk * G + g;
    for (uint i0 = j0; i0 < u.T; i0 += TILE) {
      if (before_window(j0, ROWS, i0)) break;  // uniform: this and every later query tile sees none of the keys
      if (u.segmented != 0u && !tile_meets(i0 / TILE)) continue;  // uniform: a query tile not loaded at all
      barrier();
      const uint n_rows = min(TILE, u.T - i0);
      if (u.segmented != 0u && lid < n_rows) tile_seg[lid] = seg[i0 + lid];
      for (uint e = lid; e < TILE * DP4; e += WG) {
        const uint c = e / DP4, slot = e % DP4, i = i0 + c;
        const uint base = min(i, u.T - 1u) * qs + h * u.D;
        qsh[e] = i < u.T ? LOAD_DIMS4(q, base, slot, u.s) : vec4(0.0);
        dosh[e] = i < u.T ? LOAD_DIMS4(dout, base, slot, 1.0) : vec4(0.0);
      }
      if (lid < n_rows) {
        lse_sh[lid] = lse[h * u.T + i0 + lid];
        delta_sh[lid] = delta[h * u.T + i0 + lid];
      }
      barrier();
      for (uint c = 0u; c < TILE; ++c) {
        const uint i = i0 + c;
        vec4 a = vec4(0.0), b = vec4(0.0);
        for (uint t = 0u; t < DPL4; ++t) {
          DOT_PARTIAL(a, kr[t], qsh[c * DP4 + part + SPLIT * t]);
          DOT_PARTIAL(b, vr[t], dosh[c * DP4 + part + SPLIT * t]);
        }
        float dcap;
        const float sc = cap_score(row_sum(sum4(a)), dcap), dp = row_sum(sum4(b));
        const bool ok = key_ok && i < u.T && visible(i, j) && (u.segmented == 0u || tile_seg[c] == my_seg);
        const float p = ok ? exp(sc - lse_sh[c]) : 0.0;
        const float ds = ok ? p * (dp - delta_sh[c]) * dcap : 0.0;
        for (uint t = 0u; t < DPL4; ++t) {
          dv[t] = fma(vec4(p), dosh[c * DP4 + part + SPLIT * t], dv[t]);
          dk[t] = fma(vec4(ds), qsh[c * DP4 + part + SPLIT * t], dk[t]);
        }
      }
    }
  }
  if (!key_ok) return;
  const uint slice = u.T * kvs;
  for (uint t = 0u; t < DPL4; ++t)
    for (uint e = 0u; e < 4u; ++e) {
      const uint d = dim_of(part, t, e);
      if (d >= u.D) continue;
      const uint a = j * kvs + hk * u.D + d;
      if (split) {
        dk_out[gl_WorkGroupID.z * slice + a] = dk[t][e];
        dv_out[(G + gl_WorkGroupID.z) * slice + a] = dv[t][e];
        continue;
      }
      if ((u.flags & 1u) != 0u) dk_out[a] += dk[t][e];
      if ((u.flags & 2u) != 0u) dv_out[a] += dv[t][e];
    }
}
