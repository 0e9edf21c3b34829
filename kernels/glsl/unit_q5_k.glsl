// Q5_K units (wunit.glsl): a unit is sub-block j (0..7) of a 176-byte super-block { f16 d, dmin; u8 scales[12];
// u8 qh[32]; u8 qs[128] } (11 uvec4s, so every block lies on 16 bytes): weight l (0..31) of sub-block j is the low
// (even j) or high (odd j) nibble of qs[32·(j/2) + l] with bit j of qh[l] above it, value (d·sc)·q − (dmin·m) with
// (sc, m) the 6-bit pair of Q4_K (q4_k.glsl: q4_k_scales_mins). Five uvec4 loads: the header, qh and the 32 bytes
// of the chunk.
#include "q4_k.glsl"

#define UNIT_WORDS 21
#define UNIT_CODE_BITS 5
struct WUnit {
  uvec4 head;
  uvec4 qh[2];
  uvec4 q[2];
  uint j;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint b = row * (n_in >> 8u) + (u >> 3u), j = u & 7u, i = 11u * b;
  WUnit r;
  r.head = wq4[i];
  r.qh[0] = wq4[i + 1u];
  r.qh[1] = wq4[i + 2u];
  r.q[0] = wq4[i + 3u + 2u * (j >> 1u)];
  r.q[1] = wq4[i + 4u + 2u * (j >> 1u)];
  r.j = j;
  return r;
}

// The unit's (sc, m) as integers.
uvec2 q5_k_scale_min(WUnit r) {
  const uvec4 sm = q4_k_scales_mins(r.head.y, r.head.z, r.head.w);
  const uint sh = 8u * (r.j & 3u);
  return uvec2(((r.j < 4u ? sm.x : sm.y) >> sh) & 0xFFu, ((r.j < 4u ? sm.z : sm.w) >> sh) & 0xFFu);
}

// The 5-bit codes of weights 4e .. 4e + 3 as bytes.
uint q5_k_codes(WUnit r, uint e) {
  const uint qs = r.q[e >> 2u][e & 3u], qh = r.qh[e >> 2u][e & 3u];
  return ((qs >> (4u * (r.j & 1u))) & 0x0F0F0F0Fu) | (((qh >> r.j) & 0x01010101u) << 4u);
}

#ifndef UNIT_F32_ONLY
// (q·ds) − dm in f16 with ds and dm the f32 products rounded to f16, each step rounded once (as unit_q4_k.glsl).
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const vec2 dm = unpackHalf2x16(r.head.x);
  const uvec2 sm = q5_k_scale_min(r);
  const f16vec2 ds = f16vec2(float16_t(dm.x * float(sm.x))), dmin = f16vec2(float16_t(dm.y * float(sm.y)));
  const float16_t zero = float16_t(0.0);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint a = q5_k_codes(r, 2u * e), b = q5_k_codes(r, 2u * e + 1u);
    const uvec4 pairs = uvec4(bytes01(a), bytes23(a), bytes01(b), bytes23(b));
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      precise const f16vec2 scaled = codes_minus(pairs[c], zero) * ds;
      precise const f16vec2 w = scaled - dmin;
      h[e][c] = packFloat2x16(w);
    }
  }
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const vec2 dm = unpackHalf2x16(r.head.x);
  const uvec2 sm = q5_k_scale_min(r);
  const float d1 = dm.x * float(sm.x), m1 = dm.y * float(sm.y);
  [[unroll]] for (uint e = 0u; e < 8u; ++e) {
    precise const vec4 scaled = bytes_minus(q5_k_codes(r, e), 0.0) * d1;
    precise const vec4 w = scaled - m1;
    f[e] = w;
  }
}

// The 5-bit codes of weights 4e .. 4e + 3 (q5_k_codes), and (d·sc, d·sc, −dmin·m, −dmin·m).
uint unit_codes(WUnit r, uint e) { return q5_k_codes(r, e); }
vec4 unit_affine(WUnit r) {
  const vec2 dm = unpackHalf2x16(r.head.x);
  const uvec2 sm = q5_k_scale_min(r);
  const float d1 = dm.x * float(sm.x), m1 = dm.y * float(sm.y);
  return vec4(d1, d1, -m1, -m1);
}
