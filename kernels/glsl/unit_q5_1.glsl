// Q5_1 units (wunit.glsl): a unit is one block, 24 bytes { f16 d, m; u8 qh[4]; u8 qs[16] } at byte 24·b (always on
// a word); weight j is the low (j < 16) or high (j >= 16) nibble of qs[j % 16] with bit j of qh (a little-endian
// u32) above it, value d·q + m (f32: float(q)·d, then + m). Six words.
#define UNIT_WORDS 6
#define UNIT_CODE_BITS 5
struct WUnit {
  uint w[6];  // d | m << 16, qh, qs
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint i = 6u * (row * (n_in >> 5u) + u);
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 6u; ++e) r.w[e] = wq1[i + e];
  return r;
}

// Bits 0-3 of x as bit 4 of bytes 0-3 (x·(2^4 + 2^11 + 2^18 + 2^25): four disjoint copies, no carries).
uint q5_high_bits(uint x) { return ((x & 0xFu) * 0x02040810u) & 0x10101010u; }

// The 5-bit codes of weights 4e .. 4e + 3 (.x) and 16 + 4e .. (.y) as bytes.
uvec2 q5_1_codes(WUnit r, uint e) {
  const uint qs = r.w[2u + e];
  return uvec2((qs & 0x0F0F0F0Fu) | q5_high_bits(r.w[1] >> (4u * e)),
               ((qs >> 4u) & 0x0F0F0F0Fu) | q5_high_bits(r.w[1] >> (16u + 4u * e)));
}

#ifndef UNIT_F32_ONLY
// (q·d) + m in f16, each step rounded once (`precise`: no fused multiply-add, as unit_q4_k.glsl).
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const f16vec2 dm = unpackFloat2x16(r.w[0]), d = dm.xx, m = dm.yy;
  const float16_t zero = float16_t(0.0);
  [[unroll]] for (uint e = 0u; e < 2u; ++e) {
    const uvec2 a = q5_1_codes(r, 2u * e), b = q5_1_codes(r, 2u * e + 1u);
    const uvec4 lo = uvec4(bytes01(a.x), bytes23(a.x), bytes01(b.x), bytes23(b.x));
    const uvec4 hi = uvec4(bytes01(a.y), bytes23(a.y), bytes01(b.y), bytes23(b.y));
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
    const uvec2 c = q5_1_codes(r, e);
    precise const vec4 sl = bytes_minus(c.x, 0.0) * dm.x;
    precise const vec4 sh = bytes_minus(c.y, 0.0) * dm.x;
    precise const vec4 wl = sl + dm.y;
    precise const vec4 wh = sh + dm.y;
    f[e] = wl;
    f[e + 4u] = wh;
  }
}

// The 5-bit codes of weights 4e .. 4e + 3, and (d, d, m, m).
uint unit_codes(WUnit r, uint e) {
  const uvec2 c = q5_1_codes(r, e & 3u);
  return e < 4u ? c.x : c.y;
}
vec4 unit_affine(WUnit r) { return unpackHalf2x16(r.w[0]).xxyy; }
