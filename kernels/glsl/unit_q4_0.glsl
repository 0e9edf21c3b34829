// Q4_0 units (wunit.glsl): a unit is one block, 18 bytes { f16 d; u8 qs[16] } at byte 18·b; weight j < 16 is the
// low nibble of qs[j], weight j >= 16 the high nibble of qs[j - 16], value d·(q − 8) (f32: float(q − 8)·d). An
// even block starts on a word (d in the low half of its first word), an odd one half-way into one; five words
// hold either.
#define UNIT_WORDS 6
#define UNIT_CODE_BITS 4
struct WUnit {
  uint w[5];
  uint odd;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint b = row * (n_in >> 5u) + u, i = (b * 18u) >> 2u;
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 5u; ++e) r.w[e] = wq1[i + e];
  r.odd = b & 1u;
  return r;
}

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const bool even = r.odd == 0u;
  uint q[4];  // qs[0..16) as words
  [[unroll]] for (uint e = 0u; e < 4u; ++e) q[e] = even ? mid_word(r.w[e], r.w[e + 1u]) : r.w[e + 1u];
  const f16vec2 d = f16vec2(unpackFloat2x16(even ? r.w[0] : r.w[0] >> 16u).x);
  const float16_t bias = float16_t(8.0);
#define Q4_0_PAIR(v) packFloat2x16(codes_minus(v, bias) * d)
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint a = q[2u * e], b = q[2u * e + 1u];
    h[e] = uvec4(Q4_0_PAIR(lo_nibbles01(a)), Q4_0_PAIR(lo_nibbles23(a)), Q4_0_PAIR(lo_nibbles01(b)),
                 Q4_0_PAIR(lo_nibbles23(b)));
    h[e + 2u] = uvec4(Q4_0_PAIR(hi_nibbles01(a)), Q4_0_PAIR(hi_nibbles23(a)), Q4_0_PAIR(hi_nibbles01(b)),
                      Q4_0_PAIR(hi_nibbles23(b)));
  }
#undef Q4_0_PAIR
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const bool odd = r.odd != 0u;
  const float d = unpackHalf2x16(odd ? r.w[0] >> 16u : r.w[0]).x;
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint q = odd ? r.w[e + 1u] : mid_word(r.w[e], r.w[e + 1u]);  // qs[4e .. 4e + 4)
    f[e] = lo_nibbles_minus(q, 8.0) * d;
    f[e + 4u] = hi_nibbles_minus(q, 8.0) * d;
  }
}

// The codes (the nibbles) of weights 4e .. 4e + 3, and (d, d, −8d, −8d).
uint unit_codes(WUnit r, uint e) {
  const uint q = r.odd != 0u ? r.w[(e & 3u) + 1u] : mid_word(r.w[e & 3u], r.w[(e & 3u) + 1u]);
  return (e < 4u ? q : q >> 4u) & 0x0F0F0F0Fu;
}
vec4 unit_affine(WUnit r) {
  const float d = unpackHalf2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x;
  return vec4(d, d, -8.0 * d, -8.0 * d);
}
