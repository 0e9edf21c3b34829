#version 450
// Fused causal attention backward, first pass, on tensor cores (attention_coop.glsl): attention_flash_dq.comp's
// dq (+)= s·Σ_j dS_ij k_j with dS_ij = P_ij (dP_ij − Δ_i), P_ij = exp(s·q_i·k_j − LSE_i) and dP_ij = dO_i·v_j;
// also writes Δ_i = dO_i·O_i [H, T] for the dK/dV pass. dO, dP and dS are taken times γ (dout_scale). A workgroup takes BR query rows of one head, 16 per
// subgroup, whose s·q and dO stay in registers as split matrices. Per key tile (k and v hi/lo in shared memory)
// each subgroup stores its 16 x BC blocks of S and dP to its own area; two lanes per row form dS and write it
// hi/lo over them, and dq accumulates dS·k.
#extension GL_GOOGLE_include_directive : require

layout(std430, binding = 0) restrict buffer DQ { float dq_out[]; };
layout(std430, binding = 1) writeonly restrict buffer Delta { float delta[]; };  // [H, T]
layout(std430, binding = 2) readonly restrict buffer Q { vec4 q4[]; };
layout(std430, binding = 3) readonly restrict buffer K { vec4 k4[]; };
layout(std430, binding = 4) readonly restrict buffer V { vec4 v4[]; };
layout(std430, binding = 5) readonly restrict buffer Out { float o[]; };
layout(std430, binding = 6) readonly restrict buffer DOut { vec4 do4[]; };
layout(std430, binding = 6) readonly restrict buffer DOutF { float dout[]; };
layout(std430, binding = 7) readonly restrict buffer Lse { float lse[]; };
layout(std430, binding = 8) readonly restrict buffer Seg { int seg[]; };
layout(std430, binding = 9) readonly restrict buffer DOutMax { float dout_max[]; };
layout(constant_id = 4) const uint DOUT_MAX_GROUPS = 64;
#define SEG_IDS seg
#define DOUT_MAX dout_max
#include "attention_coop.glsl"

// A subgroup's area: S, then dP, then dS hi and lo over both.
const uint SP = 32u * SS > 32u * PS ? 32u * SS : 32u * PS;
// The tiles: k hi, k lo, v hi, v lo, then the subgroups' areas (before the loop: s·q and dO hi/lo over all of
// it; the host keeps D ≤ 64, where 4·BR rows fit).
const uint KH = 0u, KL = BC * KS, VH = 2u * BC * KS, VL = 3u * BC * KS, SP0 = 4u * BC * KS;
shared uvec4 tiles[SP0 + NSG * SP];

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint h = gl_WorkGroupID.y, hk = h / (u.H / u.Hkv);
  const uint i0 = gl_WorkGroupID.x * BR, i_last = min(i0 + BR, u.T) - 1u;
  const uint qs = u.H * u.D, kvs = u.Hkv * u.D;
  const uint r = lane >> 1u, kh = lane & 1u;  // the row (of the subgroup's 16) and half of the tile of a lane
  const uint i = i0 + 16u * sg + r, ic = min(i, u.T - 1u);
  const int my_seg = u.segmented != 0u ? seg[ic] : 0;
  const uint area = SP0 + sg * SP, dsh = area, dsl = area + 16u * PS;

  // Δ_i = dO_i·O_i in f32, the row's two lanes each half of D.
  float dd = 0.0;
  for (uint d = kh * (D / 2u); d < (kh + 1u) * (D / 2u); ++d) dd = fma(dout[ic * qs + h * D + d], o[ic * qs + h * D + d], dd);
  const float dlt = dd + subgroupShuffleXor(dd, 1u);
  if (kh == 0u && i < u.T) delta[h * u.T + i] = dlt;
  const float lse_i = lse[h * u.T + ic];
  const float gamma = dout_scale(), dlt_g = gamma * dlt;  // dO, dP and dS times γ

  // s·q and dO into registers, through the tiles' space.
  STAGE_ROWS(q4, 0u, BR * KS, i0, BR, qs, h * D, u.s)
  STAGE_ROWS(do4, 2u * BR * KS, 3u * BR * KS, i0, BR, qs, h * D, gamma)
  if (u.segmented != 0u) seg_range(i0, i_last + 1u - i0);
  meet_hi = i_last;  // the key tiles asked about
  barrier();
  F16_MAT qh[DF], ql[DF], doh[DF], dol[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) {
    const uint at = 16u * sg * KS + 2u * f;
    coopMatLoadNV(qh[f], tiles, at, KS, false);
    coopMatLoadNV(ql[f], tiles, BR * KS + at, KS, false);
    coopMatLoadNV(doh[f], tiles, 2u * BR * KS + at, KS, false);
    coopMatLoadNV(dol[f], tiles, 3u * BR * KS + at, KS, false);
  }
  F32_MAT dq[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) dq[f] = F32_MAT(0.0);

  for (uint j0 = 0u; j0 <= i_last; j0 += BC) {
    if (before_window(j0, BC, i0)) continue;  // uniform: no row of the workgroup sees the tile
    if (u.segmented != 0u && !tile_meets(j0 / BC)) continue;  // uniform: a tile not loaded at all
    barrier();  // every subgroup is done with the previous tiles (and with q's and dO's)
    if (u.segmented != 0u && gl_LocalInvocationIndex < min(BC, u.T - j0))
      tile_seg[gl_LocalInvocationIndex] = seg[j0 + gl_LocalInvocationIndex];
    STAGE_ROWS(k4, KH, KL, j0, BC, kvs, hk * D, 1.0)
    STAGE_ROWS(v4, VH, VL, j0, BC, kvs, hk * D, 1.0)
    barrier();

    // S = s·q·kᵀ and dP = dO·vᵀ, BC / 16 matrices of 16 keys each.
    [[unroll]] for (uint n = 0u; n < BC / 16u; ++n) {
      F32_MAT sc = F32_MAT(0.0), dp = F32_MAT(0.0);
      [[unroll]] for (uint f = 0u; f < DF; ++f) {
        F16_MAT bh, bl;
        coopMatLoadNV(bh, tiles, KH + 16u * n * KS + 2u * f, KS, true);
        coopMatLoadNV(bl, tiles, KL + 16u * n * KS + 2u * f, KS, true);
        MMA3(sc, qh[f], ql[f], bh, bl);
        coopMatLoadNV(bh, tiles, VH + 16u * n * KS + 2u * f, KS, true);
        coopMatLoadNV(bl, tiles, VL + 16u * n * KS + 2u * f, KS, true);
        MMA3(dp, doh[f], dol[f], bh, bl);
      }
      coopMatStoreNV(sc, tiles, area + 4u * n, SS, false);
      coopMatStoreNV(dp, tiles, area + 16u * SS + 4u * n, SS, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // dS = P ∘ (dP − Δ), zero where masked, hi/lo over S and dP.
    float sv[HALF], dpv[HALF];
    GET_ROW(sv, area, r, kh)
    GET_ROW(dpv, area + 16u * SS, r, kh)
    [[unroll]] for (uint e = 0u; e < HALF; ++e) {
      const uint c = kh * HALF + e, j = j0 + c;
      const bool ok = visible(i, j) && j < u.T && (u.segmented == 0u || tile_seg[c] == my_seg);
      sv[e] = ok ? exp(sv[e] - lse_i) * (dpv[e] - dlt_g) : 0.0;
    }
    subgroupBarrier();  // every lane has read its S and dP before dS goes over them
    PUT_SPLIT_ROW(dsh, dsl, r, kh, sv)
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // dq += dS·k.
    [[unroll]] for (uint kk = 0u; kk < BC / 16u; ++kk) {
      F16_MAT ds_hi, ds_lo;
      coopMatLoadNV(ds_hi, tiles, dsh + 2u * kk, PS, false);
      coopMatLoadNV(ds_lo, tiles, dsl + 2u * kk, PS, false);
      [[unroll]] for (uint f = 0u; f < DF; ++f) {
        F16_MAT bh, bl;
        coopMatLoadNV(bh, tiles, KH + 16u * kk * KS + 2u * f, KS, false);
        coopMatLoadNV(bl, tiles, KL + 16u * kk * KS + 2u * f, KS, false);
        MMA3(dq[f], ds_hi, ds_lo, bh, bl);
      }
    }
    subgroupBarrier();  // the area is read before the next step writes it
  }

  const uint row0 = i0 + 16u * sg;
  [[unroll]] for (uint f = 0u; f < DF; ++f)
    [[unroll]] for (int e = 0; e < dq[f].length(); ++e) dq[f][e] *= u.s / gamma;
  ADD_ROWS(dq_out, dq, 0u, row0, h * D, qs, area)
}
