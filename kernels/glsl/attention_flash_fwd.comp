#version 450
// Fused causal attention forward: out [T, H*D] and LSE [H, T] (the log of each row's softmax denominator, with
// its max: the backward recomputes the probabilities from it), without the [H, T, T] score matrix.
// A workgroup takes ROWS query rows of one head (gl_WorkGroupID.y) and walks the key tiles up to its last row,
// keeping per row the running max m, the running sum l of exp(s − m) and the output o rescaled whenever m grows
// (the online softmax). Key tiles whose segment ids cannot meet the rows' are skipped whole.
#extension GL_GOOGLE_include_directive : require

layout(std430, binding = 0) writeonly buffer Out { float o_out[]; };
layout(std430, binding = 1) writeonly buffer Lse { float lse[]; };  // [H, T]
layout(std430, binding = 2) readonly buffer Q { float q[]; };
layout(std430, binding = 3) readonly buffer K { float k[]; };
layout(std430, binding = 4) readonly buffer V { float v[]; };
layout(std430, binding = 5) readonly buffer Seg { int seg[]; };
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

  vec4 qr[DPL4], o[DPL4];
  for (uint t = 0u; t < DPL4; ++t) {
    qr[t] = LOAD_DIMS4(q, ic * qs + h * u.D, part + SPLIT * t, u.s);
    o[t] = vec4(0.0);
  }
  const int my_seg = u.segmented != 0u ? seg[ic] : 0;
  if (u.segmented != 0u) seg_range(i0, i_last + 1u - i0);
  meet_hi = i_last;  // the key tiles asked about
  float m = -1.0 / 0.0, l = 0.0;

  for (uint j0 = 0u; j0 <= i_last; j0 += TILE) {
    if (before_window(j0, TILE, i0)) continue;  // uniform: no row of the workgroup sees the tile
    if (!stage_key_tile(j0, hk)) continue;  // uniform
    for (uint c = 0u; c < TILE; ++c) {
      const uint j = j0 + c;
      vec4 dot_qk = vec4(0.0);
      for (uint t = 0u; t < DPL4; ++t) DOT_PARTIAL(dot_qk, qr[t], ks[c * DP4 + part + SPLIT * t]);
      float dcap;
      const float sc = cap_score(row_sum(sum4(dot_qk)), dcap);
      const bool ok = row_ok && visible(i, j) && (u.segmented == 0u || tile_seg[c] == my_seg);
      if (ok) {
        if (sc > m) {
          const float corr = exp(m - sc);
          l *= corr;
          for (uint t = 0u; t < DPL4; ++t) o[t] *= corr;
          m = sc;
        }
        const float p = exp(sc - m);
        l += p;
        for (uint t = 0u; t < DPL4; ++t) o[t] = fma(vec4(p), vs[c * DP4 + part + SPLIT * t], o[t]);
      }
    }
  }
  if (!row_ok) return;
  for (uint t = 0u; t < DPL4; ++t)
    for (uint e = 0u; e < 4u; ++e) {
      const uint d = dim_of(part, t, e);
      if (d < u.D) o_out[i * qs + h * u.D + d] = o[t][e] / l;
    }
  if (part == 0u) lse[h * u.T + i] = m + log(l);
}
