// Q6_K super-block access (kernels/quant/k_quants.h) from a buffer of 32-bit words holding the blocks of 256
// weights { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }, weight = d·scale·(q − 32), in the GPU's grouped
// layout (kernels/shapes.h, q6_k_device_bytes): the blocks of the matrix, counted row after row, go in groups of
// 8, each group 1680 bytes (420 words): the first 208 bytes (ql, qh, scales) of its 8 blocks, then their 8 d's.
// Every 8-byte piece of a block then lies on an 8-byte boundary, where GGML's 210-byte blocks fall on 2-byte ones.
// A block is named by its index in the matrix (row · blocks per row + block).
// Each 128-weight half h uses ql[64h..64h+64), qh[32h..32h+32) and scales[8h..8h+8). For l in [0, 32) its
// "quadrant" k4 (0..3) holds weight 32·k4 + l: the low (k4 = 0, 1) or high (k4 = 2, 3) nibble of
// ql[64h + 32·(k4 & 1) + l], the bits 2·k4 .. 2·k4+1 of qh[32h + l], and the scale scales[8h + 2·k4 + l / 16].

// Define Q6_K_WORDS as the uint[] array holding the blocks, and Q6_K_PAIRS as a uvec2[] view of the same buffer
// where the shader has one (8-byte pieces in one load each).
#ifndef Q6_K_WORDS
#error "define Q6_K_WORDS as the uint[] array holding the blocks"
#endif

const uint Q6_K_GROUP_WORDS = 420u, Q6_K_BODY_WORDS = 52u, Q6_K_D_WORDS = 416u;  // d's after 8 bodies
const uint Q6_K_QH = 32u, Q6_K_SCALES = 48u;  // word offsets of qh and scales inside a block

// The word holding ql[0] of block `blk` (always even).
uint q6_k_base(uint blk) { return (blk >> 3u) * Q6_K_GROUP_WORDS + (blk & 7u) * Q6_K_BODY_WORDS; }

// Words i and i + 1 (i even: every piece the kernels read is 8 bytes on an 8-byte boundary).
uvec2 q6_k_pair(uint i) {
#ifdef Q6_K_PAIRS
  return Q6_K_PAIRS[i >> 1u];
#else
  return uvec2(Q6_K_WORDS[i], Q6_K_WORDS[i + 1u]);
#endif
}

// The f16 super-block scale of block `blk`.
float q6_k_d(uint blk) {
  const uint word = Q6_K_WORDS[(blk >> 3u) * Q6_K_GROUP_WORDS + Q6_K_D_WORDS + ((blk & 7u) >> 1u)];
  return unpackHalf2x16(word >> (16u * (blk & 1u))).x;
}

// Signed byte i (0..3) of a word, as a float.
float q6_k_i8(uint word, uint i) { return float(bitfieldExtract(int(word), int(8u * i), 8)); }

// The 4 six-bit quants of quadrant k4 from a word of ql bytes and the word of qh bytes at the same l.
uint q6_k_quants(uint ql, uint qh, uint k4) {
  return ((ql >> (4u * (k4 >> 1u))) & 0x0F0F0F0Fu) | (((qh >> (2u * k4)) & 0x03030303u) << 4u);
}

// The 4 quants of a word minus 32, as floats: each byte OR-ed into the mantissa of 2^23, then 2^23 + 32
// subtracted (exact; no integer-to-float conversion).
const uint Q6_K_MAGIC = 0x4B000000u;       // 2^23 as f32 bits
const float Q6_K_MAGIC_PLUS_32 = 8388640.0;  // 2^23 + 32

vec4 q6_k_unpack(uint q) {
  return uintBitsToFloat(uvec4(q, q >> 8u, q >> 16u, q >> 24u) & 0xFFu | Q6_K_MAGIC) - Q6_K_MAGIC_PLUS_32;
}

// The 4 quants of a word minus 32 as floats scaled by powers of two, decoded where they lie (as
// q4_k_low_scaled): bytes 0, 1 and 2 OR-ed into the mantissa of 2^23 in place (a quant has 6 bits, so byte 2
// stays below the exponent), byte 3 shifted down first. Byte i comes out as (q − 32)·Q6_K_SCALE[i]⁻¹, exactly;
// the GEMV folds Q6_K_SCALE into the activations, the dx into its column sums. One and-or per weight (and one
// shift per word) instead of a shift and an and-or.
const vec4 Q6_K_SCALE = vec4(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0);

vec4 q6_k_unpack_scaled(uint q) {
  return uintBitsToFloat(uvec4(q & 0xFFu, q & 0xFF00u, q & 0xFF0000u, q >> 24u) | Q6_K_MAGIC) -
         vec4(Q6_K_MAGIC_PLUS_32, 8388608.0 + 8192.0, 8388608.0 + 2097152.0, Q6_K_MAGIC_PLUS_32);
}

// Weights k..k+3 (k a multiple of 4) of block `blk`.
vec4 q6_k_weights4(uint blk, uint k) {
  const uint h = k / 128u, k4 = (k % 128u) / 32u, l = k % 32u, base = q6_k_base(blk);
  const uint ql = Q6_K_WORDS[base + 16u * h + 8u * (k4 & 1u) + l / 4u];
  const uint qh = Q6_K_WORDS[base + Q6_K_QH + 8u * h + l / 4u];
  const uint s = 8u * h + 2u * k4 + l / 16u;  // the scale's byte in scales[]
  const uint sw = Q6_K_WORDS[base + Q6_K_SCALES + s / 4u];
  return (q6_k_d(blk) * q6_k_i8(sw, s % 4u)) * q6_k_unpack(q6_k_quants(ql, qh, k4));
}
