#version 450
// Fused causal attention forward on cooperative matrices (tensor cores): attention_flash_fwd.comp's online
// softmax, with S = s·q·kᵀ and O += P·v as 16 x 16 x 16 f16 products into f32 accumulators. For devices with
// VK_NV_cooperative_matrix and subgroups of 32, head dims D that are multiples of 16 up to 128, and enough
// tokens to fill a tile (autograd/ops/attention.cpp picks it); same outputs: out [T, H*D] and LSE [H, T].
//
// Numerics stay near f32: s·q, k, v and P each enter as f16 hi + lo (split8_in_order: hi the value cut to 11
// significant bits, lo the exact rest rounded to f16), and each product takes hi·hi + hi·lo + lo·hi. Values
// must stay within f16's range (|x| < 65504).
//
// It uses attention_flash.glsl's layout with SPLIT = 1: DPL is the head dim D, TILE the BC keys of a tile,
// WG = 128 invocations = 4 subgroups. A workgroup takes 64 query rows of one head, 16 per subgroup, whose s·q
// stays in registers as 2·D/16 matrices. Per key tile (f16 hi/lo [key][d] in shared memory) each subgroup
// stores its 16 x BC block of S to its own shared area; two lanes per row mask it (causal, segments, T),
// update the row's running max m and sum l, and write P hi/lo over it. The rows' rescale factors enter the
// accumulators of O as a matrix loaded with stride 0 (row r: factor r).
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

layout(std430, binding = 0) writeonly buffer Out { float o_out[]; };
layout(std430, binding = 1) writeonly buffer Lse { float lse[]; };  // [H, T]
layout(std430, binding = 2) readonly buffer Q { vec4 q4[]; };
layout(std430, binding = 3) readonly buffer K { vec4 k4[]; };
layout(std430, binding = 4) readonly buffer V { vec4 v4[]; };
layout(std430, binding = 5) readonly buffer Seg { int seg[]; };
#define SEG_IDS seg
#include "attention_flash.glsl"
#include "f16_split.glsl"

#define F32_MAT fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16_MAT fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

const uint D = DPL, DF = D / 16u, BC = TILE, NSG = WG / 32u, BR = 16u * NSG;
const uint KS = D / 8u + 1u;          // row stride of the q, k and v tiles in uvec4s (8 halves; one of padding)
const uint SS = BC / 4u + 1u;         // row stride of a subgroup's S in uvec4s (4 floats)
const uint PS = BC / 8u + 1u;         // ... and of its P hi and P lo (8 halves)
const uint SP = 16u * SS > 32u * PS ? 16u * SS : 32u * PS;  // a subgroup's area: S, then P hi and P lo over it
// The tiles: k hi, k lo, v hi, v lo (before the loop: q hi, q lo over them), then the subgroups' areas.
const uint KH = 0u, KL = BC * KS, VH = 2u * BC * KS, VL = 3u * BC * KS, SP0 = 4u * BC * KS;
shared uvec4 tiles[SP0 + NSG * SP];
shared float rowf[BR];  // per row: the rescale factor of the step, then 1 / l

// Runs of 8 values of BR or BC rows as f16 hi/lo into tiles[hi], tiles[lo] (row stride KS): invocation-strided
// over the rows' D / 8 runs. Rows from T on are zero. The loads name their buffer (q4, k4 or v4) directly.
void put_split(uint hi, uint lo, uint row, uint g, vec4 a, vec4 b) {
  uvec4 h, l;
  split8_in_order(a, b, h, l);
  tiles[hi + row * KS + g] = h;
  tiles[lo + row * KS + g] = l;
}
#define STAGE_ROWS(buf, hi, lo, r0, n, stride, col0, scale)                                 \
  for (uint e = gl_LocalInvocationIndex; e < (n) * (D / 8u); e += WG) {                      \
    const uint row = e / (D / 8u), g = e % (D / 8u), src = (r0) + row;                        \
    const uint base = (min(src, u.T - 1u) * (stride) + (col0)) / 4u + 2u * g;                 \
    const bool ok = src < u.T;                                                                \
    put_split(hi, lo, row, g, ok ? (scale) * buf[base] : vec4(0.0), ok ? (scale) * buf[base + 1u] : vec4(0.0)); \
  }

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
  STAGE_ROWS(q4, KH, KH + BR * KS, i0, BR, qs, h * D, u.s)  // 2·BR rows fit in the 4·BC of the k and v tiles
  if (u.segmented != 0u) seg_range(i0, i_last + 1u - i0);
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
    if (u.segmented != 0u && !tile_meets(j0 / BC)) continue;  // uniform: a tile not loaded at all
    barrier();  // every subgroup is done with the previous tiles (and with q's)
    if (u.segmented != 0u && gl_LocalInvocationIndex < min(BC, u.T - j0))
      tile_seg[gl_LocalInvocationIndex] = seg[j0 + gl_LocalInvocationIndex];
    STAGE_ROWS(k4, KH, KL, j0, BC, kvs, hk * D, 1.0)
    STAGE_ROWS(v4, VH, VL, j0, BC, kvs, hk * D, 1.0)
    barrier();

    // S = s·q·kᵀ for the subgroup's 16 rows, BC / 16 matrices of 16 keys.
    [[unroll]] for (uint n = 0u; n < BC / 16u; ++n) {
      F32_MAT sc = F32_MAT(0.0);
      [[unroll]] for (uint f = 0u; f < DF; ++f) {
        F16_MAT kh16, kl16;
        coopMatLoadNV(kh16, tiles, KH + 16u * n * KS + 2u * f, KS, true);
        coopMatLoadNV(kl16, tiles, KL + 16u * n * KS + 2u * f, KS, true);
        sc = coopMatMulAddNV(qh[f], kh16, sc);
        sc = coopMatMulAddNV(qh[f], kl16, sc);
        sc = coopMatMulAddNV(ql[f], kh16, sc);
      }
      coopMatStoreNV(sc, tiles, area + 4u * n, SS, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // Row r's keys kh·BC/2 .. of the tile: mask, online softmax, P hi/lo over S.
    const uint HALF = BC / 2u;
    float s[HALF];
    [[unroll]] for (uint e = 0u; e < HALF / 4u; ++e) {
      const vec4 v = uintBitsToFloat(tiles[area + r * SS + kh * (HALF / 4u) + e]);
      [[unroll]] for (uint c = 0u; c < 4u; ++c) s[4u * e + c] = v[c];
    }
    float mt = -1.0 / 0.0;
    [[unroll]] for (uint e = 0u; e < HALF; ++e) {
      const uint c = kh * HALF + e, j = j0 + c;
      const bool ok = j <= i && j < u.T && (u.segmented == 0u || tile_seg[c] == my_seg);
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
    [[unroll]] for (uint e = 0u; e < HALF / 8u; ++e) {
      uvec4 hi, lo;
      split8_in_order(vec4(s[8u * e], s[8u * e + 1u], s[8u * e + 2u], s[8u * e + 3u]),
                      vec4(s[8u * e + 4u], s[8u * e + 5u], s[8u * e + 6u], s[8u * e + 7u]), hi, lo);
      tiles[ph + r * PS + kh * (HALF / 8u) + e] = hi;
      tiles[pl + r * PS + kh * (HALF / 8u) + e] = lo;
    }
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
        o[f] = coopMatMulAddNV(p_hi, vh16, o[f]);
        o[f] = coopMatMulAddNV(p_hi, vl16, o[f]);
        o[f] = coopMatMulAddNV(p_lo, vh16, o[f]);
      }
    }
    subgroupBarrier();  // rowf and the area are read before the next step writes them
  }

  // out = O / l; LSE = m + log(l).
  if (kh == 0u) rowf[16u * sg + r] = 1.0 / l;
  if (kh == 0u && i < u.T) lse[h * u.T + i] = m + log(l);
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  F32_MAT inv_l;
  coopMatLoadNV(inv_l, rowf, 16u * sg, 0u, true);
  [[unroll]] for (uint f = 0u; f < DF; ++f)
    [[unroll]] for (int e = 0; e < o[f].length(); ++e) o[f][e] *= inv_l[e];
  const uint row0 = i0 + 16u * sg;
  if (row0 + 16u <= u.T) {
    [[unroll]] for (uint f = 0u; f < DF; ++f) coopMatStoreNV(o[f], o_out, row0 * qs + h * D + 16u * f, qs, false);
    return;
  }
  // The last tile's rows past T: through the subgroup's area, the rows before T only.
  [[unroll]] for (uint f = 0u; f < DF; ++f) {
    coopMatStoreNV(o[f], tiles, area, 4u, false);  // 16 rows of 4 uvec4s
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
      const uint e = e0 + lane, row = row0 + e / 16u;
      if (row < u.T) o_out[row * qs + h * D + 16u * f + e % 16u] = uintBitsToFloat(tiles[area + e / 4u][e % 4u]);
    }
    subgroupBarrier();
  }
}
