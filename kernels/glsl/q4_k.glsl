// Q4_K super-block access (kernels/quant/k_quants.h): 144-byte blocks { f16 d; f16 dmin; u8 scales[12];
// u8 qs[128] } of 256 weights, weight = d·sc·q − dmin·m per 32-weight sub-block. 144 bytes are 36 words (9
// uvec4s), so every block starts on a word, and on 16 bytes: the GEMV and dx shaders read the header (d, dmin,
// scales) as one uvec4 and the quants as uvec4s or uvec2s. q4_k_weights4 (the tile loaders, the embedding)
// reads words from Q4_K_WORDS, when that is defined.
//
// In words: word 0 = d | dmin << 16, words 1-3 = scales, words 4-35 = qs. The 64-weight chunk c (0..3) keeps
// sub-block 2c in the low nibbles of qs[32c..32c+32) (words 4 + 8c ..) and sub-block 2c+1 in the high nibbles.
const uint Q4_K_BLOCK_WORDS = 36u;

// The 6-bit scales and mins of the 8 sub-blocks from the three scale words s0 s1 s2 (k4_scale_min, four bytes
// at a time): byte i of .x is sc[i], of .y sc[4 + i], of .z m[i], of .w m[4 + i].
uvec4 q4_k_scales_mins(uint s0, uint s1, uint s2) {
  return uvec4(s0 & 0x3F3F3F3Fu, (s2 & 0x0F0F0F0Fu) | ((s0 >> 2u) & 0x30303030u), s1 & 0x3F3F3F3Fu,
               ((s2 >> 4u) & 0x0F0F0F0Fu) | ((s1 >> 2u) & 0x30303030u));
}

// Small unsigned integers to floats by OR-ing them into the mantissa of 2^23 and subtracting 2^23: exact, one
// bit operation and one add instead of an integer-to-float conversion (a quarter-rate instruction on many
// GPUs, and the bottleneck of a memory-bound GEMV).
const uint Q4_K_MAGIC = 0x4B000000u;  // 2^23 as f32 bits
const float Q4_K_MAGIC_F = 8388608.0;

float q4_k_u2f(uint v) { return uintBitsToFloat(v | Q4_K_MAGIC) - Q4_K_MAGIC_F; }

// The scale and min of sub-blocks 2c and 2c+1 as floats (sc0, sc1, m0, m1), from the header words .y .z .w.
vec4 q4_k_chunk_scales(uvec3 s, uint c) {
  const uvec4 sm = q4_k_scales_mins(s.x, s.y, s.z);
  const uvec2 w = c < 2u ? sm.xz : sm.yw;  // the bytes of sub-blocks 0-3 or 4-7
  const uint sh = (c & 1u) * 16u;
  const uvec2 v = (w >> sh) & 0xFFFFu;  // (sc0 | sc1 << 8, m0 | m1 << 8)
  return vec4(q4_k_u2f(v.x & 0xFFu), q4_k_u2f(v.x >> 8u), q4_k_u2f(v.y & 0xFFu), q4_k_u2f(v.y >> 8u));
}

// The low and high nibbles of the 4 bytes of a word, as floats 0..15 (bytes 0..3 in .xyzw).
vec4 q4_k_low(uint qs) {
  return uintBitsToFloat(uvec4(qs, qs >> 8u, qs >> 16u, qs >> 24u) & 15u | Q4_K_MAGIC) - Q4_K_MAGIC_F;
}
vec4 q4_k_high(uint qs) {
  return uintBitsToFloat(uvec4(qs >> 4u, qs >> 12u, qs >> 20u, qs >> 28u) & 15u | Q4_K_MAGIC) - Q4_K_MAGIC_F;
}

// The same nibbles as 1 + q/16: each shifted into the top mantissa bits (19-22) of 1.0, one shift and one
// and-or per weight and no subtraction. Sums of these against x are Σx + Σ q·x / 16, so the hot loops of the
// GEMV and dx take Σ q·x = 16·(Σ f·x − Σ x) per sub-block and fold the 16 and the Σ x into per-row scalars.
// The error stays within a few times that of summing q·x directly (f is in [1, 2) and the factor is 16).
const uint Q4_K_TOP_NIBBLE = 0x00780000u;  // mantissa bits 19-22
const uint Q4_K_ONE = 0x3F800000u;         // 1.0

vec4 q4_k_low_1p(uint qs) {
  return uintBitsToFloat(uvec4(qs << 19u, qs << 11u, qs << 3u, qs >> 5u) & Q4_K_TOP_NIBBLE | Q4_K_ONE);
}
vec4 q4_k_high_1p(uint qs) {
  return uintBitsToFloat(uvec4(qs << 15u, qs << 7u, qs >> 1u, qs >> 9u) & Q4_K_TOP_NIBBLE | Q4_K_ONE);
}

#ifdef Q4_K_WORDS
// Weights k..k+3 (k a multiple of 4) of the block starting at word `bw`: sub-block j = k / 32 sits in the low
// (even j) or high (odd j) nibbles of qs[32 (j / 2) + k % 32 ..].
vec4 q4_k_weights4(uint bw, uint k) {
  const uint j = k / 32u, c = j / 2u;
  const vec2 dm = unpackHalf2x16(Q4_K_WORDS[bw]);
  const vec4 s = q4_k_chunk_scales(uvec3(Q4_K_WORDS[bw + 1u], Q4_K_WORDS[bw + 2u], Q4_K_WORDS[bw + 3u]), c);
  const uint qs = Q4_K_WORDS[bw + 4u + 8u * c + (k % 32u) / 4u];
  const bool hi = (j & 1u) != 0u;
  return (dm.x * (hi ? s.y : s.x)) * (hi ? q4_k_high(qs) : q4_k_low(qs)) - dm.y * (hi ? s.w : s.z);
}
#endif
