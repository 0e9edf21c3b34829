// Q2_K, Q3_K, Q4_K, Q5_K and Q6_K block codecs, byte for byte GGML's "k-quant" formats: 256 weights per
// super-block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/shapes.h"

namespace q4t::quant {

// Q2_K (84 bytes): { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }. Sixteen sub-blocks of 16 weights each have a
// 4-bit scale (low nibble of scales[s]) and a 4-bit min (high nibble); weight = d·sc·q − dmin·m with q a 2-bit
// quant. Each 128-weight half h uses qs[32h..32h+32): weights 128h + 32j + l (j in [0, 4), l in [0, 32)) sit in
// bits 2j..2j+1 of qs[32h + l].
struct BlockQ2_K {
  uint8_t scales[16];  // 16 x (4-bit scale | 4-bit min << 4)
  uint8_t qs[64];      // 2-bit quants
  uint16_t d;          // f16 scale of the sub-block scales
  uint16_t dmin;       // f16 scale of the sub-block mins
};
static_assert(sizeof(BlockQ2_K) == kQ2_KBlockBytes, "Q2_K block must be 84 bytes");

// Q3_K (110 bytes): { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }. Sixteen sub-blocks of 16 weights each have
// a 6-bit scale stored as sc + 32 (see k3_scale); weight = d·sc·(q − 4) with q a 3-bit quant: its low 2 bits are
// packed into qs as Q2_K's, its high bit is bit i/32 of hmask[i % 32] for weight i.
struct BlockQ3_K {
  uint8_t hmask[32];   // high bits of the quants
  uint8_t qs[64];      // low 2 bits of the quants
  uint8_t scales[12];  // 16 x 6-bit scale (+32), see k3_scale
  uint16_t d;          // f16 super-block scale
};
static_assert(sizeof(BlockQ3_K) == kQ3_KBlockBytes, "Q3_K block must be 110 bytes");

// Q4_K (144 bytes): { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }. Eight sub-blocks of 32 weights each have a
// 6-bit scale sc and a 6-bit min m packed into `scales` (k4_scale_min); weight = d·sc·q − dmin·m with q a
// 4-bit quant. The 64-weight chunk c keeps sub-block 2c in the low nibbles of qs[32c..32c+32) and sub-block
// 2c+1 in the high nibbles.
struct BlockQ4_K {
  uint16_t d;          // f16 scale of the sub-block scales
  uint16_t dmin;       // f16 scale of the sub-block mins
  uint8_t scales[12];  // 8 x (6-bit scale, 6-bit min), see k4_scale_min
  uint8_t qs[128];     // 4-bit quants
};
static_assert(sizeof(BlockQ4_K) == kQ4_KBlockBytes, "Q4_K block must be 144 bytes");

// Q5_K (176 bytes): { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }: Q4_K's scales and mins and nibble
// layout, plus a fifth bit per weight: bit 2c (sub-block 2c) or 2c+1 (sub-block 2c+1) of qh[l] for the weight of
// the 64-weight chunk c held in qs[32c + l].
struct BlockQ5_K {
  uint16_t d;          // f16 scale of the sub-block scales
  uint16_t dmin;       // f16 scale of the sub-block mins
  uint8_t scales[12];  // 8 x (6-bit scale, 6-bit min), as Q4_K's (k4_scale_min)
  uint8_t qh[32];      // fifth bits of the quants
  uint8_t qs[128];     // low 4 bits of the quants
};
static_assert(sizeof(BlockQ5_K) == kQ5_KBlockBytes, "Q5_K block must be 176 bytes");

// Q6_K (210 bytes): { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }. Sixteen sub-blocks of 16 weights each
// have a signed 8-bit scale; weight = d·scale·(q − 32) with q a 6-bit quant: 4 low bits in ql, 2 high bits in
// qh. Each 128-weight half h uses ql[64h..64h+64) and qh[32h..32h+32); for l in [0, 32) its weights l, l+32,
// l+64, l+96 are (ql[l] & 15, ql[l+32] & 15, ql[l] >> 4, ql[l+32] >> 4) with qh[l] bits (0-1, 2-3, 4-5, 6-7).
struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits of the quants
  uint8_t qh[64];     // high 2 bits of the quants
  int8_t scales[16];  // sub-block scales
  uint16_t d;         // f16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == kQ6_KBlockBytes, "Q6_K block must be 210 bytes");

// The 6-bit scale and min of Q4_K sub-block j (0..7) from the 12 packed bytes: sub-blocks 0-3 keep theirs in the
// low 6 bits of bytes j and j+4; sub-blocks 4-7 keep the low 4 bits in byte j+4 (scale low nibble, min high
// nibble) and the top 2 bits in the top bits of bytes j-4 (scale) and j (min).
inline void k4_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = uint8_t((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4));
    *m = uint8_t((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// The signed scale of Q3_K sub-block s (0..15), in [−32, 31]: its low 4 bits are the low (s < 8) or high (s >= 8)
// nibble of byte s % 8, its top 2 bits are bits 2·(s/4)..2·(s/4)+1 of byte 8 + s % 4; the stored value is sc + 32.
inline int k3_scale(const uint8_t* scales, int s) {
  const int low = s < 8 ? (scales[s] & 0xF) : (scales[s - 8] >> 4);
  const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// The same unpackings for all sub-blocks at once, as little-endian words of one byte per sub-block (the SIMD
// loops'): Q4_K's and Q5_K's 8 scales in w[0..1] and 8 mins in w[2..3]; Q3_K's 16 stored scales (sc + 32) in
// w[0..3]. `scales` points at the 12 packed bytes.
inline uint32_t k_scale_word(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline void k4_scale_min_words(const uint8_t* scales, uint32_t w[4]) {
  const uint32_t w0 = k_scale_word(scales), w1 = k_scale_word(scales + 4), w2 = k_scale_word(scales + 8);
  w[0] = w0 & 0x3F3F3F3F, w[1] = (w2 & 0x0F0F0F0F) | (((w0 >> 6) & 0x03030303) << 4);
  w[2] = w1 & 0x3F3F3F3F, w[3] = ((w2 >> 4) & 0x0F0F0F0F) | (((w1 >> 6) & 0x03030303) << 4);
}
inline void k3_scale_words(const uint8_t* scales, uint32_t w[4]) {
  const uint32_t a0 = k_scale_word(scales), a1 = k_scale_word(scales + 4), t = k_scale_word(scales + 8);
  w[0] = (a0 & 0x0F0F0F0F) | ((t & 0x03030303) << 4);
  w[1] = (a1 & 0x0F0F0F0F) | (((t >> 2) & 0x03030303) << 4);
  w[2] = ((a0 >> 4) & 0x0F0F0F0F) | (((t >> 4) & 0x03030303) << 4);
  w[3] = ((a1 >> 4) & 0x0F0F0F0F) | (((t >> 6) & 0x03030303) << 4);
}

// GGML's reference quantizers (what llama.cpp writes with no importance matrix): a weighted min/scale search per
// sub-block for Q2_K (absolute-error fit), Q4_K and Q5_K; a signed scale search per 16 weights for Q3_K (with
// GGML's level-by-level refinement) and Q6_K. n must be a multiple of 256; out receives n/256 blocks.
void quantize_row_q2_k(BlockQ2_K* out, const float* x, int64_t n);
void quantize_row_q3_k(BlockQ3_K* out, const float* x, int64_t n);
void quantize_row_q4_k(BlockQ4_K* out, const float* x, int64_t n);
void quantize_row_q5_k(BlockQ5_K* out, const float* x, int64_t n);
void quantize_row_q6_k(BlockQ6_K* out, const float* x, int64_t n);
// Writes n weights (n multiple of 256). The float version evaluates GGML's expression in GGML's order
// ((d·sc)·q − dmin·m for Q2_K, Q4_K and Q5_K, (d·sc)·(q − 4) for Q3_K, (d·scale)·(q − 32) for Q6_K), so it equals
// GGML's dequantisation bit for bit; the double version is exact.
void dequantize_row_q2_k(float* y, const BlockQ2_K* x, int64_t n);
void dequantize_row_q2_k(double* y, const BlockQ2_K* x, int64_t n);
void dequantize_row_q3_k(float* y, const BlockQ3_K* x, int64_t n);
void dequantize_row_q3_k(double* y, const BlockQ3_K* x, int64_t n);
void dequantize_row_q5_k(float* y, const BlockQ5_K* x, int64_t n);
void dequantize_row_q5_k(double* y, const BlockQ5_K* x, int64_t n);
void dequantize_row_q4_k(float* y, const BlockQ4_K* x, int64_t n);
void dequantize_row_q4_k(double* y, const BlockQ4_K* x, int64_t n);
void dequantize_row_q6_k(float* y, const BlockQ6_K* x, int64_t n);
void dequantize_row_q6_k(double* y, const BlockQ6_K* x, int64_t n);

// GGML's Q6_K blocks (bytes.size() a multiple of 210) in the grouped layout of a Vulkan device
// (kernels/shapes.h: q6_k_device_bytes), and back (the first n_blocks blocks of a grouped buffer).
std::vector<uint8_t> q6_k_to_device(std::span<const uint8_t> blocks);
std::vector<uint8_t> q6_k_from_device(std::span<const uint8_t> grouped, int64_t n_blocks);

}  // namespace q4t::quant
