// Frozen weights read 32 at a time for the mixed-precision kernels (mixed_gemm.comp, decode_f16.comp): a "unit"
// is weights 32u .. 32u + 31 of one row of W [rows, n_in] (n_in a multiple of 32), decoded to f16 in order.
// Every format supplies the same things, in its own unit_<format>.glsl:
//   UNIT_PARTS                                    the invocations that share a unit (1, or 4 where a part is
//                                                 16 bytes of the unit alone, as for F16: neighbouring
//                                                 invocations then read neighbouring bytes);
//   struct WUnit                                  the raw words of one part, fetched into registers;
//   WUnit unit_fetch(uint row, uint u, uint part, uint n_in)   issues the loads (nothing waits for them yet);
//   void unit_decode(WUnit r, out uvec4 h[UNIT_VECS])          the part's 32 / UNIT_PARTS weights as f16, two
//                                                 per word, its first weight in h[0].x's low half (one
//                                                 rounding where a scale multiplies an exact code).
// The including shader enables GL_EXT_shader_explicit_arithmetic_types_float16, defines FORMAT (formats.glsl)
// and declares the weight buffer as wq1 (uint[]) and wq4 (uvec4[]).
#include "formats.glsl"

// Pairs of small codes from a word of bytes b0..b3 (b0 lowest), in weight order: (b0, b1) or (b2, b3), their low
// or high nibbles or whole bytes, the first at bits 0.. and the second at bits 16.. of the result.
uint lo_nibbles01(uint q) { return (q & 0x0000000Fu) | ((q << 8u) & 0x000F0000u); }
uint lo_nibbles23(uint q) { return ((q >> 16u) & 0x0000000Fu) | ((q >> 8u) & 0x000F0000u); }
uint hi_nibbles01(uint q) { return ((q >> 4u) & 0x0000000Fu) | ((q << 4u) & 0x000F0000u); }
uint hi_nibbles23(uint q) { return ((q >> 20u) & 0x0000000Fu) | ((q >> 12u) & 0x000F0000u); }
uint bytes01(uint q) { return (q & 0x000000FFu) | ((q << 8u) & 0x00FF0000u); }
uint bytes23(uint q) { return ((q >> 16u) & 0x000000FFu) | ((q >> 8u) & 0x00FF0000u); }

// A pair of codes c < 1024 as the f16 pair c - bias, exactly: OR-ed into the mantissa of 1024 (0x6400), then
// 1024 + bias subtracted.
f16vec2 codes_minus(uint pair, float16_t bias) {
  return unpackFloat2x16(pair | 0x64006400u) - f16vec2(float16_t(1024.0) + bias);
}

#if FORMAT == FORMAT_F16
#define UNIT_PARTS 4
#else
#define UNIT_PARTS 1
#endif
const uint UNIT_VECS = 4u / uint(UNIT_PARTS);  // uvec4s of f16 per part

#if FORMAT == FORMAT_Q4_0
#include "unit_q4_0.glsl"
#elif FORMAT == FORMAT_Q8_0
#include "unit_q8_0.glsl"
#elif FORMAT == FORMAT_F16
#include "unit_f16.glsl"
#elif FORMAT == FORMAT_Q4_K
#include "unit_q4_k.glsl"
#elif FORMAT == FORMAT_Q6_K
#include "unit_q6_k.glsl"
#else
#error "FORMAT names no format of formats.glsl"
#endif
