// The 8 nibbles of a word of 4-bit codes as exact floats, through f16 pairs (needs
// GL_EXT_shader_explicit_arithmetic_types_float16). A nibble OR-ed into the mantissa of f16 1024 (0x6400) gives
// 1024 + n, or 1024 + 16n in place for a high nibble; one f16 subtraction per pair then leaves n - lo_off or
// 16n - hi_off exactly (offsets counted from 1024). One integer operation per two codes, where an f32 decode
// takes a shift and an and-or per code.
// lo: the low nibbles of bytes 0..3 of x; hi: the high nibbles, times 16.
void nibbles_f16(uint x, float16_t lo_off, float16_t hi_off, out vec4 lo, out vec4 hi) {
  const uint odd = x >> 8u;  // bytes 1 and 3 at the bottom of each half
  const f16vec2 l02 = unpackFloat2x16((x & 0x000F000Fu) | 0x64006400u) - f16vec2(1024.0hf + lo_off);
  const f16vec2 l13 = unpackFloat2x16((odd & 0x000F000Fu) | 0x64006400u) - f16vec2(1024.0hf + lo_off);
  const f16vec2 h02 = unpackFloat2x16((x & 0x00F000F0u) | 0x64006400u) - f16vec2(1024.0hf + hi_off);
  const f16vec2 h13 = unpackFloat2x16((odd & 0x00F000F0u) | 0x64006400u) - f16vec2(1024.0hf + hi_off);
  lo = vec4(float(l02.x), float(l13.x), float(l02.y), float(l13.y));
  hi = vec4(float(h02.x), float(h13.x), float(h02.y), float(h13.y));
}

// The same for codes of up to 8 bits that stand as whole bytes: bytes 0..3 of xl and of xh as exact floats,
// byte - off, two per f16 pair (Q5_K's 5-bit codes once their fifth bits are joined in).
void bytes_f16(uint xl, uint xh, float16_t off, out vec4 lo, out vec4 hi) {
  const f16vec2 base = f16vec2(1024.0hf + off);
  const f16vec2 l02 = unpackFloat2x16((xl & 0x00FF00FFu) | 0x64006400u) - base;
  const f16vec2 l13 = unpackFloat2x16(((xl >> 8u) & 0x00FF00FFu) | 0x64006400u) - base;
  const f16vec2 h02 = unpackFloat2x16((xh & 0x00FF00FFu) | 0x64006400u) - base;
  const f16vec2 h13 = unpackFloat2x16(((xh >> 8u) & 0x00FF00FFu) | 0x64006400u) - base;
  lo = vec4(float(l02.x), float(l13.x), float(l02.y), float(l13.y));
  hi = vec4(float(h02.x), float(h13.x), float(h02.y), float(h13.y));
}
