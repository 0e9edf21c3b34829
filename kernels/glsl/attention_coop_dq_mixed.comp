#version 450
// attention_coop_dq.comp under the mixed precision (one f16 product per step), with dS kept in registers:
//   dq (+)= s·Σ_j dS_ij k_j,  dS_ij = P_ij (dP_ij − Δ_i),  P_ij = exp(s·q_i·k_j − LSE_i),  dP_ij = dO_i·v_j,
// and Δ_i = dO_i·O_i [H, T] for the dK/dV pass. A workgroup takes BR query rows of one head, 16 per subgroup,
// whose s·q and γ·dO stay in registers. Per key tile (k and v as f16 in shared memory, the keys' indices and ids
// beside them) each subgroup forms, 16 keys at a time, S and dP, then dS element by element on the accumulators
// (the per-row and per-key values enter as matrices loaded with stride 0), and multiplies it, rounded to f16,
// into dq: no round trip through shared memory. Bindings and push constants as in attention_coop_dq.comp.
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
#define MIXED
#include "attention_coop.glsl"

// The tiles: k and v of the key tile (before the loop: s·q and γ·dO); after it, each subgroup's 64 uvec4s for
// the stores of edge rows.
const uint KH = 0u, VH = BC * KS, ROWS2 = 2u * (BC > BR ? BC : BR) * KS;
shared uvec4 tiles[ROWS2 > NSG * 64u ? ROWS2 : NSG * 64u];
// Per query row of the workgroup: LSE, γ·Δ, its index and segment id (as float bits); per key of the tile its
// index and id.
shared float lse_sh[BR], delta_sh[BR], qi_sh[BR], qseg_sh[BR], kj_sh[BC], kseg_sh[BC];

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, lid = gl_LocalInvocationIndex;
  const uint h = gl_WorkGroupID.y, hk = h / (u.H / u.Hkv);
  const uint i0 = gl_WorkGroupID.x * BR, i_last = min(i0 + BR, u.T) - 1u;
  const uint qs = u.H * u.D, kvs = u.Hkv * u.D;
  const uint r = lane >> 1u, kh = lane & 1u;  // the row (of the subgroup's 16) and half of D of a lane
  const uint i = i0 + 16u * sg + r, ic = min(i, u.T - 1u);

  // Δ_i = dO_i·O_i in f32, the row's two lanes each half of D.
  float dd = 0.0;
  for (uint d = kh * (D / 2u); d < (kh + 1u) * (D / 2u); ++d)
    dd = fma(dout[ic * qs + h * D + d], o[ic * qs + h * D + d], dd);
  const float dlt = dd + subgroupShuffleXor(dd, 1u);
  if (kh == 0u && i < u.T) delta[h * u.T + i] = dlt;
  const float gamma = dout_scale();  // dO, dP and dS times γ
  if (kh == 0u) {
    lse_sh[16u * sg + r] = lse[h * u.T + ic];
    delta_sh[16u * sg + r] = gamma * dlt;
    qi_sh[16u * sg + r] = i < u.T ? float(i) : -1.0;  // a row past T sees no key
    qseg_sh[16u * sg + r] = u.segmented != 0u ? intBitsToFloat(seg[ic]) : 0.0;
  }

  // s·q and γ·dO into registers, through the tiles' space.
  STAGE_F16(q4, 0u, i0, BR, qs, h * D, u.s)
  STAGE_F16(do4, BR * KS, i0, BR, qs, h * D, gamma)
  if (u.segmented != 0u) seg_range(i0, i_last + 1u - i0);
  meet_hi = i_last;  // the key tiles asked about
  barrier();
  F16_MAT qh[DF], doh[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) {
    const uint at = 16u * sg * KS + 2u * f;
    coopMatLoadNV(qh[f], tiles, at, KS, false);
    coopMatLoadNV(doh[f], tiles, BR * KS + at, KS, false);
  }
  // Element e of a 16 x 16 block: its row's LSE, γ·Δ, index and id.
  F32_MAT lsem, dm, qi, qseg;
  coopMatLoadNV(lsem, lse_sh, 16u * sg, 0u, true);  // stride 0, column-major: row r holds the row's value
  coopMatLoadNV(dm, delta_sh, 16u * sg, 0u, true);
  coopMatLoadNV(qi, qi_sh, 16u * sg, 0u, true);
  coopMatLoadNV(qseg, qseg_sh, 16u * sg, 0u, true);
  F32_MAT dq[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) dq[f] = F32_MAT(0.0);

  for (uint j0 = 0u; j0 <= i_last; j0 += BC) {
    if (before_window(j0, BC, i0)) continue;  // uniform: no row of the workgroup sees the tile
    if (u.segmented != 0u && !tile_meets(j0 / BC)) continue;  // uniform: a tile not loaded at all
    barrier();  // every subgroup is done with the previous tiles (and with q's and dO's)
    if (lid < BC) {
      kj_sh[lid] = j0 + lid < u.T ? float(j0 + lid) : 16777216.0;  // a key past T is seen by no row
      kseg_sh[lid] = u.segmented != 0u ? intBitsToFloat(seg[min(j0 + lid, u.T - 1u)]) : 0.0;
    }
    STAGE_F16(k4, KH, j0, BC, kvs, hk * D, 1.0)
    STAGE_F16(v4, VH, j0, BC, kvs, hk * D, 1.0)
    barrier();

    [[unroll]] for (uint n = 0u; n < BC / 16u; ++n) {
      // S = s·q·kᵀ and dP = γ·dO·vᵀ for keys j0 + 16n .. + 15.
      F32_MAT sc = F32_MAT(0.0), dp = F32_MAT(0.0);
      [[unroll]] for (uint f = 0u; f < DF; ++f) {
        F16_MAT b;
        coopMatLoadNV(b, tiles, KH + 16u * n * KS + 2u * f, KS, true);
        sc = coopMatMulAddNV(qh[f], b, sc);
        coopMatLoadNV(b, tiles, VH + 16u * n * KS + 2u * f, KS, true);
        dp = coopMatMulAddNV(doh[f], b, dp);
      }
      // dS = P ∘ (dP − γΔ), zero where the row does not see the key.
      F32_MAT kj, kseg;
      coopMatLoadNV(kj, kj_sh, 16u * n, 0u, false);  // stride 0, row-major: column c holds key 16n + c's
      coopMatLoadNV(kseg, kseg_sh, 16u * n, 0u, false);
      [[unroll]] for (int e = 0; e < sc.length(); ++e) {
        const int ie = int(qi[e]), je = int(kj[e]);
        const bool ok = ie >= 0 && visible(uint(ie), uint(je)) &&
                        (u.segmented == 0u || floatBitsToInt(qseg[e]) == floatBitsToInt(kseg[e]));
        sc[e] = ok ? exp(sc[e] - lsem[e]) * (dp[e] - dm[e]) : 0.0;
      }
      F16_MAT ds16 = F16_MAT(sc);
      // dq += dS·k over the 16 keys.
      [[unroll]] for (uint f = 0u; f < DF; ++f) {
        F16_MAT b;
        coopMatLoadNV(b, tiles, KH + 16u * n * KS + 2u * f, KS, false);
        dq[f] = coopMatMulAddNV(ds16, b, dq[f]);
      }
    }
  }

  barrier();  // every subgroup is done with the tiles: the edge rows' stores go through them
  const uint row0 = i0 + 16u * sg, area = 64u * sg;
  [[unroll]] for (uint f = 0u; f < DF; ++f)
    [[unroll]] for (int e = 0; e < dq[f].length(); ++e) dq[f][e] *= u.s / gamma;
  ADD_ROWS(dq_out, dq, 0u, row0, h * D, qs, area)
}
