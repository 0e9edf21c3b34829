// Q8_0 block access from a buffer of 32-bit words holding raw GGML blocks (34 bytes: f16 d; i8 qs[32]).
// Blocks are not 4-byte aligned: block b starts at byte 34*b, so every block (and its quants) starts on a 16-bit
// boundary, and every read below is aligned word loads plus shifts.
//
// Work is split in "eighths" (4 weights: qs[4e..4e+3], one word's worth) or "quarters" (8 weights:
// qs[8q..8q+7], two words' worth). Neighbouring invocations taking neighbouring pieces read contiguous bytes,
// so a subgroup's loads coalesce.
#ifndef Q8_0_WORDS
#error "define Q8_0_WORDS as the uint[] array holding the blocks"
#endif

const uint Q8_0_BLOCK_BYTES = 34u;

// The f16 scale of the block starting at byte `bb` (bb is even).
float q8_0_scale(uint bb) {
  uint word = Q8_0_WORDS[bb >> 2u];
  return unpackHalf2x16(word >> ((bb & 2u) * 8u)).x;
}

// The 4 bytes starting at the even byte address `a`, packed little-endian in one uint.
uint q8_0_word(uint a) {
  uint lo = Q8_0_WORDS[a >> 2u];
  if ((a & 2u) == 0u) return lo;
  uint hi = Q8_0_WORDS[(a >> 2u) + 1u];
  return (lo >> 16u) | (hi << 16u);
}

// The 8 bytes starting at the even byte address `a`, as two such words.
uvec2 q8_0_words2(uint a) {
  uint i = a >> 2u;
  uint w0 = Q8_0_WORDS[i], w1 = Q8_0_WORDS[i + 1u];
  if ((a & 2u) == 0u) return uvec2(w0, w1);
  uint w2 = Q8_0_WORDS[i + 2u];
  return uvec2((w0 >> 16u) | (w1 << 16u), (w1 >> 16u) | (w2 << 16u));
}

// The 4 signed quants of a word, as floats (before the scale). XOR 0x80 turns each int8 q into the unsigned
// byte q + 128; OR-ed into the mantissa of 2^23, minus 2^23 + 128, that is q exactly, with one bit operation
// and one add instead of a sign extension and an integer-to-float conversion (a quarter-rate instruction on
// many GPUs, and the bottleneck of a memory-bound GEMV).
const uint Q8_0_MAGIC = 0x4B000000u;  // 2^23 as f32 bits
const float Q8_0_MAGIC_PLUS_128 = 8388736.0;

vec4 q8_0_unpack(uint qs) {
  uint u = qs ^ 0x80808080u;
  return uintBitsToFloat(uvec4(u, u >> 8u, u >> 16u, u >> 24u) & 0xFFu | Q8_0_MAGIC) - Q8_0_MAGIC_PLUS_128;
}
