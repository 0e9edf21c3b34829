// Q8_0 units (wunit.glsl): a unit is one block, 34 bytes { f16 d; i8 qs[32] } at byte 34·b, value d·q. An even
// block starts on a word, an odd one half-way into one; nine words hold either.
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

void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const bool even = r.odd == 0u;
  const f16vec2 d = f16vec2(unpackFloat2x16(even ? r.w[0] : r.w[0] >> 16u).x);
  const float16_t bias = float16_t(128.0);
  // XOR 0x80 makes each signed byte q the unsigned q + 128.
#define Q8_0_PAIR(v) packFloat2x16(codes_minus((v) ^ 0x00800080u, bias) * d)
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint a = even ? (r.w[2u * e] >> 16u) | (r.w[2u * e + 1u] << 16u) : r.w[2u * e + 1u];
    const uint b = even ? (r.w[2u * e + 1u] >> 16u) | (r.w[2u * e + 2u] << 16u) : r.w[2u * e + 2u];
    h[e] = uvec4(Q8_0_PAIR(bytes01(a)), Q8_0_PAIR(bytes23(a)), Q8_0_PAIR(bytes01(b)), Q8_0_PAIR(bytes23(b)));
  }
#undef Q8_0_PAIR
}
