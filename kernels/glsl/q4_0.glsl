// Q4_0 block access from a buffer of 32-bit words holding raw GGML blocks (18 bytes: f16 d; u8 qs[16]).
// Blocks are not 4-byte aligned: a block starts at byte 18*b, so its halves land on 16-bit boundaries and
// every read below is one or two aligned word loads plus a shift.
//
// Work is split in "quarters": quarter q (0..3) of a block holds qs[4q..4q+3], i.e. weights 4q..4q+3 (low
// nibbles) and 16+4q..16+4q+3 (high nibbles). Neighbouring invocations taking neighbouring quarters read
// contiguous bytes, so a subgroup's loads coalesce.
#ifndef Q4_0_WORDS
#error "define Q4_0_WORDS as the uint[] array holding the blocks"
#endif

const uint Q4_0_BLOCK_BYTES = 18u;

// The f16 scale of the block starting at byte `bb` (bb is even).
float q4_0_scale(uint bb) {
  uint word = Q4_0_WORDS[bb >> 2u];
  return unpackHalf2x16(word >> ((bb & 2u) * 8u)).x;
}

// The 4 quant bytes of quarter q of the block starting at byte `bb`, packed little-endian in one uint. Both
// words are always loaded (the second is the first again when the quarter is word-aligned, so nothing past
// the block is read) and one is selected: no divergent branch where neighbouring blocks differ in alignment.
uint q4_0_quarter(uint bb, uint q) {
  const uint a = bb + 2u + 4u * q;
  const uint odd = (a >> 1u) & 1u;
  const uint lo = Q4_0_WORDS[a >> 2u];
  const uint hi = Q4_0_WORDS[(a >> 2u) + odd];
  return odd != 0u ? (lo >> 16u) | (hi << 16u) : lo;
}

// The quarter's 8 weights minus 8 (before the scale): low nibbles are weights 4q..4q+3, high nibbles
// 16+4q..16+4q+3. Each nibble n is OR-ed into the mantissa of 2^23 and 2^23 + 8 subtracted, which gives n - 8
// exactly with one bit operation and one add, instead of an integer-to-float conversion (a quarter-rate
// instruction on many GPUs, and the bottleneck of a memory-bound GEMV).
const uint Q4_0_MAGIC = 0x4B000000u;  // 2^23 as f32 bits
const float Q4_0_MAGIC_PLUS_8 = 8388616.0;

vec4 q4_0_low(uint qs) {
  return uintBitsToFloat(uvec4(qs, qs >> 8u, qs >> 16u, qs >> 24u) & 15u | Q4_0_MAGIC) - Q4_0_MAGIC_PLUS_8;
}
vec4 q4_0_high(uint qs) {
  return uintBitsToFloat(uvec4(qs >> 4u, qs >> 12u, qs >> 20u, qs >> 28u) & 15u | Q4_0_MAGIC) - Q4_0_MAGIC_PLUS_8;
}

// The same nibbles as 1 + n/16: each shifted into the top mantissa bits (19-22) of 1.0, one shift and one
// and-or per weight. Then d·(n − 8)·x summed = d·(16·Σ f·x − 24·Σ x): the GEMV and dx fold the 16 and the
// Σ x (or Σ dy·d) into per-invocation scalars. Low nibbles of qs are .xyzw = bytes 0..3, as q4_0_low.
const uint Q4_0_TOP_NIBBLE = 0x00780000u;  // mantissa bits 19-22
const uint Q4_0_ONE = 0x3F800000u;         // 1.0

vec4 q4_0_low_1p(uint qs) {
  return uintBitsToFloat(uvec4(qs << 19u, qs << 11u, qs << 3u, qs >> 5u) & Q4_0_TOP_NIBBLE | Q4_0_ONE);
}
vec4 q4_0_high_1p(uint qs) {
  return uintBitsToFloat(uvec4(qs << 15u, qs << 7u, qs >> 1u, qs >> 9u) & Q4_0_TOP_NIBBLE | Q4_0_ONE);
}
