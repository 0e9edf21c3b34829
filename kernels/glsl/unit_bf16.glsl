// BF16 units (wunit.glsl): 32 bfloat16s (the high halves of f32s), 64 bytes on a 16-byte boundary (n_in a multiple
// of 32), in four parts of 16 bytes as F16's. f32: each widened, exact.
// f16 (unit_decode): exact wherever the value is an f16 normal or zero (BF16's 8 significant bits fit f16's 11):
// magnitudes 2^-14 .. 65280, which holds every weight of real models but a few tiny ones. Below 2^-14 a weight
// becomes an f16 subnormal, rounded as the device converts f32 to f16 (absolute error at most 2^-25; under 2^-25
// it may become zero). From 65536 (BF16's next value above 65280, beyond f16's 65504) a weight becomes ±inf, set
// explicitly so that no rounding mode clamps it to 65504: such a W makes the mixed-precision products inf or NaN
// rather than silently wrong. NaN stays NaN.
#define UNIT_WORDS 4
struct WUnit {
  uvec4 v;
};

#ifdef W_PANELS
#error "W_PANELS holds F16 weights: decode BF16 with decode_f16.comp first"
#endif
WUnit unit_fetch(uint row, uint u, uint part, uint n_in) { return WUnit(wq4[(row * n_in + 32u * u) / 8u + part]); }

// The two bfloat16s of a word (the first in the low half) as f32.
vec2 bf16_pair(uint w) { return uintBitsToFloat(uvec2(w << 16u, w & 0xFFFF0000u)); }

#ifndef UNIT_F32_ONLY
// Inf for a half whose magnitude (bits 0-14 of a) is 2^16 or more but not NaN; else the converted half h.
uint bf16_big_to_inf(uint a, uint h) {
  return (a & 0x7FFFu) >= 0x4780u && (a & 0x7FFFu) <= 0x7F80u ? ((a >> 15u) << 15u) | 0x7C00u : h;
}
uint bf16_pair_to_f16(uint w) {
  uint h = packFloat2x16(f16vec2(bf16_pair(w)));
  if (max(w & 0x7FFFu, (w >> 16u) & 0x7FFFu) >= 0x4780u)
    h = bf16_big_to_inf(w & 0xFFFFu, h & 0xFFFFu) | (bf16_big_to_inf(w >> 16u, h >> 16u) << 16u);
  return h;
}
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  h[0] = uvec4(bf16_pair_to_f16(r.v.x), bf16_pair_to_f16(r.v.y), bf16_pair_to_f16(r.v.z), bf16_pair_to_f16(r.v.w));
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  f[0] = vec4(bf16_pair(r.v.x), bf16_pair(r.v.y));
  f[1] = vec4(bf16_pair(r.v.z), bf16_pair(r.v.w));
}
