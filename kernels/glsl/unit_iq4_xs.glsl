// IQ4_XS units (wunit.glsl): a unit is sub-block s (0..7) of a 136-byte super-block { f16 d; u16 scales_h;
// u8 scales_l[4]; u8 qs[128] } (34 words, so every block starts on a word): its 6-bit scale is ls = bits 4s .. 4s + 3
// of scales_l (a little-endian u32) | bits 2s, 2s + 1 of scales_h << 4; weight l < 16 is entry (low nibble of
// qs[16s + l]) of GGML's table kvalues_iq4nl, weight l >= 16 entry (high nibble of qs[16s + l - 16]), value
// (d·(ls − 32))·kvalues[q] (wunit.glsl: IQ4_LEVELS, and UNIT_SHARED_TABLE). Six word loads.
#define UNIT_WORDS 6
#define UNIT_HAS_DOT
struct WUnit {
  uint w[6];  // d | scales_h << 16, scales_l, qs[16s .. 16s + 16)
  uint s;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint i = 34u * (row * (n_in >> 8u) + (u >> 3u)), s = u & 7u;
  WUnit r;
  r.w[0] = wq1[i];
  r.w[1] = wq1[i + 1u];
  [[unroll]] for (uint e = 0u; e < 4u; ++e) r.w[2u + e] = wq1[i + 2u + 4u * s + e];
  r.s = s;
  return r;
}

// d·(ls − 32) in f32.
float iq4_xs_scale(WUnit r) {
  const uint ls = ((r.w[1] >> (4u * r.s)) & 15u) | (((r.w[0] >> (16u + 2u * r.s)) & 3u) << 4u);
  return unpackHalf2x16(r.w[0]).x * float(int(ls) - 32);
}

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const f16vec2 ds = f16vec2(float16_t(iq4_xs_scale(r)));
  const float16_t bias = float16_t(128.0);
#define IQ4_PAIR(v) packFloat2x16(codes_minus(v, bias) * ds)
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uint a = r.w[2u + 2u * e], b = r.w[3u + 2u * e];
    const uint la = iq4_levels4(a), lb = iq4_levels4(b), ha = iq4_levels4(a >> 4u), hb = iq4_levels4(b >> 4u);
    h[e] = uvec4(IQ4_PAIR(bytes01(la)), IQ4_PAIR(bytes23(la)), IQ4_PAIR(bytes01(lb)), IQ4_PAIR(bytes23(lb)));
    h[e + 2u] = uvec4(IQ4_PAIR(bytes01(ha)), IQ4_PAIR(bytes23(ha)), IQ4_PAIR(bytes01(hb)), IQ4_PAIR(bytes23(hb)));
  }
#undef IQ4_PAIR
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const float dl = iq4_xs_scale(r);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    f[e] = dl * iq4_values(r.w[2u + e]);
    f[e + 4u] = dl * iq4_values(r.w[2u + e] >> 4u);
  }
}

// Σ w·x, and acc += g·w (wunit.glsl), with the scale applied once: (d·(ls − 32))·Σ kvalues[q]·x.
float unit_dot_f32(WUnit r, vec4 x[2u * UNIT_VECS], vec2 sx) {
  vec4 a = vec4(0.0);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint q = r.w[2u + e];
    a = fma(iq4_values(q), x[e], a);
    a = fma(iq4_values(q >> 4u), x[e + 4u], a);
  }
  return iq4_xs_scale(r) * ((a.x + a.y) + (a.z + a.w));
}
void unit_axpy_f32(WUnit r, float g, inout vec4 acc[2u * UNIT_VECS], inout vec2 off) {
  const vec4 gd = vec4(g * iq4_xs_scale(r));
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint q = r.w[2u + e];
    acc[e] = fma(gd, iq4_values(q), acc[e]);
    acc[e + 4u] = fma(gd, iq4_values(q >> 4u), acc[e + 4u]);
  }
}

// For the integer-dot GEMV (unit_gemv_dot.comp): the levels of weights 4e .. 4e + 3 as int8 bytes, qs[16s + 4k ..
// + 4) (the nibbles of weights 4k .. and 16 + 4k ..), and (dl, dl, 0, 0).
#define UNIT_SIGNED_CODES
uint unit_nibbles(WUnit r, uint k) { return r.w[2u + k]; }
uint unit_codes(WUnit r, uint e) { return iq4_levels4(r.w[2u + (e & 3u)] >> (e < 4u ? 0u : 4u)) ^ 0x80808080u; }
vec4 unit_affine(WUnit r) {
  const float dl = iq4_xs_scale(r);
  return vec4(dl, dl, 0.0, 0.0);
}
