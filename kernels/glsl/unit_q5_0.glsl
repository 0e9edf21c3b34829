// Q5_0 units (wunit.glsl): a unit is one block, 22 bytes { f16 d; u8 qh[4]; u8 qs[16] } at byte 22·b; weight j
// is the low (j < 16) or high (j >= 16) nibble of qs[j % 16] with bit j of qh (a little-endian u32) above it,
// value d·(q − 16) (f32: float(q − 16)·d). An even block starts on a word, an odd one half-way into one; six
// words hold either.
#define UNIT_WORDS 7
#define UNIT_CODE_BITS 5
struct WUnit {
  uint w[6];
  uint odd;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint b = row * (n_in >> 5u) + u, i = (b * 22u) >> 2u;
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 6u; ++e) r.w[e] = wq1[i + e];
  r.odd = b & 1u;
  return r;
}

// Bits 0-3 of x as bit 4 of bytes 0-3 (x·(2^4 + 2^11 + 2^18 + 2^25): four disjoint copies, no carries).
uint q5_high_bits(uint x) { return ((x & 0xFu) * 0x02040810u) & 0x10101010u; }

// The 5-bit codes of weights 4e .. 4e + 3 (.x) and 16 + 4e .. (.y) as bytes; d in .z (f16 bits).
uvec3 q5_0_codes(WUnit r, uint e) {
  const bool odd = r.odd != 0u;
  const uint qh = odd ? r.w[1] : mid_word(r.w[0], r.w[1]);
  const uint qs = odd ? r.w[2u + e] : mid_word(r.w[1u + e], r.w[2u + e]);
  return uvec3((qs & 0x0F0F0F0Fu) | q5_high_bits(qh >> (4u * e)),
               ((qs >> 4u) & 0x0F0F0F0Fu) | q5_high_bits(qh >> (16u + 4u * e)), odd ? r.w[0] >> 16u : r.w[0]);
}

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const f16vec2 d = f16vec2(unpackFloat2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x);
  const float16_t bias = float16_t(16.0);
#define Q5_PAIR(v) packFloat2x16(codes_minus(v, bias) * d)
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uvec3 a = q5_0_codes(r, 2u * e), b = q5_0_codes(r, 2u * e + 1u);
    h[e] = uvec4(Q5_PAIR(bytes01(a.x)), Q5_PAIR(bytes23(a.x)), Q5_PAIR(bytes01(b.x)), Q5_PAIR(bytes23(b.x)));
    h[e + 2u] = uvec4(Q5_PAIR(bytes01(a.y)), Q5_PAIR(bytes23(a.y)), Q5_PAIR(bytes01(b.y)), Q5_PAIR(bytes23(b.y)));
  }
#undef Q5_PAIR
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  const float d = unpackHalf2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x;
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uvec3 c = q5_0_codes(r, e);
    f[e] = bytes_minus(c.x, 16.0) * d;
    f[e + 4u] = bytes_minus(c.y, 16.0) * d;
  }
}

// The 5-bit codes of weights 4e .. 4e + 3, and (d, d, −16d, −16d).
uint unit_codes(WUnit r, uint e) {
  const uvec3 c = q5_0_codes(r, e & 3u);
  return e < 4u ? c.x : c.y;
}
vec4 unit_affine(WUnit r) {
  const float d = unpackHalf2x16(r.odd != 0u ? r.w[0] >> 16u : r.w[0]).x;
  return vec4(d, d, -16.0 * d, -16.0 * d);
}
