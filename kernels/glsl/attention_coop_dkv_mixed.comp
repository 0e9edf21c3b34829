#version 450
// attention_coop_dkv.comp under the mixed precision (one f16 product per step), with Pᵀ and dSᵀ kept in registers:
//   dk_j (+)= s·Σ_{h in the head's group, i ≥ j} dS_ij q_i,   dv_j (+)= Σ P_ij dO_i,
// for BR key rows of one kv head per workgroup, 16 per subgroup, whose k and v stay in registers. Per query tile
// ((s·q) and γ·dO as f16 in shared memory, LSE and γ·Δ beside them) each subgroup forms, 16 queries at a time,
// Sᵀ = k·(s·q)ᵀ and dPᵀ = v·(γ·dO)ᵀ, then Pᵀ and dSᵀ element by element on the accumulators (the per-query
// values, the query and key indices and their segment ids enter as matrices loaded with stride 0, which repeat a
// row or a column), and multiplies them, rounded to f16, into dv and dk: no round trip through shared memory.
// Bindings, push constants and u.flags as in attention_coop_dkv.comp.
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
#define MIXED
#include "attention_coop.glsl"

// The tiles: (s·q) and γ·dO of the query tile (before the loop: k and v); after it, each subgroup's 64 uvec4s
// for the stores of edge rows.
const uint QH = 0u, OH = BC * KS, ROWS2 = 2u * (BC > BR ? BC : BR) * KS;
shared uvec4 tiles[ROWS2 > NSG * 64u ? ROWS2 : NSG * 64u];
// Per query of the tile: LSE, γ·Δ, the index and the segment id (as float bits); per key row of the workgroup its
// index and segment id.
shared float lse_sh[BC], delta_sh[BC], qi_sh[BC], qseg_sh[BC], kj_sh[BR], kseg_sh[BR];

// Pᵀ·P_SCALE = exp(Sᵀ − LSE)·P_SCALE over st and dSᵀ = Pᵀ ∘ (dPᵀ − γΔ) over dpt, for queries 16n .. 16n + 15 of
// the tile against the subgroup's keys (kj, kseg: each element's key index and id); zero where the query does
// not see the key.
void p_and_ds(inout F32_MAT st, inout F32_MAT dpt, uint n, F32_MAT kj, F32_MAT kseg) {
  F32_MAT lsem, dm, qi, qseg;
  coopMatLoadNV(lsem, lse_sh, 16u * n, 0u, false);  // stride 0, row-major: column c holds query 16n + c's
  coopMatLoadNV(dm, delta_sh, 16u * n, 0u, false);
  coopMatLoadNV(qi, qi_sh, 16u * n, 0u, false);
  coopMatLoadNV(qseg, qseg_sh, 16u * n, 0u, false);
  [[unroll]] for (int e = 0; e < st.length(); ++e) {
    const int i = int(qi[e]), j = int(kj[e]);
    const bool ok = i >= 0 && visible(uint(i), uint(j)) && uint(j) < u.T &&
                    (u.segmented == 0u || floatBitsToInt(qseg[e]) == floatBitsToInt(kseg[e]));
    const float p = ok ? exp(st[e] - lsem[e]) : 0.0;
    dpt[e] = ok ? p * (dpt[e] - dm[e]) : 0.0;
    st[e] = P_SCALE * p;
  }
}

void main() {
  const uint sg = gl_SubgroupID, lid = gl_LocalInvocationIndex;
  const uint hk = gl_WorkGroupID.y, G = u.H / u.Hkv;
  const uint j0 = gl_WorkGroupID.x * BR;
  const uint qs = u.H * u.D, kvs = u.Hkv * u.D;

  const float gamma = dout_scale();  // dO, dP and dS times γ

  // k and v into registers, through the tiles' space; the key rows' indices and ids.
  STAGE_F16(k4, 0u, j0, BR, kvs, hk * D, 1.0)
  STAGE_F16(v4, BR * KS, j0, BR, kvs, hk * D, 1.0)
  if (lid < BR) {
    kj_sh[lid] = float(j0 + lid);
    kseg_sh[lid] = u.segmented != 0u ? intBitsToFloat(seg[min(j0 + lid, u.T - 1u)]) : 0.0;
  }
  if (u.segmented != 0u) seg_range(j0, min(BR, u.T - j0));
  meet_lo = j0;  // the query tiles asked about
  barrier();
  F16_MAT kh16[DF], vh16[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) {
    const uint at = 16u * sg * KS + 2u * f;
    coopMatLoadNV(kh16[f], tiles, at, KS, false);
    coopMatLoadNV(vh16[f], tiles, BR * KS + at, KS, false);
  }
  // Element e of a 16 x 16 block: its key (row) index and id.
  F32_MAT kj, kseg;
  coopMatLoadNV(kj, kj_sh, 16u * sg, 0u, true);  // stride 0, column-major: row r holds kj_sh[16·sg + r]
  coopMatLoadNV(kseg, kseg_sh, 16u * sg, 0u, true);
  F32_MAT dk[DF], dv[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) dk[f] = dv[f] = F32_MAT(0.0);

  const bool split = (u.flags & 4u) != 0u;
  for (uint g = split ? gl_WorkGroupID.z : 0u; g < (split ? gl_WorkGroupID.z + 1u : G); ++g) {
    const uint h = hk * G + g;
    for (uint i0 = j0; i0 < u.T; i0 += BC) {
      if (before_window(j0, BR, i0)) break;  // uniform: this and every later query tile sees none of the keys
      if (u.segmented != 0u && !tile_meets(i0 / BC)) continue;  // uniform: a query tile not loaded at all
      barrier();  // every subgroup is done with the previous tiles (and with k's and v's)
      if (lid < BC) {
        const uint ic = min(i0 + lid, u.T - 1u);
        lse_sh[lid] = lse[h * u.T + ic];
        delta_sh[lid] = gamma * delta[h * u.T + ic];
        qi_sh[lid] = i0 + lid < u.T ? float(i0 + lid) : -1.0;  // a query past T sees no key
        qseg_sh[lid] = u.segmented != 0u ? intBitsToFloat(seg[ic]) : 0.0;
      }
      STAGE_F16(q4, QH, i0, BC, qs, h * D, u.s)
      STAGE_F16(do4, OH, i0, BC, qs, h * D, gamma)
      barrier();

      [[unroll]] for (uint n = 0u; n < BC / 16u; ++n) {
        // Sᵀ = k·(s·q)ᵀ and dPᵀ = v·(γ·dO)ᵀ for queries i0 + 16n .. + 15.
        F32_MAT st = F32_MAT(0.0), dpt = F32_MAT(0.0);
        [[unroll]] for (uint f = 0u; f < DF; ++f) {
          F16_MAT b;
          coopMatLoadNV(b, tiles, QH + 16u * n * KS + 2u * f, KS, true);
          st = coopMatMulAddNV(kh16[f], b, st);
          coopMatLoadNV(b, tiles, OH + 16u * n * KS + 2u * f, KS, true);
          dpt = coopMatMulAddNV(vh16[f], b, dpt);
        }
        p_and_ds(st, dpt, n, kj, kseg);
        F16_MAT p16 = F16_MAT(st), ds16 = F16_MAT(dpt);
        // dv += Pᵀ·dO, dk += dSᵀ·(s·q) over the 16 queries.
        [[unroll]] for (uint f = 0u; f < DF; ++f) {
          F16_MAT b;
          coopMatLoadNV(b, tiles, OH + 16u * n * KS + 2u * f, KS, false);
          dv[f] = coopMatMulAddNV(p16, b, dv[f]);
          coopMatLoadNV(b, tiles, QH + 16u * n * KS + 2u * f, KS, false);
          dk[f] = coopMatMulAddNV(ds16, b, dk[f]);
        }
      }
    }
  }

  barrier();  // every subgroup is done with the tiles: the edge rows' stores go through them
  const uint row0 = j0 + 16u * sg, area = 64u * sg;
  if (row0 >= u.T) return;
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
