#version 450
// Fused causal attention backward, second pass, on tensor cores (attention_coop.glsl): attention_flash_dkv.comp's
//   dk_j (+)= s·Σ_{h in the head's group, i ≥ j} dS_ij q_i,   dv_j (+)= Σ P_ij dO_i,
// for BR key rows of one kv head per workgroup, 16 per subgroup, whose k and v stay in registers as split
// matrices. Per query tile (s·q and dO hi/lo, LSE and Δ in shared memory) each subgroup stores its 16 x BC blocks
// of Sᵀ and dPᵀ to its own area; two lanes per key row form Pᵀ and dSᵀ and write them hi/lo over them, and dv
// accumulates Pᵀ·dO, dk dSᵀ·(s·q); dO, dP and dS are taken times γ (dout_scale). u.flags as in attention_flash_dkv.comp: bit 0 writes dK, bit 1 dV; with bit 2
// workgroup z takes query head g = z of the group alone and writes its sums, not adding, to slice g of dK and
// slice G + g of dV, both bound to one [2G, T, Hkv*D] scratch.
#extension GL_GOOGLE_include_directive : require

layout(std430, binding = 0) restrict buffer DK { float dk_out[]; };
layout(std430, binding = 1) restrict buffer DV { float dv_out[]; };
layout(std430, binding = 2) readonly restrict buffer Q { vec4 q4[]; };
layout(std430, binding = 3) readonly restrict buffer K { vec4 k4[]; };
layout(std430, binding = 4) readonly restrict buffer V { vec4 v4[]; };
layout(std430, binding = 5) readonly restrict buffer DOut { vec4 do4[]; };
layout(std430, binding = 6) readonly restrict buffer Lse { float lse[]; };
layout(std430, binding = 7) readonly restrict buffer Delta { float delta[]; };
layout(std430, binding = 8) readonly restrict buffer Seg { int seg[]; };
layout(std430, binding = 9) readonly restrict buffer DOutMax { float dout_max[]; };
layout(constant_id = 4) const uint DOUT_MAX_GROUPS = 64;
#define SEG_IDS seg
#define DOUT_MAX dout_max
#include "attention_coop.glsl"

// A subgroup's area: Sᵀ, then dPᵀ, then Pᵀ hi and lo and dSᵀ hi and lo over both.
const uint SP = 32u * SS > 64u * PS ? 32u * SS : 64u * PS;
// The tiles: (s·q) hi, lo, dO hi, lo of the query tile, then the subgroups' areas (before the loop: k and v
// hi/lo over all of it; the host keeps D ≤ 64, where 4·BR rows fit).
const uint QH = 0u, QL = BC * KS, OH = 2u * BC * KS, OL = 3u * BC * KS, SP0 = 4u * BC * KS;
shared uvec4 tiles[SP0 + NSG * SP];
shared float lse_sh[BC], delta_sh[BC];

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint hk = gl_WorkGroupID.y, G = u.H / u.Hkv;
  const uint j0 = gl_WorkGroupID.x * BR;
  const uint qs = u.H * u.D, kvs = u.Hkv * u.D;
  const uint r = lane >> 1u, kh = lane & 1u;  // the key row (of the subgroup's 16) and half of the tile of a lane
  const uint j = j0 + 16u * sg + r;
  const int my_seg = u.segmented != 0u ? seg[min(j, u.T - 1u)] : 0;
  const uint area = SP0 + sg * SP, p_h = area, p_l = area + 16u * PS, ds_h = area + 32u * PS,
             ds_l = area + 48u * PS;

  const float gamma = dout_scale();  // dO, dP and dS times γ

  // k and v into registers, through the tiles' space.
  STAGE_ROWS(k4, 0u, BR * KS, j0, BR, kvs, hk * D, 1.0)
  STAGE_ROWS(v4, 2u * BR * KS, 3u * BR * KS, j0, BR, kvs, hk * D, 1.0)
  if (u.segmented != 0u) seg_range(j0, min(BR, u.T - j0));
  meet_lo = j0;  // the query tiles asked about
  barrier();
  F16_MAT kh16[DF], kl16[DF], vh16[DF], vl16[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) {
    const uint at = 16u * sg * KS + 2u * f;
    coopMatLoadNV(kh16[f], tiles, at, KS, false);
    coopMatLoadNV(kl16[f], tiles, BR * KS + at, KS, false);
    coopMatLoadNV(vh16[f], tiles, 2u * BR * KS + at, KS, false);
    coopMatLoadNV(vl16[f], tiles, 3u * BR * KS + at, KS, false);
  }
  F32_MAT dk[DF], dv[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) dk[f] = dv[f] = F32_MAT(0.0);

  const bool split = (u.flags & 4u) != 0u;
  for (uint g = split ? gl_WorkGroupID.z : 0u; g < (split ? gl_WorkGroupID.z + 1u : G); ++g) {
    const uint h = hk * G + g;
    for (uint i0 = j0; i0 < u.T; i0 += BC) {
      if (before_window(j0, BR, i0)) break;  // uniform: this and every later query tile sees none of the keys
      if (u.segmented != 0u && !tile_meets(i0 / BC)) continue;  // uniform: a query tile not loaded at all
      barrier();  // every subgroup is done with the previous tiles (and with k's and v's)
      const uint lid = gl_LocalInvocationIndex;
      if (lid < BC) {
        const uint ic = min(i0 + lid, u.T - 1u);
        if (u.segmented != 0u) tile_seg[lid] = seg[ic];
        lse_sh[lid] = lse[h * u.T + ic];
        delta_sh[lid] = gamma * delta[h * u.T + ic];
      }
      STAGE_ROWS(q4, QH, QL, i0, BC, qs, h * D, u.s)
      STAGE_ROWS(do4, OH, OL, i0, BC, qs, h * D, gamma)
      barrier();

      // Sᵀ = k·(s·q)ᵀ and dPᵀ = v·dOᵀ, BC / 16 matrices of 16 queries each.
      [[unroll]] for (uint n = 0u; n < BC / 16u; ++n) {
        F32_MAT st = F32_MAT(0.0), dpt = F32_MAT(0.0);
        [[unroll]] for (uint f = 0u; f < DF; ++f) {
          F16_MAT bh, bl;
          coopMatLoadNV(bh, tiles, QH + 16u * n * KS + 2u * f, KS, true);
          coopMatLoadNV(bl, tiles, QL + 16u * n * KS + 2u * f, KS, true);
          MMA3(st, kh16[f], kl16[f], bh, bl);
          coopMatLoadNV(bh, tiles, OH + 16u * n * KS + 2u * f, KS, true);
          coopMatLoadNV(bl, tiles, OL + 16u * n * KS + 2u * f, KS, true);
          MMA3(dpt, vh16[f], vl16[f], bh, bl);
        }
        coopMatStoreNV(st, tiles, area + 4u * n, SS, false);
        coopMatStoreNV(dpt, tiles, area + 16u * SS + 4u * n, SS, false);
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();

      // Pᵀ and dSᵀ = Pᵀ ∘ (dPᵀ − Δ), zero where masked, hi/lo over Sᵀ and dPᵀ.
      float pv[HALF], dsv[HALF];
      GET_ROW(pv, area, r, kh)
      GET_ROW(dsv, area + 16u * SS, r, kh)
      [[unroll]] for (uint e = 0u; e < HALF; ++e) {
        const uint c = kh * HALF + e, i = i0 + c;
        const bool ok = visible(i, j) && i < u.T && j < u.T && (u.segmented == 0u || tile_seg[c] == my_seg);
        const float p = ok ? exp(pv[e] - lse_sh[c]) : 0.0;
        dsv[e] = ok ? p * (dsv[e] - delta_sh[c]) : 0.0;
        pv[e] = P_SCALE * p;
      }
      subgroupBarrier();  // every lane has read its Sᵀ and dPᵀ before Pᵀ and dSᵀ go over them
      PUT_SPLIT_ROW(p_h, p_l, r, kh, pv)
      PUT_SPLIT_ROW(ds_h, ds_l, r, kh, dsv)
      subgroupMemoryBarrierShared();
      subgroupBarrier();

      // dv += Pᵀ·dO, dk += dSᵀ·(s·q).
      [[unroll]] for (uint kk = 0u; kk < BC / 16u; ++kk) {
        F16_MAT ah, al;
        coopMatLoadNV(ah, tiles, p_h + 2u * kk, PS, false);
        coopMatLoadNV(al, tiles, p_l + 2u * kk, PS, false);
        [[unroll]] for (uint f = 0u; f < DF; ++f) {
          F16_MAT bh, bl;
          coopMatLoadNV(bh, tiles, OH + 16u * kk * KS + 2u * f, KS, false);
          coopMatLoadNV(bl, tiles, OL + 16u * kk * KS + 2u * f, KS, false);
          MMA3(dv[f], ah, al, bh, bl);
        }
        coopMatLoadNV(ah, tiles, ds_h + 2u * kk, PS, false);
        coopMatLoadNV(al, tiles, ds_l + 2u * kk, PS, false);
        [[unroll]] for (uint f = 0u; f < DF; ++f) {
          F16_MAT bh, bl;
          coopMatLoadNV(bh, tiles, QH + 16u * kk * KS + 2u * f, KS, false);
          coopMatLoadNV(bl, tiles, QL + 16u * kk * KS + 2u * f, KS, false);
          MMA3(dk[f], ah, al, bh, bl);
        }
      }
      subgroupBarrier();  // the area is read before the next step writes it
    }
  }

  const uint row0 = j0 + 16u * sg;
  if (row0 >= u.T) return;  // after the loop's barriers
  const uint slice = u.T * kvs;
  [[unroll]] for (uint f = 0u; f < DF; ++f)
    [[unroll]] for (int e = 0; e < dk[f].length(); ++e) {
      dk[f][e] /= gamma;
      dv[f][e] /= P_SCALE * gamma;
    }
  if (split) {
    STORE_ROWS(dk_out, dk, gl_WorkGroupID.z * slice, row0, hk * D, kvs, area)
    STORE_ROWS(dv_out, dv, (G + gl_WorkGroupID.z) * slice, row0, hk * D, kvs, area)
    return;
  }
  if ((u.flags & 1u) != 0u) ADD_ROWS(dk_out, dk, 0u, row0, hk * D, kvs, area)
  if ((u.flags & 2u) != 0u) ADD_ROWS(dv_out, dv, 0u, row0, hk * D, kvs, area)
}
