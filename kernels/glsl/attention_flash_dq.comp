#version 450
// Fused causal attention backward, first pass: dq (+)= s·Σ_j dS_ij k_j for ROWS query rows of one head per
// workgroup, recomputing P_ij = exp(s·q_i·k_j − LSE_i) tile by tile (attention_flash_fwd.comp), with
// dP_ij = dO_i·v_j and dS_ij = P_ij (dP_ij − Δ_i), Δ_i = dO_i·O_i. Also writes Δ [H, T] for the dK/dV pass.
#extension GL_GOOGLE_include_directive : require

layout(std430, binding = 0) buffer DQ { float dq_out[]; };
layout(std430, binding = 1) writeonly buffer Delta { float delta[]; };  // [H, T]
layout(std430, binding = 2) readonly buffer Q { float q[]; };
layout(std430, binding = 3) readonly buffer K { float k[]; };
layout(std430, binding = 4) readonly buffer V { float v[]; };
layout(std430, binding = 5) readonly buffer Out { float o[]; };
layout(std430, binding = 6) readonly buffer DOut { float dout[]; };
layout(std430, binding = 7) readonly buffer Lse { float lse[]; };
layout(std430, binding = 8) readonly buffer Seg { int seg[]; };
#define SEG_IDS seg
#define FLASH_KEY_TILES
#include "attention_flash.glsl"

void main() {
  const uint lid = gl_LocalInvocationIndex, part = lid % SPLIT, r = lid / SPLIT;
  const uint h = gl_WorkGroupID.y, hk = h / (u.H / u.Hkv);
  const uint i0 = gl_WorkGroupID.x * ROWS, i = i0 + r;
  const bool row_ok = i < u.T;
  const uint ic = min(i, u.T - 1u);
  const uint i_last = min(i0 + ROWS, u.T) - 1u;
  const uint qs = u.H * u.D;

  vec4 qr[DPL4], dor[DPL4], dq[DPL4];
  vec4 dd = vec4(0.0);
  for (uint t = 0u; t < DPL4; ++t) {
    const uint slot = part + SPLIT * t, base = ic * qs + h * u.D;
    qr[t] = LOAD_DIMS4(q, base, slot, u.s);
    dor[t] = LOAD_DIMS4(dout, base, slot, 1.0);
    dq[t] = vec4(0.0);
  }
  // Δ in the same form as dP below (the same fused multiply-adds in the same order), so that where O_i is
  // exactly one v_j (a lone token) dP − Δ is exactly 0, as in double.
  for (uint t = 0u; t < DPL4; ++t) {
    const vec4 ot = LOAD_DIMS4(o, ic * qs + h * u.D, part + SPLIT * t, 1.0);
    DOT_PARTIAL(dd, dor[t], ot);
  }
  const float dlt = row_sum(sum4(dd));
  if (row_ok && part == 0u) delta[h * u.T + i] = dlt;
  const float lse_i = lse[h * u.T + ic];
  const int my_seg = u.segmented != 0u ? seg[ic] : 0;
  if (u.segmented != 0u) seg_range(i0, i_last + 1u - i0);
  meet_hi = i_last;  // the key tiles asked about

  for (uint j0 = 0u; j0 <= i_last; j0 += TILE) {
    if (before_window(j0, TILE, i0)) continue;  // uniform: no row of the workgroup sees the tile
    if (!stage_key_tile(j0, hk)) continue;  // uniform
    for (uint c = 0u; c < TILE; ++c) {
      const uint j = j0 + c;
      vec4 a = vec4(0.0), b = vec4(0.0);
      for (uint t = 0u; t < DPL4; ++t) {
        DOT_PARTIAL(a, qr[t], ks[c * DP4 + part + SPLIT * t]);
        DOT_PARTIAL(b, dor[t], vs[c * DP4 + part + SPLIT * t]);
      }
      float dcap;
      const float sc = cap_score(row_sum(sum4(a)), dcap), dp = row_sum(sum4(b));
      const bool ok = row_ok && visible(i, j) && (u.segmented == 0u || tile_seg[c] == my_seg);
      const float ds = ok ? exp(sc - lse_i) * (dp - dlt) * dcap : 0.0;
      for (uint t = 0u; t < DPL4; ++t) dq[t] = fma(vec4(ds), ks[c * DP4 + part + SPLIT * t], dq[t]);
    }
  }
  if (!row_ok) return;
  for (uint t = 0u; t < DPL4; ++t)
    for (uint e = 0u; e < 4u; ++e) {
      const uint d = dim_of(part, t, e);
      if (d < u.D) dq_out[i * qs + h * u.D + d] += u.s * dq[t][e];
    }
}
