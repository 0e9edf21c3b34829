// Q4_1 units (wunit.glsl): a unit is one block, 20 bytes { f16 d, m; u8 qs[16] } at byte 20·b (always on a word);
// weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j - 16], value d·q + m (f32:
// float(q)·d, then + m). Five words.
#define UNIT_WORDS 5
#define UNIT_CODE_BITS 4
struct WUnit {
  uint w[5];  // d | m << 16, then qs
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint i = 5u * (row * (n_in >> 5u) + u);
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 5u; ++e) r.w[e] = wq1[i + e];
  return r;
}

#ifndef UNIT_F32_ONLY
// (q·d) + m in f16, each step rounded once (`precise`: no fused multiply-add, as unit_q4_k.glsl).
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const f16vec2 dm = unpackFloat2x16(r.w[0]), d = dm.xx, m = dm.yy;
  const float16_t zero = float16_t(0.0);
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint a = r.w[1u + 2u * e], b = r.w[2u + 2u * e];
    const uvec4 lo = uvec4(lo_nibbles01(a), lo_nibbles23(a), lo_nibbles01(b), lo_nibbles23(b));
    const uvec4 hi = uvec4(hi_nibbles01(a), hi_nibbles23(a), hi_nibbles01(b), hi_nibbles23(b));
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      precise const f16vec2 sl = codes_minus(lo[c], zero) * d;
      precise const f16vec2 wl = sl + m;
      precise const f16vec2 sh = codes_minus(hi[c], zero) * d;
      precise const f16vec2 wh = sh + m;
      h[e][c] = packFloat2x16(wl);
      h[e + 2u][c] = packFloat2x16(wh);
    }
  }
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const vec2 dm = unpackHalf2x16(r.w[0]);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    precise const vec4 sl = lo_nibbles_minus(r.w[1u + e], 0.0) * dm.x;
    precise const vec4 sh = hi_nibbles_minus(r.w[1u + e], 0.0) * dm.x;
    precise const vec4 wl = sl + dm.y;
    precise const vec4 wh = sh + dm.y;
    f[e] = wl;
    f[e + 4u] = wh;
  }
}

// The codes (the nibbles) of weights 4e .. 4e + 3, and (d, d, m, m).
uint unit_codes(WUnit r, uint e) { return (e < 4u ? r.w[1u + e] : r.w[e - 3u] >> 4u) & 0x0F0F0F0Fu; }
vec4 unit_affine(WUnit r) { return unpackHalf2x16(r.w[0]).xxyy; }
