// Q8_0 units (wunit.glsl): a unit is one block, 34 bytes { f16 d; i8 qs[32] } at byte 34·b, value d·q (f32:
// float(q)·d). An even block starts on a word, an odd one half-way into one; nine words hold either.
#define UNIT_WORDS 10
struct WUnit {
  uint w[9];
  uint odd;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint b = row * (n_in >> 5u) + u, i = (b * 34u) >> 2u;
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 9u; ++e) r.w[e] = wq1[i + e];
  r.odd = b & 1u;
  return r;
}

// qs[4e .. 4e + 4) as a word.
uint q8_0_word(WUnit r, uint e) { return r.odd == 0u ? mid_word(r.w[e], r.w[e + 1u]) : r.w[e + 1u]; }

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const f16vec2 d = f16vec2(unpackFloat2x16(r.odd == 0u ? r.w[0] : r.w[0] >> 16u).x);
  const float16_t bias = float16_t(128.0);
  // XOR 0x80 makes each signed byte q the unsigned q + 128.
#define Q8_0_PAIR(v) packFloat2x16(codes_minus((v) ^ 0x00800080u, bias) * d)
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint a = q8_0_word(r, 2u * e), b = q8_0_word(r, 2u * e + 1u);
    h[e] = uvec4(Q8_0_PAIR(bytes01(a)), Q8_0_PAIR(bytes23(a)), Q8_0_PAIR(bytes01(b)), Q8_0_PAIR(bytes23(b)));
  }
#undef Q8_0_PAIR
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const float d = unpackHalf2x16(r.odd == 0u ? r.w[0] : r.w[0] >> 16u).x;
  [[unroll]] for (uint e = 0u; e < 8u; ++e) f[e] = bytes_minus(q8_0_word(r, e) ^ 0x80808080u, 128.0) * d;
}
