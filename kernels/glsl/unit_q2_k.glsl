// Q2_K units (wunit.glsl): a unit is sub-block s (0..7) of an 84-byte super-block { u8 scales[16]; u8 qs[64];
// f16 d, dmin } (21 words, so every block starts on a word). With h = s / 4 and j = s % 4, weight l (0..31) of the
// unit is bits 2j .. 2j + 1 of qs[32h + l], and sc = scales[8h + 2j + l / 16] gives its value
// (d·(sc & 15))·q − (dmin·(sc >> 4)) (GGML's order, f32). Ten word loads: the 8 words of qs, the word holding the
// two scale bytes and d | dmin << 16.
#define UNIT_WORDS 11
#define UNIT_CODE_BITS 2
struct WUnit {
  uint q[8];
  uint sc;  // the unit's two scale bytes in bits 0-15
  uint dm;
  uint shift;  // 2j
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint i = 21u * (row * (n_in >> 8u) + (u >> 3u)), h = (u >> 2u) & 1u, j = u & 3u;
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 8u; ++e) r.q[e] = wq1[i + 4u + 8u * h + e];
  r.sc = wq1[i + 2u * h + (j >> 1u)] >> (16u * (j & 1u));
  r.dm = wq1[i + 20u];
  r.shift = 2u * j;
  return r;
}

// d·(sc & 15) and dmin·(sc >> 4) of the unit's scale byte t (weights 16t ..), in f32.
vec2 q2_k_scales(WUnit r, uint t) {
  const vec2 dm = unpackHalf2x16(r.dm);
  const uint sc = (r.sc >> (8u * t)) & 0xFFu;
  return vec2(dm.x * float(sc & 15u), dm.y * float(sc >> 4u));
}

#ifndef UNIT_F32_ONLY
// (q·ds) − dm in f16 with ds and dm the f32 products rounded to f16, each step rounded once (as unit_q4_k.glsl).
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const float16_t zero = float16_t(0.0);
  [[unroll]] for (uint t = 0u; t < 2u; ++t) {
    const vec2 s = q2_k_scales(r, t);
    const f16vec2 ds = f16vec2(float16_t(s.x)), dmin = f16vec2(float16_t(s.y));
    [[unroll]] for (uint e = 2u * t; e < 2u * t + 2u; ++e) {
      const uint a = (r.q[2u * e] >> r.shift) & 0x03030303u, b = (r.q[2u * e + 1u] >> r.shift) & 0x03030303u;
      const uvec4 pairs = uvec4(bytes01(a), bytes23(a), bytes01(b), bytes23(b));
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        precise const f16vec2 scaled = codes_minus(pairs[c], zero) * ds;
        precise const f16vec2 w = scaled - dmin;
        h[e][c] = packFloat2x16(w);
      }
    }
  }
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  [[unroll]] for (uint t = 0u; t < 2u; ++t) {
    const vec2 s = q2_k_scales(r, t);
    [[unroll]] for (uint e = 4u * t; e < 4u * t + 4u; ++e) {
      precise const vec4 scaled = bytes_minus((r.q[e] >> r.shift) & 0x03030303u, 0.0) * s.x;
      precise const vec4 w = scaled - s.y;
      f[e] = w;
    }
  }
}

// The 2-bit codes of weights 4e .. 4e + 3, and (d·(sc & 15), .., −dmin·(sc >> 4), ..) of the two scale bytes.
uint unit_codes(WUnit r, uint e) { return (r.q[e] >> r.shift) & 0x03030303u; }
vec4 unit_affine(WUnit r) {
  const vec2 s0 = q2_k_scales(r, 0u), s1 = q2_k_scales(r, 1u);
  return vec4(s0.x, s1.x, -s0.y, -s1.y);
}
