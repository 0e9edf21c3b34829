// Scaled activations as f16 hi + lo for the tensor-core GEMMs (q4_0_coop.glsl, q4_0_dx_coop.comp,
// coop_split_rows.comp).

// The power of two 2^e that brings a row (or tile) whose largest |value| is amax near 2^13, so that its f16 hi + lo
// parts neither overflow nor underflow whatever the magnitudes: e for amax = f·2^x (f in [0.5, 1)) is 13 - x,
// within ±120; 0 for an all-zero row. Values are multiplied by 2^e before split8 and the product by 2^-e after.
int split_scale_exponent(float amax) {
  int x = 0;
  frexp(amax, x);
  return amax > 0.0 ? clamp(13 - x, -120, 120) : 0;
}

// hi and lo halves of 8 scaled activations (a = positions 0-3, b = 4-7), in the order 0 2 1 3 4 6 5 7 of the
// codes. hi is the value cut to f16's 11 significant bits with an integer mask; lo = value - hi is exact in f32.
void split8(vec4 a, vec4 b, out uvec4 hi, out uvec4 lo) {
  const vec4 ha = uintBitsToFloat(floatBitsToUint(a) & 0xFFFFE000u);
  const vec4 hb = uintBitsToFloat(floatBitsToUint(b) & 0xFFFFE000u);
  const vec4 la = a - ha, lb = b - hb;
  hi = uvec4(packHalf2x16(ha.xz), packHalf2x16(ha.yw), packHalf2x16(hb.xz), packHalf2x16(hb.yw));
  lo = uvec4(packHalf2x16(la.xz), packHalf2x16(la.yw), packHalf2x16(lb.xz), packHalf2x16(lb.yw));
}

// The same with the 8 values in order (the dx's dY tiles, whose K runs along W's rows).
void split8_in_order(vec4 a, vec4 b, out uvec4 hi, out uvec4 lo) { split8(a.xzyw, b.xzyw, hi, lo); }
