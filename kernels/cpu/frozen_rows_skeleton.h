// The one loop skeleton of the CPU frozen formats (dot_rows, axpy_rows, decode; see frozen_rows.h) and the small
// per-format block decoders it is templated on. Both are written once over a vector layer V and built once per
// instruction set: frozen_rows.cpp includes this with plain arrays for V (the portable loops), the x86 files with
// intrinsics (frozen_rows_avx2.cpp: 8 lanes; frozen_rows_avx512.cpp: 16). Everything is inlined at compile time:
// no call per block.
// The includer defines Q4T_ROWS_TARGET (the target attribute of its instruction set, or nothing) before
// including; everything here is in an unnamed namespace, so each build is its own copy.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/frozen_rows.h"
#include "kernels/cpu/q4_0_rows.h"
#include "kernels/formats.h"
#include "kernels/quant/iq4.h"
#include "kernels/quant/k_quants.h"

#ifndef Q4T_ROWS_TARGET
#error "define Q4T_ROWS_TARGET before including frozen_rows_skeleton.h"
#endif

namespace q4t::cpu::detail {
namespace {

// The vector layer V that everything here is templated on provides:
//   F: kLanes floats (8 or 16). zero, load, store (unaligned), loadn<N> / storen<N> (the first N <= kLanes
//      lanes, N a multiple of 8; the other lanes load as 0), set1, mul, add, fma (a·b + c), hsum; fma1 (the
//      scalar a·b + c, rounded as the lanes' fma); levels (kLanes int8 as floats); f16, bf16 (kLanes of them at
//      a byte address, as floats).
//   I: kLanes int32. u8 (kLanes bytes, zero-extended), srl (logical shift right), low<N> (the low N <= 4 bits
//      as floats). kLookup: whether V also has these, one instruction each: sll, select<M>(a, b) (the bits of a
//      where M has ones, of b elsewhere), bits_at(x, i, to) (lane t: the word x rotated so that its bit i + t
//      lands on bit `to`), lut8 / lut16 / lut32 (t[lane & 7] / t[lane & 15] of a 16-float table, t[lane & 31]
//      of a 32-float one).
//   scalars: half, bf16_one (one f16 / bf16 at a byte address, as a float).
namespace rows {

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Level tables for the lookups of V::kLookup: GGML's kvalues_iq4nl (kernels/quant/iq4.h); Q3_K's 3-bit q − 4 (bit
// 3 does not matter); the 5-bit q of Q5_1 and Q5_K, and Q5_0's q − 16.
alignas(64) inline constexpr float kIQ4Table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                    1,    13,   25,  38,  53,  69,  89,  113};
alignas(64) inline constexpr float kThreeBits[16] = {-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3};
alignas(64) inline constexpr float kFiveBits[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
alignas(64) inline constexpr float kFiveBitsSigned[32] = {-16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6,
                                                          -5,  -4,  -3,  -2,  -1,  0,   1,   2,   3,  4,  5,
                                                          6,   7,   8,   9,   10,  11,  12,  13,  14, 15};

// Lanes shifted so that bit `from` lands on bit `to` (the other bits are whatever the shift brings).
template <class V>
Q4T_ROWS_TARGET inline typename V::I move_bit(typename V::I v, int from, int to) {
  return from > to ? V::srl(v, from - to) : from < to ? V::sll(v, to - from) : v;
}

// A block's scales and offsets, and its staged levels (int8, in the decoder's order) where it stages them.
template <int Subs, bool Offset, int64_t Staged = 0>
struct Unpacked {
  alignas(64) float scale[Subs];
  alignas(64) float offset[Offset ? Subs : 1];
  alignas(64) int8_t q[Staged ? Staged : 1];
};

// The vector layer's bytes, V::B: 32 bytes. load32, load16 (the upper 16 bytes zero), from_u32 (4 words, the
// upper 16 bytes zero), store32, nibbles (16 bytes -> their 16 low nibbles then their 16 high nibbles), and8 /
// sub8 (per byte, with a constant), or_, shr / shl (per byte by a constant; the bits shifted in are unspecified,
// so each is followed by an and8), lookup16 (bytes 0..15 -> table[byte]), bits (32 bits -> byte i = 0xFF when
// bit i is set, else 0); scales<I>(out, v, m): out[0..8) = m · (bytes 8I..8I+7 of v as int8), exact products.

// Bit k of each byte of v, moved to bit `to` (k, to < 8) and masked.
template <class V, int K, int To>
Q4T_ROWS_TARGET inline typename V::B bit_to(typename V::B v) {
  if constexpr (K > To) return V::and8(V::shr(v, K - To), uint8_t(1u << To));
  else if constexpr (K < To) return V::and8(V::shl(v, To - K), uint8_t(1u << To));
  else return V::and8(v, uint8_t(1u << To));
}

// A block decoder D describes kElems weights in kBytes bytes. Most formats are "level" formats: weight i of a
// block is scale[s]·level[i] + offset[s] (offset only where kOffset), s = i / kSubElems, with small integer
// levels (IQ4: one of 16 fixed int8 values). D::unpack writes a block's scales and offsets as floats into
// D::Unpacked. The levels come one vector at a time either straight from the block's bytes, D::group(b, k) for
// weights L·k .. L·k + L − 1 (L = V::kLanes): one widening shared by the groups of the same bytes, then a shift
// and a conversion or a table lookup per vector; or, where that takes more work per vector (a fifth or third bit
// from elsewhere in the block; a 16-entry table without AVX-512), staged by unpack as int8 in 32-byte steps,
// D::slot(j) telling where weights 16j..16j+15 sit. Every scale·level is exact in f32, so scale·level + offset,
// fused or not, rounds once, exactly as GGML's float dequantisation (kernels/quant/*.cpp): decode() equals the
// codecs bit for bit. F16 and BF16 are "float" formats (kSubElems = 0): blocks of one weight, read a vector at a
// time by D::lanes.

// --- 32-weight blocks ------------------------------------------------------------------------------------------
// Weight j < 16 of a 16-byte nibble field is the low nibble of byte j, weight j >= 16 the high nibble of byte
// j − 16 (Q4_1, Q5_0, Q5_1, IQ4_NL; each 32-weight sub-block of IQ4_XS).

// Q8_0 (34 bytes): { f16 d; i8 qs[32] }: d·q.
struct Q8_0 {
  static constexpr int64_t kElems = 32, kBytes = 34;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = false;
  using Unpacked = rows::Unpacked<1, false>;
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    u.scale[0] = V::half(b);
  }
  template <class V>
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    return V::levels(reinterpret_cast<const int8_t*>(b + 2 + V::kLanes * k));
  }
};

// Q4_1 (20 bytes): { f16 d, m; u8 qs[16] }: d·q + m.
struct Q4_1 {
  static constexpr int64_t kElems = 32, kBytes = 20;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = true;
  using Unpacked = rows::Unpacked<1, true>;
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    u.scale[0] = V::half(b);
    u.offset[0] = V::half(b + 2);
  }
  template <class V>
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k;
    const typename V::I v = V::u8(b + 4 + i % 16);
    return V::template low<4>(i < 16 ? v : V::srl(v, 4));
  }
};

// Q5_0 (22 bytes): { f16 d; u8 qh[4]; u8 qs[16] }: d·(q − 16), the fifth bit of weight j bit j of qh. With
// V::kLookup, each vector's q is its nibbles with the fifth bits selected in, looked up; else staged.
struct Q5_0 {
  static constexpr int64_t kElems = 32, kBytes = 22;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = false;
  using Unpacked = rows::Unpacked<1, false, 32>;
  static constexpr int slot(int j) { return 16 * j; }
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    if constexpr (!V::kLookup) {
      const typename V::B q = V::or_(V::nibbles(b + 6), V::and8(V::bits(u32_at(b + 2)), 16));
      V::store32(u.q, V::sub8(q, 16));
    }
    u.scale[0] = V::half(b);
  }
  template <class V>
    requires V::kLookup
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k;
    const typename V::I v = V::u8(b + 6 + i % 16);
    return V::lut32(V::template select<15>(i < 16 ? v : V::srl(v, 4), V::bits_at(u32_at(b + 2), i, 4)),
                    kFiveBitsSigned);
  }
};

// Q5_1 (24 bytes): { f16 d, m; u8 qh[4]; u8 qs[16] }: d·q + m, q as Q5_0's.
struct Q5_1 {
  static constexpr int64_t kElems = 32, kBytes = 24;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = true;
  using Unpacked = rows::Unpacked<1, true, 32>;
  static constexpr int slot(int j) { return 16 * j; }
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    if constexpr (!V::kLookup) V::store32(u.q, V::or_(V::nibbles(b + 8), V::and8(V::bits(u32_at(b + 4)), 16)));
    u.scale[0] = V::half(b);
    u.offset[0] = V::half(b + 2);
  }
  template <class V>
    requires V::kLookup
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k;
    const typename V::I v = V::u8(b + 8 + i % 16);
    return V::lut32(V::template select<15>(i < 16 ? v : V::srl(v, 4), V::bits_at(u32_at(b + 4), i, 4)), kFiveBits);
  }
};

// IQ4_NL (18 bytes): { f16 d; u8 qs[16] }: d·kIQ4Levels[q]. Looked up per vector where V has a one-instruction
// 16-entry lookup, else staged (a byte shuffle per 32 weights).
struct IQ4_NL {
  static constexpr int64_t kElems = 32, kBytes = 18;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = false;
  using Unpacked = rows::Unpacked<1, false, 32>;
  static constexpr int slot(int j) { return 16 * j; }
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    if constexpr (!V::kLookup) V::store32(u.q, V::lookup16(V::nibbles(b + 2), quant::kIQ4Levels.data()));
    u.scale[0] = V::half(b);
  }
  template <class V>
    requires V::kLookup
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k;
    const typename V::I v = V::u8(b + 2 + i % 16);
    return V::lut16(i < 16 ? v : V::srl(v, 4), kIQ4Table);
  }
};

// --- 256-weight super-blocks (kernels/quant/k_quants.h, iq4.h) ---------------------------------------------------

// Q2_K (84 bytes): { u8 scales[16]; u8 qs[64]; f16 d, dmin }: (d·sc)·q − dmin·m per 16 weights; weight
// 128h + 32j + l in bits 2j..2j+1 of qs[32h + l].
struct Q2_K {
  static constexpr int64_t kElems = 256, kBytes = 84;
  static constexpr int kSubElems = 16;
  static constexpr bool kOffset = true;
  using Unpacked = rows::Unpacked<16, true>;
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    const typename V::B s = V::load16(b);
    const typename V::B sc = V::and8(s, 15), m = V::and8(V::shr(s, 4), 15);
    const float d = V::half(b + 80), dmin = -V::half(b + 82);
    V::template scales<0>(u.scale, sc, d), V::template scales<1>(u.scale + 8, sc, d);
    V::template scales<0>(u.offset, m, dmin), V::template scales<1>(u.offset + 8, m, dmin);
  }
  template <class V>
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k, h = i / 128, j = i % 128 / 32, l = i % 32;
    return V::template low<2>(V::srl(V::u8(b + 16 + 32 * h + l), 2 * j));
  }
};

// Q3_K (110 bytes): { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }: (d·sc)·(q − 4) per 16 weights; the low 2
// bits of q as Q2_K's, the third bit of weight i bit i/32 of hmask[i % 32]. With V::kLookup, each vector's q is
// its 2-bit field with the third bit selected in, looked up; else staged.
struct Q3_K {
  static constexpr int64_t kElems = 256, kBytes = 110;
  static constexpr int kSubElems = 16;
  static constexpr bool kOffset = false;
  using Unpacked = rows::Unpacked<16, false, 256>;
  static constexpr int slot(int j) { return 16 * j; }
  template <class V, int H, int J>
  Q4T_ROWS_TARGET static void level(Unpacked& u, typename V::B v, typename V::B hm) {
    const typename V::B q = V::or_(V::and8(V::shr(v, 2 * J), 3), bit_to<V, 4 * H + J, 2>(hm));
    V::store32(u.q + 128 * H + 32 * J, V::sub8(q, 4));
  }
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    if constexpr (!V::kLookup) {
      const typename V::B hm = V::load32(b);
      const typename V::B v0 = V::load32(b + 32), v1 = V::load32(b + 64);
      level<V, 0, 0>(u, v0, hm), level<V, 0, 1>(u, v0, hm), level<V, 0, 2>(u, v0, hm), level<V, 0, 3>(u, v0, hm);
      level<V, 1, 0>(u, v1, hm), level<V, 1, 1>(u, v1, hm), level<V, 1, 2>(u, v1, hm), level<V, 1, 3>(u, v1, hm);
    }
    // GGML's unpacking of the 16 six-bit scales (k3_scale for all at once): the low 4 bits are the nibbles of
    // bytes 0-7, the top 2 bits the bit pairs of bytes 8-11.
    uint32_t w[4];
    quant::k3_scale_words(b + 96, w);
    const typename V::B sc = V::sub8(V::from_u32(w[0], w[1], w[2], w[3]), 32);
    const float d = V::half(b + 108);
    V::template scales<0>(u.scale, sc, d), V::template scales<1>(u.scale + 8, sc, d);
  }
  template <class V>
    requires V::kLookup
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k, h = i / 128, j = i % 128 / 32, l = i % 32;
    const typename V::I q = V::srl(V::u8(b + 32 + 32 * h + l), 2 * j);
    return V::lut8(V::template select<3>(q, move_bit<V>(V::u8(b + l), 4 * h + j, 2)), kThreeBits);
  }
};

// Q4_K's and Q5_K's 8 six-bit scales and mins (k4_scale_min for all 8 at once): sub-blocks 0-3 keep 6 bits in
// bytes 0-3 (scale) and 4-7 (min); 4-7 keep 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the top
// bits of bytes 0-7. scale = d·sc, offset = −dmin·m.
template <class V, class U>
Q4T_ROWS_TARGET inline void k4_scales(U& u, const uint8_t* b) {
  uint32_t w[4];
  quant::k4_scale_min_words(b + 4, w);
  const typename V::B s = V::from_u32(w[0], w[1], w[2], w[3]);
  V::template scales<0>(u.scale, s, V::half(b));
  V::template scales<1>(u.offset, s, -V::half(b + 2));
}

// Q4_K (144 bytes): { f16 d, dmin; u8 scales[12]; u8 qs[128] }: (d·sc)·q − dmin·m per 32 weights; the 64-weight
// chunk c keeps sub-block 2c in the low nibbles of qs[32c..32c+32) and sub-block 2c+1 in the high nibbles.
struct Q4_K {
  static constexpr int64_t kElems = 256, kBytes = 144;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = true;
  using Unpacked = rows::Unpacked<8, true>;
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    k4_scales<V>(u, b);
  }
  template <class V>
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k, j = i / 32;
    const typename V::I v = V::u8(b + 16 + 32 * (j / 2) + i % 32);
    return V::template low<4>(j % 2 ? V::srl(v, 4) : v);
  }
};

// Q5_K (176 bytes): { f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }: Q4_K's plus a fifth bit, bit j of
// qh[l] for weight l of sub-block j. With V::kLookup, each vector's q is its nibbles with the fifth bits selected
// in, looked up; else staged.
struct Q5_K {
  static constexpr int64_t kElems = 256, kBytes = 176;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = true;
  using Unpacked = rows::Unpacked<8, true, 256>;
  static constexpr int slot(int j) { return 16 * j; }
  template <class V, int C>
  Q4T_ROWS_TARGET static void chunk(Unpacked& u, const uint8_t* b, typename V::B qh) {
    const typename V::B v = V::load32(b + 48 + 32 * C);
    V::store32(u.q + 64 * C, V::or_(V::and8(v, 15), bit_to<V, 2 * C, 4>(qh)));
    V::store32(u.q + 64 * C + 32, V::or_(V::and8(V::shr(v, 4), 15), bit_to<V, 2 * C + 1, 4>(qh)));
  }
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    if constexpr (!V::kLookup) {
      const typename V::B qh = V::load32(b + 16);
      chunk<V, 0>(u, b, qh), chunk<V, 1>(u, b, qh), chunk<V, 2>(u, b, qh), chunk<V, 3>(u, b, qh);
    }
    k4_scales<V>(u, b);
  }
  template <class V>
    requires V::kLookup
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k, j = i / 32, l = i % 32;
    const typename V::I v = V::u8(b + 48 + 32 * (j / 2) + l);
    return V::lut32(V::template select<15>(j % 2 ? V::srl(v, 4) : v, move_bit<V>(V::u8(b + 16 + l), j, 4)),
                    kFiveBits);
  }
};

// Q6_K (210 bytes): { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: (d·scale)·(q − 32) per 16 weights. Per
// 128-weight half, weights l, l+32, l+64, l+96 take the low and high nibbles of ql[l] and ql[l+32] and bit pairs
// 0-1, 2-3, 4-5, 6-7 of qh[l]. Staged.
struct Q6_K {
  static constexpr int64_t kElems = 256, kBytes = 210;
  static constexpr int kSubElems = 16;
  static constexpr bool kOffset = false;
  using Unpacked = rows::Unpacked<16, false, 256>;
  static constexpr int slot(int j) { return 16 * j; }
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      const typename V::B a = V::load32(b + 64 * h), c = V::load32(b + 64 * h + 32);
      const typename V::B hb = V::load32(b + 128 + 32 * h);
      int8_t* q = u.q + 128 * h;
      V::store32(q, V::sub8(V::or_(V::and8(a, 15), V::and8(V::shl(hb, 4), 0x30)), 32));
      V::store32(q + 32, V::sub8(V::or_(V::and8(c, 15), V::and8(V::shl(hb, 2), 0x30)), 32));
      V::store32(q + 64, V::sub8(V::or_(V::and8(V::shr(a, 4), 15), V::and8(hb, 0x30)), 32));
      V::store32(q + 96, V::sub8(V::or_(V::and8(V::shr(c, 4), 15), V::and8(V::shr(hb, 2), 0x30)), 32));
    }
    const typename V::B sc = V::load16(b + 192);
    const float d = V::half(b + 208);
    V::template scales<0>(u.scale, sc, d), V::template scales<1>(u.scale + 8, sc, d);
  }
};

// IQ4_XS (136 bytes): { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }: (d·sc)·kIQ4Levels[q] per 32 weights,
// sc = (nibble s of scales_l | bits 2s..2s+1 of scales_h << 4) − 32, q packed into qs[16s..16s+16) as IQ4_NL's.
// Looked up per vector as IQ4_NL; staged, each 32 bytes of qs (two sub-blocks) as their low nibbles then their
// high nibbles.
struct IQ4_XS {
  static constexpr int64_t kElems = 256, kBytes = 136;
  static constexpr int kSubElems = 32;
  static constexpr bool kOffset = false;
  using Unpacked = rows::Unpacked<8, false, 256>;
  // Weights 16j..16j+15: nibble j % 2 of sub-block j / 2 (chunk j / 4, second in its chunk when j / 2 is odd).
  static constexpr int slot(int j) { return 64 * (j / 4) + 32 * (j % 2) + 16 * (j / 2 % 2); }
  template <class V>
  Q4T_ROWS_TARGET static void unpack(Unpacked& u, const uint8_t* b) {
    if constexpr (!V::kLookup) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; c++) {
        const typename V::B v = V::load32(b + 8 + 32 * c);
        V::store32(u.q + 64 * c, V::lookup16(V::and8(v, 15), quant::kIQ4Levels.data()));
        V::store32(u.q + 64 * c + 32, V::lookup16(V::and8(V::shr(v, 4), 15), quant::kIQ4Levels.data()));
      }
    }
    const uint64_t ls = quant::iq4_xs_scale_bytes(b);
    const typename V::B sc = V::sub8(V::from_u32(uint32_t(ls), uint32_t(ls >> 32), 0, 0), 32);
    V::template scales<0>(u.scale, sc, V::half(b));
  }
  template <class V>
    requires V::kLookup
  Q4T_ROWS_TARGET static typename V::F group(const uint8_t* b, int k) {
    const int i = V::kLanes * k, l = i % 32;
    const typename V::I v = V::u8(b + 8 + 16 * (i / 32) + l % 16);
    return V::lut16(l < 16 ? v : V::srl(v, 4), kIQ4Table);
  }
};

// --- float formats: one weight a block, read a vector at a time ------------------------------------------------

struct F16 {
  static constexpr int64_t kElems = 1, kBytes = 2;
  static constexpr int kSubElems = 0;
  template <class V>
  Q4T_ROWS_TARGET static typename V::F lanes(const uint8_t* p) {
    return V::f16(p);
  }
  template <class V>
  Q4T_ROWS_TARGET static float one(const uint8_t* p) {
    return V::half(p);
  }
};

struct BF16 {
  static constexpr int64_t kElems = 1, kBytes = 2;
  static constexpr int kSubElems = 0;
  template <class V>
  Q4T_ROWS_TARGET static typename V::F lanes(const uint8_t* p) {
    return V::bf16(p);
  }
  template <class V>
  Q4T_ROWS_TARGET static float one(const uint8_t* p) {
    return V::bf16_one(p);
  }
};

// --- the skeleton ------------------------------------------------------------------------------------------------

constexpr int kGroupRows = 4;         // rows that share each load of x (or of dx in the backward)
constexpr int64_t kAxpyChunk = 4096;  // dx columns kept in L1 (16 KiB) while every row passes over them

template <class D>
constexpr int kSubs = D::kSubElems ? int(D::kElems / D::kSubElems) : 0;  // scales per block

// Between unpacking and use, the scales and staged levels are read back from memory (a broadcast, or a load
// and a widening) rather than picked out of the registers that wrote them (several shuffles each).
inline void unpacked() { asm volatile("" ::: "memory"); }

// Weights L·k .. L·k + L − 1 of block b (L = V::kLanes) as floats: levels, before the scale. A decoder with a
// group() reads them from the block's bytes; the others stage them (u.q, D::slot).
template <class V, class D>
Q4T_ROWS_TARGET inline typename V::F levels(const typename D::Unpacked& u, const uint8_t* b, int k) {
  if constexpr (requires { D::template group<V>(b, 0); }) {
    return D::template group<V>(b, k);
  } else {
    const int i = V::kLanes * k;
    return V::levels(u.q + D::slot(i / 16) + i % 16);
  }
}

// Calls group.template operator()<R>(r) over n_rows rows in groups of kGroupRows, then the 1..3 left over.
template <class Group>
Q4T_ROWS_TARGET inline void for_row_groups(int64_t n_rows, Group&& group) {
  int64_t r = 0;
  for (; r + kGroupRows <= n_rows; r += kGroupRows) group.template operator()<kGroupRows>(r);
  switch (n_rows - r) {
    case 3: group.template operator()<3>(r); break;
    case 2: group.template operator()<2>(r); break;
    case 1: group.template operator()<1>(r); break;
    default: break;
  }
}

// y[0..R) = R consecutive rows · x over nb blocks. Per scale's run of weights, Σ level·x in one register per row,
// then times the scale into the row's accumulator; the offsets multiply xsum, the sums of x over each run
// (computed once per call). A row's arithmetic does not depend on R.
template <class V, class D, int R>
Q4T_ROWS_TARGET void dot_group(float* y, const uint8_t* w, int64_t row_bytes, const float* x, const float* xsum,
                               int64_t nb) {
  using F = typename V::F;
  constexpr int S = kSubs<D>, G = D::kSubElems / V::kLanes, P = S < V::kLanes ? S : V::kLanes;
  F acc[R];
  float off[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) acc[r] = V::zero(), off[r] = 0.0f;
  for (int64_t b = 0; b < nb; b++) {
    typename D::Unpacked u[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) D::template unpack<V>(u[r], w + r * row_bytes + b * D::kBytes);
    unpacked();
    const float* xb = x + b * D::kElems;
#pragma GCC unroll 16
    for (int s = 0; s < S; s++) {
      F p[R];
      const F x0 = V::load(xb + V::kLanes * s * G);
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) p[r] = V::mul(levels<V, D>(u[r], w + r * row_bytes + b * D::kBytes, s * G), x0);
#pragma GCC unroll 4
      for (int g = 1; g < G; g++) {
        const F xk = V::load(xb + V::kLanes * (s * G + g));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
          p[r] = V::fma(levels<V, D>(u[r], w + r * row_bytes + b * D::kBytes, s * G + g), xk, p[r]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) acc[r] = V::fma(p[r], V::set1(u[r].scale[s]), acc[r]);
    }
    if constexpr (D::kOffset) {
      const float* xs = xsum + b * S;
      if constexpr (S >= 8) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
          for (int t = 0; t < S; t += P)
            acc[r] = V::fma(V::template loadn<P>(u[r].offset + t), V::template loadn<P>(xs + t), acc[r]);
      } else {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
          for (int t = 0; t < S; t++) off[r] = V::fma1(u[r].offset[t], xs[t], off[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) y[r] = V::hsum(acc[r]) + off[r];
}

// The float formats: L lanes per row, the n % L tail added after them.
template <class V, class D, int R>
Q4T_ROWS_TARGET void dot_group_float(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  F acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) acc[r] = V::zero();
  const int64_t nl = n / L * L;
  for (int64_t i = 0; i < nl; i += L) {
    const F xv = V::load(x + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = V::fma(D::template lanes<V>(w + r * row_bytes + 2 * i), xv, acc[r]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    float sum = V::hsum(acc[r]);
    for (int64_t i = nl; i < n; i++) sum += D::template one<V>(w + r * row_bytes + 2 * i) * x[i];
    y[r] = sum;
  }
}

template <class V, class D>
Q4T_ROWS_TARGET void dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows,
                              int64_t n) {
  if constexpr (D::kSubElems == 0) {
    for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_ROWS_TARGET {
      dot_group_float<V, D, R>(y + r, w + r * row_bytes, row_bytes, x, n);
    });
  } else {
    const float* xsum = nullptr;
    if constexpr (D::kOffset) {
      // Σ x over each scale's run of weights, for the offsets.
      float* xs = thread_scratch(n / D::kSubElems);
      for (int64_t j = 0; j < n / D::kSubElems; j++) {
        const float* xj = x + j * D::kSubElems;
        typename V::F v = V::load(xj);
#pragma GCC unroll 4
        for (int g = 1; g < D::kSubElems / V::kLanes; g++) v = V::add(v, V::load(xj + V::kLanes * g));
        xs[j] = V::hsum(v);
      }
      xsum = xs;
    }
    for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_ROWS_TARGET {
      dot_group<V, D, R>(y + r, w + r * row_bytes, row_bytes, x, xsum, n / D::kElems);
    });
  }
}

// dx[nb blocks] += Σ over R rows of s[r]·W[r, :]: per scale's run, the levels times s[r]·scale of each row, then
// the rows' Σ s[r]·offset added once.
template <class V, class D, int R>
Q4T_ROWS_TARGET void axpy_group(float* __restrict dx, const uint8_t* __restrict w, int64_t row_bytes,
                                const float* __restrict s, int64_t nb) {
  using F = typename V::F;
  constexpr int S = kSubs<D>, G = D::kSubElems / V::kLanes, P = S < V::kLanes ? S : V::kLanes;
  for (int64_t b = 0; b < nb; b++) {
    typename D::Unpacked u[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) D::template unpack<V>(u[r], w + r * row_bytes + b * D::kBytes);
    unpacked();
    alignas(64) float c[R][S];  // s[r]·scale
    alignas(64) float e[S];     // Σ s[r]·offset
    if constexpr (S >= 8) {
#pragma GCC unroll 4
      for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < S; t += P)
          V::template storen<P>(c[r] + t, V::mul(V::template loadn<P>(u[r].scale + t), V::set1(s[r])));
      if constexpr (D::kOffset) {
#pragma GCC unroll 2
        for (int t = 0; t < S; t += P) {
          F v = V::mul(V::template loadn<P>(u[0].offset + t), V::set1(s[0]));
#pragma GCC unroll 4
          for (int r = 1; r < R; r++) v = V::fma(V::template loadn<P>(u[r].offset + t), V::set1(s[r]), v);
          V::template storen<P>(e + t, v);
        }
      }
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < R; r++)
        for (int t = 0; t < S; t++) c[r][t] = u[r].scale[t] * s[r];
      if constexpr (D::kOffset) {
        for (int t = 0; t < S; t++) {
          float v = u[0].offset[t] * s[0];
#pragma GCC unroll 4
          for (int r = 1; r < R; r++) v = V::fma1(u[r].offset[t], s[r], v);
          e[t] = v;
        }
      }
    }
    float* xb = dx + b * D::kElems;
#pragma GCC unroll 16
    for (int t = 0; t < S; t++) {
#pragma GCC unroll 4
      for (int g = 0; g < G; g++) {
        const int k = t * G + g;
        F a = V::load(xb + V::kLanes * k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
          a = V::fma(levels<V, D>(u[r], w + r * row_bytes + b * D::kBytes, k), V::set1(c[r][t]), a);
        if constexpr (D::kOffset) a = V::add(a, V::set1(e[t]));
        V::store(xb + V::kLanes * k, a);
      }
    }
  }
}

// The float formats; the tail in the same order and with the same rounding as the lanes, so a column's result
// does not depend on whether a thread's range puts it in a vector or in the tail.
template <class V, class D, int R>
Q4T_ROWS_TARGET void axpy_group_float(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n) {
  using F = typename V::F;
  constexpr int L = V::kLanes;
  const int64_t nl = n / L * L;
  for (int64_t i = 0; i < nl; i += L) {
    F a = V::load(dx + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) a = V::fma(D::template lanes<V>(w + r * row_bytes + 2 * i), V::set1(s[r]), a);
    V::store(dx + i, a);
  }
  for (int64_t i = nl; i < n; i++)
    for (int r = 0; r < R; r++) dx[i] = V::fma1(D::template one<V>(w + r * row_bytes + 2 * i), s[r], dx[i]);
}

// Column chunks outside, rows inside: a chunk of dx stays in L1 while every row passes over it.
template <class V, class D>
Q4T_ROWS_TARGET void axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows,
                               int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += kAxpyChunk) {
    const int64_t nc = std::min(kAxpyChunk, n - c0);
    const uint8_t* wc = w + c0 / D::kElems * D::kBytes;
    for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_ROWS_TARGET {
      if constexpr (D::kSubElems == 0)
        axpy_group_float<V, D, R>(dx + c0, wc + r * row_bytes, row_bytes, s + r, nc);
      else
        axpy_group<V, D, R>(dx + c0, wc + r * row_bytes, row_bytes, s + r, nc / D::kElems);
    });
  }
}

// y[0:n) = the weights at w as floats: scale·level (+ offset), one rounding, as the codec.
template <class V, class D>
Q4T_ROWS_TARGET void decode(float* y, const uint8_t* w, int64_t n) {
  constexpr int L = V::kLanes;
  if constexpr (D::kSubElems == 0) {
    const int64_t nl = n / L * L;
    for (int64_t i = 0; i < nl; i += L) V::store(y + i, D::template lanes<V>(w + 2 * i));
    for (int64_t i = nl; i < n; i++) y[i] = D::template one<V>(w + 2 * i);
  } else {
    constexpr int S = kSubs<D>, G = D::kSubElems / L;
    for (int64_t b = 0; b < n / D::kElems; b++, w += D::kBytes, y += D::kElems) {
      typename D::Unpacked u;
      D::template unpack<V>(u, w);
      unpacked();
#pragma GCC unroll 16
      for (int t = 0; t < S; t++) {
        const typename V::F sc = V::set1(u.scale[t]);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
          const int k = t * G + g;
          if constexpr (D::kOffset)
            V::store(y + L * k, V::fma(levels<V, D>(u, w, k), sc, V::set1(u.offset[t])));
          else
            V::store(y + L * k, V::mul(levels<V, D>(u, w, k), sc));
        }
      }
    }
  }
}

// The decoder of each format.
template <Format F>
struct DecoderOf;
#define Q4T_DECODER(fmt) \
  template <>            \
  struct DecoderOf<Format::fmt> { using type = fmt; };
Q4T_DECODER(F16)
Q4T_DECODER(BF16)
Q4T_DECODER(Q8_0)
Q4T_DECODER(Q4_1)
Q4T_DECODER(Q5_0)
Q4T_DECODER(Q5_1)
Q4T_DECODER(IQ4_NL)
Q4T_DECODER(Q2_K)
Q4T_DECODER(Q3_K)
Q4T_DECODER(Q4_K)
Q4T_DECODER(Q5_K)
Q4T_DECODER(Q6_K)
Q4T_DECODER(IQ4_XS)
#undef Q4T_DECODER

// The kernel set of decoder D in this build.
template <class V, class D>
constexpr FrozenRowKernels kernels(const char* name) {
  return {name, D::kElems, D::kBytes, dot_rows<V, D>, axpy_rows<V, D>, decode<V, D>};
}

}  // namespace rows

}  // namespace
}  // namespace q4t::cpu::detail
