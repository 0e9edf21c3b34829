// Frozen weights read 32 at a time (mixed_gemm.comp, decode_f16.comp, the unit_*.comp kernels, the loss and
// embedding shaders): a "unit" is weights 32u .. 32u + 31 of one row of W [rows, n_in] (n_in a multiple of 32;
// of 256 for the K-quants and IQ4_XS), decoded in order. Every format supplies the same things, in its own
// unit_<format>.glsl:
//   UNIT_PARTS                                    the invocations that share a unit (1, or 4 where a part is
//                                                 16 bytes of the unit alone, as for F16 and BF16: neighbouring
//                                                 invocations then read neighbouring bytes);
//   UNIT_WORDS                                    about how many 32-bit registers a WUnit holds (kernels size
//                                                 how many units they keep in flight by it);
//   struct WUnit                                  the raw words of one part, fetched into registers;
//   WUnit unit_fetch(uint row, uint u, uint part, uint n_in)   issues the loads (nothing waits for them yet);
//   void unit_decode(WUnit r, out uvec4 h[UNIT_VECS])          the part's 32 / UNIT_PARTS weights as f16, two
//                                                 per word, its first weight in h[0].x's low half (one
//                                                 rounding where a scale multiplies an exact code);
//   void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS])  the same weights in f32, its first in f[0].x,
//                                                 each exactly as GGML's float dequantisation (dequantize_row_*)
//                                                 evaluates it: the same operations in the same order, each
//                                                 rounded (never fused), e.g. Q4_K (d·sc)·q − (dmin·m).
// The including shader defines FORMAT (formats.glsl) and declares the weight buffer as wq1 (uint[]) and wq4
// (uvec4[]). It enables GL_EXT_shader_explicit_arithmetic_types_float16, or defines UNIT_F32_ONLY: then
// unit_decode does not exist and nothing here uses an f16 type (no shaderFloat16 needed).
// Formats that look their codes up in a table (IQ4_NL, IQ4_XS) select the entries from registers, a few
// operations per weight. A shader that defines UNIT_SHARED_TABLE gets unit_decode_f32 reading the table from
// shared memory instead (one load per weight); it calls unit_setup() in every invocation of workgroups of at
// least 16, and a barrier() before its first unit_decode_f32. unit_setup() exists, as a no-op, for every format.
#include "formats.glsl"

// Pairs of small codes from a word of bytes b0..b3 (b0 lowest), in weight order: (b0, b1) or (b2, b3), their low
// or high nibbles or whole bytes, the first at bits 0.. and the second at bits 16.. of the result.
uint lo_nibbles01(uint q) { return (q & 0x0000000Fu) | ((q << 8u) & 0x000F0000u); }
uint lo_nibbles23(uint q) { return ((q >> 16u) & 0x0000000Fu) | ((q >> 8u) & 0x000F0000u); }
uint hi_nibbles01(uint q) { return ((q >> 4u) & 0x0000000Fu) | ((q << 4u) & 0x000F0000u); }
uint hi_nibbles23(uint q) { return ((q >> 20u) & 0x0000000Fu) | ((q >> 12u) & 0x000F0000u); }
uint bytes01(uint q) { return (q & 0x000000FFu) | ((q << 8u) & 0x00FF0000u); }
uint bytes23(uint q) { return ((q >> 16u) & 0x000000FFu) | ((q >> 8u) & 0x00FF0000u); }

// The 4 bytes of q (b0 in .x), or their low or high nibbles, minus `bias` as floats, exactly: each OR-ed into the
// mantissa of 2^23, then 2^23 + bias subtracted (no integer-to-float conversion).
const uint UNIT_MAGIC = 0x4B000000u;  // 2^23 as f32 bits
vec4 bytes_minus(uint q, float bias) {
  return uintBitsToFloat(uvec4(q, q >> 8u, q >> 16u, q >> 24u) & 0xFFu | UNIT_MAGIC) - (8388608.0 + bias);
}
vec4 lo_nibbles_minus(uint q, float bias) {
  return uintBitsToFloat(uvec4(q, q >> 8u, q >> 16u, q >> 24u) & 0xFu | UNIT_MAGIC) - (8388608.0 + bias);
}
vec4 hi_nibbles_minus(uint q, float bias) {
  return uintBitsToFloat(uvec4(q >> 4u, q >> 12u, q >> 20u, q >> 28u) & 0xFu | UNIT_MAGIC) - (8388608.0 + bias);
}

// The word at byte 2 of the two words a, b (b's low half above a's high half).
uint mid_word(uint a, uint b) { return (a >> 16u) | (b << 16u); }

#ifndef UNIT_F32_ONLY
// A pair of codes c < 1024 as the f16 pair c - bias, exactly: OR-ed into the mantissa of 1024 (0x6400), then
// 1024 + bias subtracted.
f16vec2 codes_minus(uint pair, float16_t bias) {
  return unpackFloat2x16(pair | 0x64006400u) - f16vec2(float16_t(1024.0) + bias);
}
#endif

#if FORMAT == FORMAT_IQ4_NL || FORMAT == FORMAT_IQ4_XS
// GGML's kvalues_iq4nl {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} plus 128, entry
// q in byte q % 4 of word q / 4.
const uvec4 IQ4_LEVELS = uvec4(0x3F2D1801u, 0x766A5D4Fu, 0xA6998D81u, 0xF1D9C5B5u);

// Entry q (0..15) plus 128, from registers.
uint iq4_level(uint q) {
  const uvec2 half_ = (q & 8u) != 0u ? IQ4_LEVELS.zw : IQ4_LEVELS.xy;
  return (((q & 4u) != 0u ? half_.y : half_.x) >> (8u * (q & 3u))) & 0xFFu;
}
// The entries of 4 nibbles at bits 0, 8, 16, 24 of q (the rest ignored), plus 128, as the bytes of a word.
uint iq4_levels4(uint q) {
  return iq4_level(q & 15u) | (iq4_level((q >> 8u) & 15u) << 8u) | (iq4_level((q >> 16u) & 15u) << 16u) |
         (iq4_level((q >> 24u) & 15u) << 24u);
}

#ifdef UNIT_SHARED_TABLE
shared float unit_levels[16];
#define UNIT_HAS_SETUP
void unit_setup() {
  const uint i = gl_LocalInvocationIndex;
  if (i < 16u) unit_levels[i] = float(int(iq4_level(i)) - 128);
}
// The entries of the 4 nibbles at bits 0, 8, 16, 24 of q, as floats.
vec4 iq4_values(uint q) {
  return vec4(unit_levels[q & 15u], unit_levels[(q >> 8u) & 15u], unit_levels[(q >> 16u) & 15u],
              unit_levels[(q >> 24u) & 15u]);
}
#else
vec4 iq4_values(uint q) { return bytes_minus(iq4_levels4(q), 128.0); }
#endif
#endif

#if FORMAT == FORMAT_F16 || FORMAT == FORMAT_BF16
#define UNIT_PARTS 4
#else
#define UNIT_PARTS 1
#endif
const uint UNIT_VECS = 4u / uint(UNIT_PARTS);  // uvec4s of f16 per part (f32: twice as many vec4s)

#if FORMAT == FORMAT_F16
#include "unit_f16.glsl"
#elif FORMAT == FORMAT_BF16
#include "unit_bf16.glsl"
#elif FORMAT == FORMAT_Q4_0
#include "unit_q4_0.glsl"
#elif FORMAT == FORMAT_Q4_1
#include "unit_q4_1.glsl"
#elif FORMAT == FORMAT_Q5_0
#include "unit_q5_0.glsl"
#elif FORMAT == FORMAT_Q5_1
#include "unit_q5_1.glsl"
#elif FORMAT == FORMAT_Q8_0
#include "unit_q8_0.glsl"
#elif FORMAT == FORMAT_Q2_K
#include "unit_q2_k.glsl"
#elif FORMAT == FORMAT_Q3_K
#include "unit_q3_k.glsl"
#elif FORMAT == FORMAT_Q4_K
#include "unit_q4_k.glsl"
#elif FORMAT == FORMAT_Q5_K
#include "unit_q5_k.glsl"
#elif FORMAT == FORMAT_Q6_K
#include "unit_q6_k.glsl"
#elif FORMAT == FORMAT_IQ4_NL
#include "unit_iq4_nl.glsl"
#elif FORMAT == FORMAT_IQ4_XS
#include "unit_iq4_xs.glsl"
#else
#error "FORMAT names no unit format of formats.glsl"
#endif

#ifndef UNIT_HAS_SETUP
void unit_setup() {}
#endif
