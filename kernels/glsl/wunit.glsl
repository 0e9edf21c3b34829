// Frozen weights read 32 at a time (mixed_gemm.comp, decode_f16.comp, the unit_*.comp kernels, the loss and
// embedding shaders): a "unit" is weights 32u .. 32u + 31 of one row of W [rows, n_in] (n_in a multiple of 32; of
// 256 for the K-quants and IQ4_XS), decoded in order. Every format supplies the same functions in its own
// unit_<format>.glsl (the list stands above their includes, below); from them this file makes the f32 dot and
// axpy of the one-token kernels (unit_dot_f32, unit_axpy_f32, at the end).
// The including shader defines FORMAT (formats.glsl) and declares the weight buffer as wq1 (uint[]) and wq4
// (uvec4[]). It enables GL_EXT_shader_explicit_arithmetic_types_float16, or defines UNIT_F32_ONLY: then
// unit_decode does not exist and nothing here uses an f16 type (no shaderFloat16 needed).
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

#include "words.glsl"

#ifndef UNIT_F32_ONLY
// A pair of codes c < 1024 as the f16 pair c - bias, exactly: OR-ed into the mantissa of 1024 (0x6400), then
// 1024 + bias subtracted.
f16vec2 codes_minus(uint pair, float16_t bias) {
  return unpackFloat2x16(pair | 0x64006400u) - f16vec2(float16_t(1024.0) + bias);
}
#endif

#if FORMAT == FORMAT_IQ4_NL || FORMAT == FORMAT_IQ4_XS
#include "iq4_levels.glsl"
// The entries of 4 nibbles at bits 0, 8, 16, 24 of q (the rest ignored), plus 128, as the bytes of a word.
uint iq4_levels4(uint q) {
  return iq4_level(q & 15u) | (iq4_level((q >> 8u) & 15u) << 8u) | (iq4_level((q >> 16u) & 15u) << 16u) |
         (iq4_level((q >> 24u) & 15u) << 24u);
}

// Formats that look their codes up in a table (IQ4_NL, IQ4_XS) select the entries from registers, a few
// operations per weight. A shader that defines UNIT_SHARED_TABLE reads them from shared memory instead in the f32
// functions (one load per weight); it calls unit_setup() in every invocation of workgroups of at least 16, then a
// barrier() before the first of them. unit_setup() exists, as a no-op, for every format.
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

// What every unit_<format>.glsl supplies, UNIT_PARTS invocations sharing a unit (4 where a part is 16 bytes of the
// unit alone, as for F16 and BF16: neighbouring invocations then read neighbouring bytes):
//   UNIT_WORDS     about how many 32-bit registers a WUnit holds (the kernels size the units in flight by it);
//   struct WUnit   the raw words of one part, fetched into registers;
//   WUnit unit_fetch(uint row, uint u, uint part, uint n_in)   issues the loads (nothing waits for them yet);
//   void unit_decode(WUnit r, out uvec4 h[UNIT_VECS])          the part's 32 / UNIT_PARTS weights as f16, two per
//       word, its first weight in h[0].x's low half (one rounding where a scale multiplies an exact code);
//   void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS])  the same weights in f32, its first in f[0].x, each
//       exactly as GGML's float dequantisation (dequantize_row_*) evaluates it: the same operations in the same
//       order, each rounded (never fused), e.g. Q4_K (d·sc)·q − (dmin·m).
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

// The one-token kernels' f32 functions: float unit_dot_f32(WUnit r, vec4 x[2u * UNIT_VECS], vec2 sx), Σ w·x over
// the part (sx: Σ x over its first and its second half), for the GEMV; void unit_axpy_f32(WUnit r, float g, inout
// vec4 acc[2u * UNIT_VECS], inout vec2 off), acc += g·w but for off.x (.y), still to be added to every column of
// the first (second) half, for the dx. A format whose weights are s·c + o, codes c of UNIT_CODE_BITS bits (at most
// 7) with a scale s and an offset o per 16 weights, defines UNIT_CODE_BITS, uint unit_codes(WUnit r, uint e) (the
// codes of the part's weights 4e .. 4e + 3 as bytes) and vec4 unit_affine(WUnit r) ((s, s', o, o') of weights 0-15
// and 16-31, in f32); one that defines UNIT_HAS_DOT writes both functions itself; the others decode in f32.
#if defined(UNIT_CODE_BITS) && !defined(UNIT_HAS_DOT)
// From the codes: each code c becomes f = 1 + c/2^B (B = UNIT_CODE_BITS), c OR-ed into the top B bits of 1.0's
// mantissa (a shift and an and-or, exact), and the scales and offsets are applied once per 16 weights: three
// operations per weight where the GGML-order decode takes five or more. The sums are rounded otherwise than those
// of unit_decode_f32's products, but as accurately (the 1 in f cancels at most about 2^B / c times the result's
// magnitude).
vec4 codes_1p(uint c) {
  const uint B = UNIT_CODE_BITS, mask = ((1u << B) - 1u) << (23u - B);
  return uintBitsToFloat(uvec4(c << (23u - B), c << (15u - B), c << (7u - B), c >> (B + 1u)) & mask | 0x3F800000u);
}
// Σ c·x = 2^B·(Σ f·x − Σ x) over each half.
float unit_dot_f32(WUnit r, vec4 x[2u * UNIT_VECS], vec2 sx) {
  vec4 a = vec4(0.0), b = vec4(0.0);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    a = fma(codes_1p(unit_codes(r, e)), x[e], a);
    b = fma(codes_1p(unit_codes(r, e + 4u)), x[e + 4u], b);
  }
  const vec4 s = unit_affine(r);
  const float scale = float(1u << UNIT_CODE_BITS);
  const float ca = scale * (((a.x + a.y) + (a.z + a.w)) - sx.x), cb = scale * (((b.x + b.y) + (b.z + b.w)) - sx.y);
  return (s.x * ca + s.z * sx.x) + (s.y * cb + s.w * sx.y);
}
// g·(s·c + o) = 2^B·g·s·f + g·(o − 2^B·s): acc += (2^B·g·s)·f, one fma per weight, and off += g·(o − 2^B·s).
void unit_axpy_f32(WUnit r, float g, inout vec4 acc[2u * UNIT_VECS], inout vec2 off) {
  const vec4 s = unit_affine(r);
  const float scale = float(1u << UNIT_CODE_BITS);
  const vec2 gs = g * (scale * s.xy);
  off += g * (s.zw - scale * s.xy);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    acc[e] = fma(vec4(gs.x), codes_1p(unit_codes(r, e)), acc[e]);
    acc[e + 4u] = fma(vec4(gs.y), codes_1p(unit_codes(r, e + 4u)), acc[e + 4u]);
  }
}
#elif !defined(UNIT_HAS_DOT)
// Otherwise from unit_decode_f32: each weight as GGML evaluates it.
void unit_axpy_f32(WUnit r, float g, inout vec4 acc[2u * UNIT_VECS], inout vec2 off) {
  vec4 f[2u * UNIT_VECS];
  unit_decode_f32(r, f);
  [[unroll]] for (uint e = 0u; e < 2u * UNIT_VECS; ++e) acc[e] = fma(vec4(g), f[e], acc[e]);
}
float unit_dot_f32(WUnit r, vec4 x[2u * UNIT_VECS], vec2 sx) {
  vec4 f[2u * UNIT_VECS];
  unit_decode_f32(r, f);
  vec4 a = vec4(0.0);
  [[unroll]] for (uint e = 0u; e < 2u * UNIT_VECS; ++e) a = fma(f[e], x[e], a);
  return (a.x + a.y) + (a.z + a.w);
}
#endif
