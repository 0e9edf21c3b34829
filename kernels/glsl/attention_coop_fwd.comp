#version 450
// Fused causal attention forward on tensor cores (attention_coop.glsl): attention_flash_fwd.comp's online
// softmax with S = s·q·kᵀ and O += P·v as split f16 products; the same outputs, out [T, H*D] and LSE [H, T].
// A workgroup takes BR query rows of one head, 16 per subgroup, whose s·q stays in registers as 2·D/16
// matrices. Per key tile (f16 hi/lo [key][d] in shared memory) each subgroup stores its 16 x BC block of S to
// its own area; two lanes per row mask it (causal, segments, T), update the row's running max m and sum l and
// write P hi/lo over it. The rows' rescale factors enter O's accumulators as a matrix loaded with stride 0
// (row r: factor r).
#extension GL_GOOGLE_include_directive : require

layout(std430, binding = 0) writeonly restrict buffer Out { float o_out[]; };
layout(std430, binding = 1) writeonly restrict buffer Lse { float lse[]; };  // [H, T]
layout(std430, binding = 2) readonly restrict buffer Q { vec4 q4[]; };
layout(std430, binding = 3) readonly restrict buffer K { vec4 k4[]; };
layout(std430, binding = 4) readonly restrict buffer V { vec4 v4[]; };
layout(std430, binding = 5) readonly restrict buffer Seg { int seg[]; };
#define SEG_IDS seg
#include "attention_coop.glsl"

// A subgroup's area: S, then P hi and P lo over it.
const uint SP = 16u * SS > 32u * PS ? 16u * SS : 32u * PS;
// The tiles: k hi, k lo, v hi, v lo (before the loop: q hi, q lo over them; 2·BR rows fit in 4·BC), then the
// subgroups' areas. MIXED: k and v as f16 alone (q over them; BR rows fit in 2·BC), so the same shared memory
// holds key tiles of twice the rows (autograd/ops/attention.cpp picks TILE); the lo names alias the hi tiles,
// whose loads the one-product MMA3 never uses.
#ifdef MIXED
const uint KH = 0u, KL = KH, VH = BC * KS, VL = VH, SP0 = 2u * BC * KS;
#define STAGE_TILE(buf, hi, lo, r0, n, stride, col0, scale) STAGE_F16(buf, hi, r0, n, stride, col0, scale)
#else
const uint KH = 0u, KL = BC * KS, VH = 2u * BC * KS, VL = 3u * BC * KS, SP0 = 4u * BC * KS;
#define STAGE_TILE STAGE_ROWS
#endif
shared uvec4 tiles[SP0 + NSG * SP];
shared float rowf[BR];  // per row: the rescale factor of the step, then 1 / (P_SCALE·l)

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint h = gl_WorkGroupID.y, hk = h / (u.H / u.Hkv);
  const uint i0 = gl_WorkGroupID.x * BR, i_last = min(i0 + BR, u.T) - 1u;
  const uint qs = u.H * u.D, kvs = u.Hkv * u.D;
  const uint r = lane >> 1u, kh = lane & 1u;  // the softmax's row (of the subgroup's 16) and half of the tile
  const uint i = i0 + 16u * sg + r, ic = min(i, u.T - 1u);
  const int my_seg = u.segmented != 0u ? seg[ic] : 0;
  const uint area = SP0 + sg * SP, ph = area, pl = area + 16u * PS;

  // s·q into registers, through the k and v tiles' space.
  STAGE_TILE(q4, KH, KH + BR * KS, i0, BR, qs, h * D, u.s)
  if (u.segmented != 0u) seg_range(i0, i_last + 1u - i0);
  meet_hi = i_last;  // the key tiles asked about
  barrier();
  F16_MAT qh[DF], ql[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) {
    coopMatLoadNV(qh[f], tiles, KH + 16u * sg * KS + 2u * f, KS, false);
    coopMatLoadNV(ql[f], tiles, KH + BR * KS + 16u * sg * KS + 2u * f, KS, false);
  }
  F32_MAT o[DF];
  [[unroll]] for (uint f = 0u; f < DF; ++f) o[f] = F32_MAT(0.0);
  float m = -1.0 / 0.0, l = 0.0;

  for (uint j0 = 0u; j0 <= i_last; j0 += BC) {
    if (before_window(j0, BC, i0)) continue;  // uniform: no row of the workgroup sees the tile
    if (u.segmented != 0u && !tile_meets(j0 / BC)) continue;  // uniform: a tile not loaded at all
    barrier();  // every subgroup is done with the previous tiles (and with q's)
    if (u.segmented != 0u && gl_LocalInvocationIndex < min(BC, u.T - j0))
      tile_seg[gl_LocalInvocationIndex] = seg[j0 + gl_LocalInvocationIndex];
    STAGE_TILE(k4, KH, KL, j0, BC, kvs, hk * D, 1.0)
    STAGE_TILE(v4, VH, VL, j0, BC, kvs, hk * D, 1.0)
    barrier();

    // S = s·q·kᵀ for the subgroup's 16 rows, BC / 16 matrices of 16 keys.
    [[unroll]] for (uint n = 0u; n < BC / 16u; ++n) {
      F32_MAT sc = F32_MAT(0.0);
      [[unroll]] for (uint f = 0u; f < DF; ++f) {
        F16_MAT kh16, kl16;
        coopMatLoadNV(kh16, tiles, KH + 16u * n * KS + 2u * f, KS, true);
        coopMatLoadNV(kl16, tiles, KL + 16u * n * KS + 2u * f, KS, true);
        MMA3(sc, qh[f], ql[f], kh16, kl16);
      }
      coopMatStoreNV(sc, tiles, area + 4u * n, SS, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // Row r's keys kh·HALF .. of the tile: mask, online softmax, P hi/lo over S.
    float s[HALF];
    GET_ROW(s, area, r, kh)
    float mt = -1.0 / 0.0;
    [[unroll]] for (uint e = 0u; e < HALF; ++e) {
      const uint c = kh * HALF + e, j = j0 + c;
      const bool ok = visible(i, j) && j < u.T && (u.segmented == 0u || tile_seg[c] == my_seg);
      s[e] = ok ? s[e] : -1.0 / 0.0;
      mt = max(mt, s[e]);
    }
    mt = max(mt, subgroupShuffleXor(mt, 1u));
    const float m_new = max(m, mt);
    const float corr = m_new == -1.0 / 0.0 ? 1.0 : exp(m - m_new);
    float ps = 0.0;
    [[unroll]] for (uint e = 0u; e < HALF; ++e) {
      s[e] = m_new == -1.0 / 0.0 ? 0.0 : exp(s[e] - m_new);  // exp(-inf) = 0 for the masked keys
      ps += s[e];
    }
    ps += subgroupShuffleXor(ps, 1u);
    l = l * corr + ps;
    m = m_new;
    subgroupBarrier();  // every lane has read its S before P goes over it
    [[unroll]] for (uint e = 0u; e < HALF; ++e) s[e] *= P_SCALE;
    PUT_SPLIT_ROW(ph, pl, r, kh, s)
    if (kh == 0u) rowf[16u * sg + r] = corr;
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // O = O·corr + P·v.
    F32_MAT cm;
    coopMatLoadNV(cm, rowf, 16u * sg, 0u, true);  // stride 0, column-major: row r holds corr of row r
    [[unroll]] for (uint f = 0u; f < DF; ++f)
      [[unroll]] for (int e = 0; e < o[f].length(); ++e) o[f][e] *= cm[e];
    [[unroll]] for (uint kk = 0u; kk < BC / 16u; ++kk) {
      F16_MAT p_hi, p_lo;
      coopMatLoadNV(p_hi, tiles, ph + 2u * kk, PS, false);
      coopMatLoadNV(p_lo, tiles, pl + 2u * kk, PS, false);
      [[unroll]] for (uint f = 0u; f < DF; ++f) {
        F16_MAT vh16, vl16;
        coopMatLoadNV(vh16, tiles, VH + 16u * kk * KS + 2u * f, KS, false);
        coopMatLoadNV(vl16, tiles, VL + 16u * kk * KS + 2u * f, KS, false);
        MMA3(o[f], p_hi, p_lo, vh16, vl16);
      }
    }
    subgroupBarrier();  // rowf and the area are read before the next step writes them
  }

  // out = O / (P_SCALE·l); LSE = m + log(l).
  if (kh == 0u) rowf[16u * sg + r] = 1.0 / (P_SCALE * l);
  if (kh == 0u && i < u.T) lse[h * u.T + i] = m + log(l);
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  F32_MAT inv_l;
  coopMatLoadNV(inv_l, rowf, 16u * sg, 0u, true);
  [[unroll]] for (uint f = 0u; f < DF; ++f)
    [[unroll]] for (int e = 0; e < o[f].length(); ++e) o[f][e] *= inv_l[e];
  const uint row0 = i0 + 16u * sg;
  STORE_ROWS(o_out, o, 0u, row0, h * D, qs, area)
}
