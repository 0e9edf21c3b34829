// IQ4_NL units (wunit.glsl): a unit is one block, 18 bytes { f16 d; u8 qs[16] } at byte 18·b (Q4_0's geometry);
// weight j < 16 is entry (low nibble of qs[j]) of GGML's table kvalues_iq4nl, weight j >= 16 entry (high nibble of
// qs[j - 16]), value d·kvalues[q] (wunit.glsl: IQ4_LEVELS, and UNIT_SHARED_TABLE). An even block starts on a
// word, an odd one half-way into one; five words hold either.
#define UNIT_WORDS 6
#define UNIT_HAS_DOT
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

// qs[4e .. 4e + 4) as a word.
uint iq4_nl_word(WUnit r, uint e) { return r.odd != 0u ? r.w[e + 1u] : mid_word(r.w[e], r.w[e + 1u]); }

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const f16vec2 d = f16vec2(unpackFloat2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x);
  const float16_t bias = float16_t(128.0);
#define IQ4_PAIR(v) packFloat2x16(codes_minus(v, bias) * d)
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint a = iq4_nl_word(r, 2u * e), b = iq4_nl_word(r, 2u * e + 1u);
    const uint la = iq4_levels4(a), lb = iq4_levels4(b), ha = iq4_levels4(a >> 4u), hb = iq4_levels4(b >> 4u);
    h[e] = uvec4(IQ4_PAIR(bytes01(la)), IQ4_PAIR(bytes23(la)), IQ4_PAIR(bytes01(lb)), IQ4_PAIR(bytes23(lb)));
    h[e + 2u] = uvec4(IQ4_PAIR(bytes01(ha)), IQ4_PAIR(bytes23(ha)), IQ4_PAIR(bytes01(hb)), IQ4_PAIR(bytes23(hb)));
  }
#undef IQ4_PAIR
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const float d = unpackHalf2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x;
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint q = iq4_nl_word(r, e);
    f[e] = d * iq4_values(q);
    f[e + 4u] = d * iq4_values(q >> 4u);
  }
}

// Σ w·x, and acc += g·w (wunit.glsl), with the scale applied once: d·Σ kvalues[q]·x.
float unit_dot_f32(WUnit r, vec4 x[2u * UNIT_VECS], vec2 sx) {
  vec4 a = vec4(0.0);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint q = iq4_nl_word(r, e);
    a = fma(iq4_values(q), x[e], a);
    a = fma(iq4_values(q >> 4u), x[e + 4u], a);
  }
  return unpackHalf2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x * ((a.x + a.y) + (a.z + a.w));
}
void unit_axpy_f32(WUnit r, float g, inout vec4 acc[2u * UNIT_VECS], inout vec2 off) {
  const vec4 gd = vec4(g * unpackHalf2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint q = iq4_nl_word(r, e);
    acc[e] = fma(gd, iq4_values(q), acc[e]);
    acc[e + 4u] = fma(gd, iq4_values(q >> 4u), acc[e + 4u]);
  }
}

// For the integer-dot GEMV (unit_gemv_dot.comp): the levels of weights 4e .. 4e + 3 as int8 bytes, qs[4k ..
// 4k + 4) (the nibbles of weights 4k .. and 16 + 4k ..), and (d, d, 0, 0).
#define UNIT_SIGNED_CODES
uint unit_nibbles(WUnit r, uint k) { return iq4_nl_word(r, k); }
uint unit_codes(WUnit r, uint e) { return iq4_levels4(iq4_nl_word(r, e & 3u) >> (e < 4u ? 0u : 4u)) ^ 0x80808080u; }
vec4 unit_affine(WUnit r) {
  const float d = unpackHalf2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x;
  return vec4(d, d, 0.0, 0.0);
}
