// Q6_K super-block access (kernels/quant/k_quants.h) from a buffer of 32-bit words holding raw blocks
// { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d } of 256 weights, weight = d·scale·(q − 32). 210 bytes: block b
// starts at byte 210·b, on a 16-bit boundary only, so every read below is aligned word loads plus shifts (as
// q8_0.glsl).
//
// Each 128-weight half h uses ql[64h..64h+64), qh[32h..32h+32) and scales[8h..8h+8). For l in [0, 32) its
// "quadrant" k4 (0..3) holds weight 32·k4 + l: the low (k4 = 0, 1) or high (k4 = 2, 3) nibble of
// ql[64h + 32·(k4 & 1) + l], the bits 2·k4 .. 2·k4+1 of qh[32h + l], and the scale scales[8h + 2·k4 + l / 16].
#ifndef Q6_K_WORDS
#error "define Q6_K_WORDS as the uint[] array holding the blocks"
#endif

const uint Q6_K_BLOCK_BYTES = 210u;
const uint Q6_K_QH = 128u, Q6_K_SCALES = 192u, Q6_K_D = 208u;  // byte offsets inside a block

// The 4 bytes starting at the even byte address `a`, packed little-endian in one uint. Both words are always
// loaded (the second is the first again when `a` is word-aligned, so nothing past the bytes is read) and
// combined by a select: neighbouring blocks differ in alignment, and a branch would diverge.
uint q6_k_word(uint a) {
  const uint i = a >> 2u, odd = (a >> 1u) & 1u;
  const uint lo = Q6_K_WORDS[i], hi = Q6_K_WORDS[i + odd];
  return odd != 0u ? (lo >> 16u) | (hi << 16u) : lo;
}

// The 8 bytes starting at the even byte address `a`, as two words, when the caller knows the alignment: `odd`
// says that a is 2 mod 4 (the block starts on an odd 16-bit word: block index odd). With `odd` a constant, an aligned pair is two loads and nothing else. The GEMV
// and dx arrange their invocations so that a subgroup's blocks share the alignment and branch on it.
uvec2 q6_k_words2_known(uint a, bool odd) {
  const uint i = a >> 2u;
  if (!odd) return uvec2(Q6_K_WORDS[i], Q6_K_WORDS[i + 1u]);
  const uint w0 = Q6_K_WORDS[i], w1 = Q6_K_WORDS[i + 1u], w2 = Q6_K_WORDS[i + 2u];
  return uvec2((w0 >> 16u) | (w1 << 16u), (w1 >> 16u) | (w2 << 16u));
}

// The f16 super-block scale of the block starting at byte `bb`.
float q6_k_d(uint bb) {
  const uint a = bb + Q6_K_D;
  return unpackHalf2x16(Q6_K_WORDS[a >> 2u] >> ((a & 2u) * 8u)).x;
}
float q6_k_d_known(uint bb, bool odd) {
  return unpackHalf2x16(Q6_K_WORDS[(bb + Q6_K_D) >> 2u] >> (odd ? 16u : 0u)).x;
}

// The GEMVs' unit (8 per block: half h, l-group g) that invocation `lane` of a set of set_size starts at, then
// striding by set_size. In each run of 64 invocations, invocations 0-31 take the 8 units of blocks 0, 2, 4, 6 of
// the run's 8 blocks and 32-63 those of blocks 1, 3, 5, 7; the stride is a multiple of 8 blocks, so an
// invocation's blocks all have one parity (and a 32-wide subgroup's too). Sets whose size is not a multiple of
// 64 take units in order.
uint q6_k_unit_of(uint lane, uint set_size) {
  if (set_size % 64u != 0u) return lane;
  const uint q = lane % 32u, half_ = (lane / 32u) % 2u, run = lane / 64u;
  return 8u * (8u * run + 2u * (q / 8u) + half_) + q % 8u;
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

// Weights k..k+3 (k a multiple of 4) of the block starting at byte `bb`.
vec4 q6_k_weights4(uint bb, uint k) {
  const uint h = k / 128u, k4 = (k % 128u) / 32u, l = k % 32u;
  const uint ql = q6_k_word(bb + 64u * h + 32u * (k4 & 1u) + l);
  const uint qh = q6_k_word(bb + Q6_K_QH + 32u * h + l);
  const uint s = Q6_K_SCALES + 8u * h + 2u * k4 + l / 16u;  // byte offset of the scale
  const uint sw = Q6_K_WORDS[(bb + s) >> 2u];
  return (q6_k_d(bb) * q6_k_i8(sw, (bb + s) & 3u)) * q6_k_unpack(q6_k_quants(ql, qh, k4));
}
