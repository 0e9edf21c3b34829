// Q3_K units (wunit.glsl): a unit is sub-block s (0..7) of a 110-byte super-block { u8 hmask[32]; u8 qs[64];
// u8 scales[12]; f16 d } at byte 110·b (even: an odd block starts half-way into a word). With h = s / 4 and
// j = s % 4, weight l (0..31) of the unit has the code q = bits 2j .. 2j + 1 of qs[32h + l] plus 4 if bit 4h + j of
// hmask[l] is set, and the 6-bit scale sc of index i = 8h + 2j + l / 16: its low 4 bits the low (h = 0) or high
// (h = 1) nibble of scales[2j + l / 16], its high 2 bits bits 2(2h + j / 2) .. of scales[8 + 2(j % 2) + l / 16];
// value (d·(sc − 32))·(q − 4) (GGML's order, f32). Loads: 9 words for hmask, 9 for the 32 bytes of qs (either
// alignment), and the three 16-bit fields (the two scale pairs, d), each inside one word.
#define UNIT_WORDS 22
#define UNIT_CODE_BITS 3
struct WUnit {
  uint hm[9], qs[9];
  uint lo, hi, d;  // scales[2j], [2j + 1]; scales[8 + 2(j % 2)], [+ 1]; d: each in the word that holds it
  uint odd;        // the block starts half-way into a word
  uint s;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint b = row * (n_in >> 8u) + (u >> 3u), s = u & 7u, h = s >> 2u, j = s & 3u;
  const uint at = 110u * b, i = at >> 2u;  // the block's byte, and the word holding it
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 9u; ++e) r.hm[e] = wq1[i + e];
  [[unroll]] for (uint e = 0u; e < 9u; ++e) r.qs[e] = wq1[((at + 32u + 32u * h) >> 2u) + e];
  r.lo = wq1[(at + 96u + 2u * j) >> 2u];
  r.hi = wq1[(at + 104u + 2u * (j & 1u)) >> 2u];
  r.d = wq1[(at + 108u) >> 2u];
  r.odd = b & 1u;
  r.s = s;
  return r;
}

// The unit's two scales minus 32 (.xy, for weights 0-15 and 16-31) and d (.z), in f32.
vec3 q3_k_scales(WUnit r) {
  const uint h = r.s >> 2u, j = r.s & 3u;
  // A 16-bit field at an even byte of the block lies in the high half of its word iff the block is odd and
  // the byte is a multiple of 4, or the block is even and the byte is not (96 + 2j: j odd; 104 + 2(j % 2): j odd).
  const uint lo = r.lo >> (16u * ((r.odd ^ j) & 1u)), hi = r.hi >> (16u * ((r.odd ^ j) & 1u));
  const float d = unpackHalf2x16(r.d >> (16u * r.odd)).x;
  const uint sc = ((lo >> (4u * h)) & 0x0F0Fu) | (((hi >> (2u * (2u * h + (j >> 1u)))) & 0x0303u) << 4u);
  return vec3(float(int(sc & 0xFFu) - 32), float(int(sc >> 8u) - 32), d);
}

// The codes q (0..7) of weights 4e .. 4e + 3 as bytes.
uint q3_k_codes(WUnit r, uint e) {
  const bool odd = r.odd != 0u;
  const uint hm = odd ? mid_word(r.hm[e], r.hm[e + 1u]) : r.hm[e];
  const uint qs = odd ? mid_word(r.qs[e], r.qs[e + 1u]) : r.qs[e];
  const uint j = r.s & 3u;
  return ((qs >> (2u * j)) & 0x03030303u) | (((hm >> (4u * (r.s >> 2u) + j)) & 0x01010101u) << 2u);
}

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const vec3 s = q3_k_scales(r);
  const float16_t bias = float16_t(4.0);
  [[unroll]] for (uint t = 0u; t < 2u; ++t) {
    const f16vec2 ds = f16vec2(float16_t(s.z * s[t]));
    [[unroll]] for (uint e = 2u * t; e < 2u * t + 2u; ++e) {
      const uint a = q3_k_codes(r, 2u * e), b = q3_k_codes(r, 2u * e + 1u);
#define Q3_K_PAIR(v) packFloat2x16(codes_minus(v, bias) * ds)
      h[e] = uvec4(Q3_K_PAIR(bytes01(a)), Q3_K_PAIR(bytes23(a)), Q3_K_PAIR(bytes01(b)), Q3_K_PAIR(bytes23(b)));
#undef Q3_K_PAIR
    }
  }
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const vec3 s = q3_k_scales(r);
  [[unroll]] for (uint t = 0u; t < 2u; ++t) {
    const float dl = s.z * s[t];
    [[unroll]] for (uint e = 4u * t; e < 4u * t + 4u; ++e) f[e] = dl * bytes_minus(q3_k_codes(r, e), 4.0);
  }
}

// The codes q (0..7) of weights 4e .. 4e + 3, and (dl, dl', −4dl, −4dl') with dl = d·(sc − 32) of the two scales.
uint unit_codes(WUnit r, uint e) { return q3_k_codes(r, e); }
vec4 unit_affine(WUnit r) {
  const vec3 s = q3_k_scales(r);
  const float d0 = s.z * s.x, d1 = s.z * s.y;
  return vec4(d0, d1, -4.0 * d0, -4.0 * d1);
}
