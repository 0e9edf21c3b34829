// Q4_K units (wunit.glsl): a unit is sub-block j (0..7) of a 144-byte super-block { f16 d, dmin; u8 scales[12];
// u8 qs[128] } (9 uvec4s, so every block lies on 16 bytes): sub-block j keeps its 32 codes in the low (even j)
// or high (odd j) nibbles of qs[32·(j/2) ..], value d·sc·q − dmin·m with (sc, m) its 6-bit pair
// (q4_k.glsl: q4_k_scales_mins); f32: (d·sc)·q − (dmin·m). Three uvec4 loads: the header and the 32 bytes of the
// chunk.
#include "q4_k.glsl"

#define UNIT_WORDS 13
#define UNIT_CODE_BITS 4
struct WUnit {
  uvec4 head;
  uvec4 q[2];
  uint j;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint b = row * (n_in >> 8u) + (u >> 3u), j = u & 7u, i = 9u * b;
  WUnit r;
  r.head = wq4[i];
  r.q[0] = wq4[i + 1u + 2u * (j >> 1u)];
  r.q[1] = wq4[i + 2u + 2u * (j >> 1u)];
  r.j = j;
  return r;
}

#ifndef UNIT_F32_ONLY
// w = (q·ds) − dm in f16, each step rounded once: `precise` keeps a device from fusing the two into one fma (not
// every device would) or from skipping the rounding of ds and dm to f16, so every device decodes the same bits.
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const vec2 dm = unpackHalf2x16(r.head.x);
  const uvec4 sm = q4_k_scales_mins(r.head.y, r.head.z, r.head.w);
  const uint sh = 8u * (r.j & 3u);
  const uint sc = ((r.j < 4u ? sm.x : sm.y) >> sh) & 0xFFu, m = ((r.j < 4u ? sm.z : sm.w) >> sh) & 0xFFu;
  const f16vec2 ds = f16vec2(float16_t(dm.x * float(sc))), dmin = f16vec2(float16_t(dm.y * float(m)));
  const bool high = (r.j & 1u) != 0u;
  const float16_t zero = float16_t(0.0);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uvec4 v = r.q[e >> 1u];
    const uint a = (e & 1u) == 0u ? v.x : v.z, b = (e & 1u) == 0u ? v.y : v.w;
    const uvec4 pairs = high ? uvec4(hi_nibbles01(a), hi_nibbles23(a), hi_nibbles01(b), hi_nibbles23(b))
                             : uvec4(lo_nibbles01(a), lo_nibbles23(a), lo_nibbles01(b), lo_nibbles23(b));
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
  const uvec4 sm = q4_k_scales_mins(r.head.y, r.head.z, r.head.w);
  const uint sh = 8u * (r.j & 3u);
  const uint sc = ((r.j < 4u ? sm.x : sm.y) >> sh) & 0xFFu, m = ((r.j < 4u ? sm.z : sm.w) >> sh) & 0xFFu;
  const float d1 = dm.x * float(sc), m1 = dm.y * float(m);
  const bool high = (r.j & 1u) != 0u;
  [[unroll]] for (uint e = 0u; e < 8u; ++e) {
    const uint q = r.q[e >> 2u][e & 3u];
    precise const vec4 scaled = (high ? hi_nibbles_minus(q, 0.0) : lo_nibbles_minus(q, 0.0)) * d1;
    precise const vec4 w = scaled - m1;
    f[e] = w;
  }
}

// The codes (the sub-block's nibbles) of weights 4e .. 4e + 3, and (d·sc, d·sc, −dmin·m, −dmin·m).
uint unit_codes(WUnit r, uint e) { return (r.q[e >> 2u][e & 3u] >> (4u * (r.j & 1u))) & 0x0F0F0F0Fu; }
vec4 unit_affine(WUnit r) {
  const vec2 dm = unpackHalf2x16(r.head.x);
  const uvec4 sm = q4_k_scales_mins(r.head.y, r.head.z, r.head.w);
  const uint sh = 8u * (r.j & 3u);
  const uint sc = ((r.j < 4u ? sm.x : sm.y) >> sh) & 0xFFu, m = ((r.j < 4u ? sm.z : sm.w) >> sh) & 0xFFu;
  const float d1 = dm.x * float(sc), m1 = dm.y * float(m);
  return vec4(d1, d1, -m1, -m1);
}
