// GGML's kvalues_iq4nl {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} plus 128, entry
// q in byte q % 4 of word q / 4 (wunit.glsl's IQ4 units, q4_0_dx_split_pairs.comp).
const uvec4 IQ4_LEVELS = uvec4(0x3F2D1801u, 0x766A5D4Fu, 0xA6998D81u, 0xF1D9C5B5u);

// Entry q (0..15) plus 128, from registers.
uint iq4_level(uint q) {
  const uvec2 half_ = (q & 8u) != 0u ? IQ4_LEVELS.zw : IQ4_LEVELS.xy;
  return (((q & 4u) != 0u ? half_.y : half_.x) >> (8u * (q & 3u))) & 0xFFu;
}
