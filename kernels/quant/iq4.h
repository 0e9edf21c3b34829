// IQ4_NL and IQ4_XS block codecs, byte for byte GGML's 4-bit non-linear formats: each 4-bit index picks one of
// 16 fixed int8 levels (kIQ4Levels), times a scale.
//
// IQ4_NL (18 bytes, 32 weights): { f16 d; u8 qs[16] }: weight j = d·level[q] with q the low (j < 16) or high
// (j >= 16) nibble of qs[j % 16].
// IQ4_XS (136 bytes, 256 weights): { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }: eight 32-weight
// sub-blocks, each with a 6-bit scale stored as ls = sc + 32 (low 4 bits: nibble s % 2 of scales_l[s / 2]; top 2
// bits: bits 2s..2s+1 of scales_h); weight j of sub-block s = (d·sc)·level[q], q packed into qs[16s..16s+16) as
// IQ4_NL's.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "kernels/shapes.h"

namespace q4t::quant {

// GGML's kvalues_iq4nl: the 16 levels, ascending.
inline constexpr std::array<int8_t, 16> kIQ4Levels = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                      1,    13,   25,  38,  53,  69,  89,  113};

struct BlockIQ4_NL {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // level indices: low nibbles -> weights 0..15, high -> weights 16..31
};
static_assert(sizeof(BlockIQ4_NL) == kIQ4_NLBlockBytes, "IQ4_NL block must be 18 bytes");

struct BlockIQ4_XS {
  uint16_t d;           // f16 super-block scale
  uint16_t scales_h;    // top 2 bits of the 8 sub-block scales
  uint8_t scales_l[4];  // low 4 bits of the 8 sub-block scales
  uint8_t qs[128];      // level indices, 16 bytes per sub-block
};
static_assert(sizeof(BlockIQ4_XS) == kIQ4_XSBlockBytes, "IQ4_XS block must be 136 bytes");

// The eight ls = sc + 32 of an IQ4_XS block at b (its raw bytes), one byte each (byte s: sub-block s): the 8 low
// nibbles and the 8 bit pairs spread out and joined, for the SIMD loops.
inline uint64_t iq4_xs_scale_bytes(const uint8_t* b) {
  uint64_t lo = uint64_t(b[4]) | uint64_t(b[5]) << 8 | uint64_t(b[6]) << 16 | uint64_t(b[7]) << 24;
  lo = (lo | lo << 16) & 0x0000FFFF0000FFFFull;
  lo = (lo | lo << 8) & 0x00FF00FF00FF00FFull;
  lo = (lo | lo << 4) & 0x0F0F0F0F0F0F0F0Full;
  uint64_t hi = uint64_t(b[2]) | uint64_t(b[3]) << 8;
  hi = (hi | hi << 24) & 0x000000FF000000FFull;
  hi = (hi | hi << 12) & 0x000F000F000F000Full;
  hi = (hi | hi << 6) & 0x0303030303030303ull;
  return lo | hi << 4;
}

// The scale of IQ4_XS sub-block s (0..7), in [−32, 31].
inline int iq4_xs_scale(const BlockIQ4_XS& b, int s) {
  const int low = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
  const int high = (b.scales_h >> (2 * s)) & 3;
  return (low | (high << 4)) - 32;
}

// GGML's quantize_iq4_nl / quantize_iq4_xs with no importance matrix (what llama.cpp writes): per 32 weights, a
// scale search over 15 step sizes weighted by x², each weight taking the nearest level. n must be a multiple of
// 32 (IQ4_NL) or 256 (IQ4_XS); out receives n/32 or n/256 blocks.
void quantize_row_iq4_nl(BlockIQ4_NL* out, const float* x, int64_t n);
void quantize_row_iq4_xs(BlockIQ4_XS* out, const float* x, int64_t n);

// Write n weights. The float versions are GGML's d·level (IQ4_NL) and (d·sc)·level (IQ4_XS), both exact in
// float, so they equal GGML's dequantisation bit for bit; the double versions are exact too.
void dequantize_row_iq4_nl(float* y, const BlockIQ4_NL* x, int64_t n);
void dequantize_row_iq4_nl(double* y, const BlockIQ4_NL* x, int64_t n);
void dequantize_row_iq4_xs(float* y, const BlockIQ4_XS* x, int64_t n);
void dequantize_row_iq4_xs(double* y, const BlockIQ4_XS* x, int64_t n);

}  // namespace q4t::quant
