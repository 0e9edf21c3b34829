// The x86 loops of int_rows.h, written once and built once per instruction set: int_rows_avx2.cpp (AVX2, 16
// vector registers) and int_rows_avx512.cpp (the same code with AVX-512's 32 registers and VNNI's vpdpbusd). The
// includer defines Q4T_INT_TARGET (the target attribute), Q4T_INT_VNNI (0 or 1), Q4T_INT_NAME (the set's name) and
// Q4T_INT_SET (the name of its function template, declared in int_rows_x86.h).
//
// A decoder per format gives a block's levels 32 at a time as bytes (signed, or
// unsigned with the offset taken out through the activation's block sums) and its integer scales; one loop
// skeleton per block size multiplies them with the rounded activation (vpmaddubsw, then vpmaddwd with the scales).
// A weight is d·sc[g]·u + dm·mn[g] for 16-weight group g of its block (the 32-weight formats: sc = mn = 1), u its
// level; so a block's dot product is d·dx·Σ_g sc[g]·Σ u·q + dm·dx·Σ_g mn[g]·bsum[g], all but the two float
// products in integers.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/frozen_rows_x86.h"
#include "kernels/cpu/int_rows.h"
#include "kernels/cpu/int_rows_x86.h"
#include "kernels/formats.h"
#include "kernels/quant/iq4.h"
#include "kernels/quant/k_quants.h"

#if !defined(Q4T_INT_TARGET) || !defined(Q4T_INT_VNNI) || !defined(Q4T_INT_NAME) || !defined(Q4T_INT_SET)
#error "define Q4T_INT_TARGET, Q4T_INT_VNNI, Q4T_INT_NAME and Q4T_INT_SET before including int_rows_skeleton.h"
#endif

namespace q4t::cpu::detail {

namespace {

using V = Avx2;
using B = __m256i;

// --- rounding the activation (the rules of kernels/quant/act_round.h, 8 lanes at a time) ----------------------

Q4T_INT_TARGET inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

Q4T_INT_TARGET inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// 32 values times s, rounded to nearest-even (the default rounding mode), capped at 127 when Cap, into q (in
// order); bsum gets the two 16-value sums.
template <bool Cap>
Q4T_INT_TARGET inline void round32(int8_t* q, int16_t* bsum, const float* x, float s) {
  __m256i v[4];
  for (int i = 0; i < 4; i++) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), _mm256_set1_ps(s)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if constexpr (Cap) r = _mm256_min_ps(r, _mm256_set1_ps(127.0f));
    v[i] = _mm256_cvtps_epi32(r);
  }
  bsum[0] = int16_t(hsum_i32(_mm256_add_epi32(v[0], v[1])));
  bsum[1] = int16_t(hsum_i32(_mm256_add_epi32(v[2], v[3])));
  // The packs interleave the 128-bit lanes; the permute puts the 4-value runs back in order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

Q4T_INT_TARGET inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

Q4T_INT_TARGET void round_q8_0(int8_t* q, float* d, int16_t* bsum, const float* x, int64_t n) {
  for (int64_t b = 0; b < n / 32; b++, x += 32, q += 32, bsum += 2) {
    __m256 m = abs_ps(_mm256_loadu_ps(x));
    for (int i = 1; i < 4; i++) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * i)));
    const float dd = hmax(m) / 127.0f;
    round32<false>(q, bsum, x, dd != 0.0f ? 1.0f / dd : 0.0f);
    d[b] = _cvtsh_ss(_cvtss_sh(dd, _MM_FROUND_TO_NEAREST_INT));
  }
}

Q4T_INT_TARGET void round_q8_k(int8_t* q, float* d, int16_t* bsum, const float* x, int64_t n) {
  for (int64_t b = 0; b < n / 256; b++, x += 256, q += 256, bsum += 16) {
    __m256 m = abs_ps(_mm256_loadu_ps(x));
    for (int i = 1; i < 32; i++) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * i)));
    const float amax = hmax(m);
    if (amax == 0.0f) {
      std::fill(q, q + 256, int8_t(0));
      std::fill(bsum, bsum + 16, int16_t(0));
      d[b] = 0.0f;
      continue;
    }
    int i = 0;
    while (std::fabs(x[i]) != amax) i++;  // the first value of largest magnitude
    const float s = -127.0f / x[i];
    for (int c = 0; c < 8; c++) round32<true>(q + 32 * c, bsum + 2 * c, x + 32 * c, s);
    d[b] = 1.0f / s;
  }
}

// --- the block decoders ------------------------------------------------------------------------------------------
// D::chunk<C>(b): weights 32C .. 32C + 31 of block b as bytes; D::kSigned: int8 levels (else unsigned, < 64).
// 32-weight blocks: D::scales(b, d, dm). 256-weight blocks: D::scales(s, b) fills Scales (sc and mn per 16-weight
// group as int16).

struct Scales {
  alignas(32) int16_t sc[16];
  alignas(32) int16_t mn[16];
  float d, dm;
};

Q4T_INT_TARGET inline void store16(int16_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
// 8 byte-sized values, each repeated for the two 16-weight groups of its 32-weight sub-block, as int16.
Q4T_INT_TARGET inline __m256i pairs_u8(uint32_t lo, uint32_t hi) {
  const __m128i v = _mm_setr_epi32(int(lo), int(hi), 0, 0);
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v));
}
Q4T_INT_TARGET inline __m256i pairs_i8(__m128i v) { return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v)); }

// Bit K of each byte of v moved to bit To and masked.
template <int K, int To>
Q4T_INT_TARGET inline B bit_to(B v) {
  if constexpr (K > To) return V::and8(V::shr(v, K - To), uint8_t(1u << To));
  else if constexpr (K < To) return V::and8(V::shl(v, To - K), uint8_t(1u << To));
  else return V::and8(v, uint8_t(1u << To));
}

// Q4_0 (18 bytes): { f16 d; u8 qs[16] }: d·(u − 8), u the nibbles (weights 0-15 the low ones).
struct Q4_0 {
  static constexpr int64_t kElems = 32, kBytes = 18;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) { return V::nibbles(b + 2); }
  Q4T_INT_TARGET static void scales(const uint8_t* b, float& d, float& dm) { d = V::half(b), dm = -8 * d; }
};

// Q4_1 (20 bytes): { f16 d, m; u8 qs[16] }: d·u + m.
struct Q4_1 {
  static constexpr int64_t kElems = 32, kBytes = 20;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) { return V::nibbles(b + 4); }
  Q4T_INT_TARGET static void scales(const uint8_t* b, float& d, float& dm) { d = V::half(b), dm = V::half(b + 2); }
};

// Q5_0 (22 bytes): { f16 d; u8 qh[4]; u8 qs[16] }: d·(u − 16), u's fifth bit for weight j bit j of qh.
struct Q5_0 {
  static constexpr int64_t kElems = 32, kBytes = 22;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    return V::or_(V::nibbles(b + 6), V::and8(V::bits(qh), 16));
  }
  Q4T_INT_TARGET static void scales(const uint8_t* b, float& d, float& dm) { d = V::half(b), dm = -16 * d; }
};

// Q5_1 (24 bytes): { f16 d, m; u8 qh[4]; u8 qs[16] }: d·u + m, u as Q5_0's.
struct Q5_1 {
  static constexpr int64_t kElems = 32, kBytes = 24;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    return V::or_(V::nibbles(b + 8), V::and8(V::bits(qh), 16));
  }
  Q4T_INT_TARGET static void scales(const uint8_t* b, float& d, float& dm) { d = V::half(b), dm = V::half(b + 2); }
};

// Q8_0 (34 bytes): { f16 d; i8 qs[32] }: d·q.
struct Q8_0 {
  static constexpr int64_t kElems = 32, kBytes = 34;
  static constexpr bool kSigned = true;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) { return V::load32(b + 2); }
  Q4T_INT_TARGET static void scales(const uint8_t* b, float& d, float& dm) { d = V::half(b), dm = 0; }
};

// IQ4_NL (18 bytes): { f16 d; u8 qs[16] }: d·kIQ4Levels[u].
struct IQ4_NL {
  static constexpr int64_t kElems = 32, kBytes = 18;
  static constexpr bool kSigned = true;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) { return V::lookup16(V::nibbles(b + 2), quant::kIQ4Levels.data()); }
  Q4T_INT_TARGET static void scales(const uint8_t* b, float& d, float& dm) { d = V::half(b), dm = 0; }
};

// Q2_K (84 bytes): { u8 scales[16]; u8 qs[64]; f16 d, dmin }: d·sc·u − dmin·m per 16 weights (sc, m the nibbles
// of scales[g]); weight 128h + 32j + l in bits 2j..2j+1 of qs[32h + l].
struct Q2_K {
  static constexpr int64_t kElems = 256, kBytes = 84;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    return V::and8(V::shr(V::load32(b + 16 + 32 * (C / 4)), 2 * (C % 4)), 3);
  }
  Q4T_INT_TARGET static void scales(Scales& s, const uint8_t* b) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), m = _mm_set1_epi8(15);
    store16(s.sc, _mm256_cvtepu8_epi16(_mm_and_si128(v, m)));
    store16(s.mn, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m)));
    s.d = V::half(b + 80), s.dm = -V::half(b + 82);
  }
};

// Q3_K (110 bytes): { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }: d·(sc − 32)·(u − 4) per 16 weights, u's low
// 2 bits as Q2_K's and its third bit for weight i bit i / 32 of hmask[i % 32].
struct Q3_K {
  static constexpr int64_t kElems = 256, kBytes = 110;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    const B low = V::and8(V::shr(V::load32(b + 32 + 32 * (C / 4)), 2 * (C % 4)), 3);
    return V::or_(low, bit_to<C, 2>(V::load32(b)));
  }
  Q4T_INT_TARGET static void scales(Scales& s, const uint8_t* b) {
    uint32_t w[4];
    quant::k3_scale_words(b + 96, w);
    const __m128i sc = _mm_sub_epi8(_mm_setr_epi32(int(w[0]), int(w[1]), int(w[2]), int(w[3])), _mm_set1_epi8(32));
    const __m256i v = _mm256_cvtepi8_epi16(sc);
    store16(s.sc, v), store16(s.mn, v);
    s.d = V::half(b + 108), s.dm = -4 * s.d;
  }
};

// Q4_K's and Q5_K's eight 6-bit scales and mins (sub-blocks 0-3 in bytes 0-7; 4-7 in the nibbles of bytes 8-11
// with their top 2 bits in the top bits of bytes 0-7); then d, −dmin.
Q4T_INT_TARGET inline void k4_scales(Scales& s, const uint8_t* b) {
  uint32_t w[4];
  quant::k4_scale_min_words(b + 4, w);
  store16(s.sc, pairs_u8(w[0], w[1]));
  store16(s.mn, pairs_u8(w[2], w[3]));
  s.d = V::half(b), s.dm = -V::half(b + 2);
}

// Q4_K (144 bytes): { f16 d, dmin; u8 scales[12]; u8 qs[128] }: d·sc·u − dmin·m per 32 weights; sub-block 2c in
// the low nibbles of qs[32c .. 32c + 32), 2c + 1 in the high ones.
struct Q4_K {
  static constexpr int64_t kElems = 256, kBytes = 144;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    const B v = V::load32(b + 16 + 32 * (C / 2));
    return V::and8(C % 2 ? V::shr(v, 4) : v, 15);
  }
  Q4T_INT_TARGET static void scales(Scales& s, const uint8_t* b) { k4_scales(s, b); }
};

// Q5_K (176 bytes): { f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }: Q4_K's with a fifth bit, bit j of
// qh[l] for weight l of sub-block j.
struct Q5_K {
  static constexpr int64_t kElems = 256, kBytes = 176;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    const B v = V::load32(b + 48 + 32 * (C / 2));
    return V::or_(V::and8(C % 2 ? V::shr(v, 4) : v, 15), bit_to<C, 4>(V::load32(b + 16)));
  }
  Q4T_INT_TARGET static void scales(Scales& s, const uint8_t* b) { k4_scales(s, b); }
};

// Q6_K (210 bytes): { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: d·sc·(u − 32) per 16 weights. Per 128-weight
// half h, weights l, l + 32, l + 64, l + 96 take the low and high nibbles of ql[64h + l] and ql[64h + l + 32] and
// bit pairs 0-1, 2-3, 4-5, 6-7 of qh[32h + l].
struct Q6_K {
  static constexpr int64_t kElems = 256, kBytes = 210;
  static constexpr bool kSigned = false;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    constexpr int h = C / 4, k = C % 4;
    const B q = V::load32(b + 64 * h + 32 * (k % 2)), hb = V::load32(b + 128 + 32 * h);
    const B low = V::and8(k < 2 ? q : V::shr(q, 4), 15);
    const B high = k == 0 ? V::shl(hb, 4) : k == 1 ? V::shl(hb, 2) : k == 2 ? hb : V::shr(hb, 2);
    return V::or_(low, V::and8(high, 0x30));
  }
  Q4T_INT_TARGET static void scales(Scales& s, const uint8_t* b) {
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    store16(s.sc, v), store16(s.mn, v);
    s.d = V::half(b + 208), s.dm = -32 * s.d;
  }
};

// IQ4_XS (136 bytes): { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }: d·(sc − 32)·kIQ4Levels[u] per 32
// weights, sc = nibble j of scales_l | bits 2j..2j+1 of scales_h << 4; sub-block j's nibbles in qs[16j .. 16j + 16)
// as IQ4_NL's.
struct IQ4_XS {
  static constexpr int64_t kElems = 256, kBytes = 136;
  static constexpr bool kSigned = true;
  template <int C>
  Q4T_INT_TARGET static B chunk(const uint8_t* b) {
    return V::lookup16(V::nibbles(b + 8 + 16 * C), quant::kIQ4Levels.data());
  }
  Q4T_INT_TARGET static void scales(Scales& s, const uint8_t* b) {
    const int64_t ls = int64_t(quant::iq4_xs_scale_bytes(b));
    store16(s.sc, pairs_i8(_mm_sub_epi8(_mm_set_epi64x(0, ls), _mm_set1_epi8(32))));
    s.d = V::half(b), s.dm = 0;
  }
};

// --- the skeleton --------------------------------------------------------------------------------------------------

// Σ over pairs of w·x in int16 (no pair exceeds 2·128·127): signed levels through their magnitude and x's sign.
template <class D>
Q4T_INT_TARGET inline __m256i pair_sums(B w, B x) {
  if constexpr (D::kSigned) return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  else return _mm256_maddubs_epi16(w, x);
}

// Σ over runs of four of w·x in int32: one vpdpbusd where the build has VNNI, else pair sums and vpmaddwd.
template <class D>
Q4T_INT_TARGET inline __m256i quad_sums(B w, B x, __m256i ones) {
#if Q4T_INT_VNNI
  (void)ones;
  if constexpr (D::kSigned) return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  else return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(pair_sums<D>(w, x), ones);
#endif
}

// y[0..R) = R rows · x, blocks of 32: per block one int32 vector, times d·dx; the offsets dm·dx·Σq per block.
template <class D, int R>
Q4T_INT_TARGET void dot_group32(float* y, const uint8_t* w, int64_t rb, const RoundedX& x, int64_t nb) {
  __m256 acc[R];
  float off[R];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), off[r] = 0.0f;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; b++) {
    const B xq = V::load32(reinterpret_cast<const uint8_t*>(x.q) + 32 * b);
    const float dx = x.d[b], sx = dx * float(x.bsum[2 * b] + x.bsum[2 * b + 1]);
    // The next group's rows (contiguous after these) are fetched as this group goes: short rows otherwise leave
    // the hardware prefetcher a new set of streams every few KiB (Zen 4, two threads, 14336 x 4096: Q4_0 0.98-1.07
    // ms against 1.70-1.79, Q8_0 1.33-1.98 against 2.36-3.24; 4096 x 14336 the same or faster).
    const char* next = reinterpret_cast<const char*>(w + R * rb + R * b * D::kBytes);
    for (int64_t o = 0; o < R * D::kBytes; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const uint8_t* blk = w + r * rb + b * D::kBytes;
      float d, dm;
      D::scales(blk, d, dm);
      const __m256i s = quad_sums<D>(D::template chunk<0>(blk), xq, ones);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * dx), acc[r]);
      if constexpr (!D::kSigned) off[r] = std::fma(dm, sx, off[r]);
    }
  }
  for (int r = 0; r < R; r++) y[r] = V::hsum(acc[r]) + off[r];
}

// Lanes 0-7: sc[2C], lanes 8-15: sc[2C + 1] (the two 16-weight groups of chunk C, one per 128-bit half), from
// half = sc[0..8) (C < 4) or sc[8..16) in both 128-bit halves: one in-lane shuffle (a broadcast word pair and a
// shuffle per chunk measured 12-18% slower with the weights in cache: one thread, 4096 x 4096, Q2_K 456 us against
// 375, Q6_K 500 against 441).
template <int C>
Q4T_INT_TARGET inline __m256i group_scales(__m256i half) {
  constexpr char a = char(4 * (C % 4)), b = char(a + 1), c = char(a + 2), d = char(a + 3);
  const __m256i m = _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, c, d, c, d, c, d, c, d, c, d, c,
                                     d, c, d, c, d);
  return _mm256_shuffle_epi8(half, m);
}

template <class D, int C>
Q4T_INT_TARGET inline __m256i chunk_sum(const uint8_t* blk, const int8_t* xq, __m256i lo, __m256i hi) {
  const __m256i p = pair_sums<D>(D::template chunk<C>(blk), V::load32(reinterpret_cast<const uint8_t*>(xq) + 32 * C));
  return _mm256_madd_epi16(p, group_scales<C>(C < 4 ? lo : hi));
}

// How far ahead of a 256-weight block its row is prefetched (Zen 4, 4096 x 14336, two threads: Q6_K 1.17-1.27 ms
// against 1.38-1.57 without, Q3_K 0.97 against 1.05-1.06; 1 and 2 KiB ahead gained less, 8 KiB the same or less).
constexpr int64_t kPrefetchBytes = 4096;

// Blocks of 256 (R = 1, see dot_rows): per block and row, Σ_g sc[g]·Σ u·q in one int32 vector, times d·dx; the offsets
// dm·dx·Σ_g mn[g]·bsum[g].
template <class D, int R>
Q4T_INT_TARGET void dot_group256(float* y, const uint8_t* w, int64_t rb, const RoundedX& x, int64_t nb) {
  __m256 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const int8_t* xq = x.q + 256 * b;
    const float dx = x.d[b];
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsum + 16 * b));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const uint8_t* blk = w + r * rb + b * D::kBytes;
      for (int64_t o = 0; o < D::kBytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes + o, _MM_HINT_T0);
      Scales s;
      D::scales(s, blk);
      const __m256i lo = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(s.sc)));
      const __m256i hi = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(s.sc + 8)));
      __m256i i0 = _mm256_add_epi32(chunk_sum<D, 0>(blk, xq, lo, hi), chunk_sum<D, 1>(blk, xq, lo, hi));
      __m256i i1 = _mm256_add_epi32(chunk_sum<D, 2>(blk, xq, lo, hi), chunk_sum<D, 3>(blk, xq, lo, hi));
      i0 = _mm256_add_epi32(i0, _mm256_add_epi32(chunk_sum<D, 4>(blk, xq, lo, hi), chunk_sum<D, 5>(blk, xq, lo, hi)));
      i1 = _mm256_add_epi32(i1, _mm256_add_epi32(chunk_sum<D, 6>(blk, xq, lo, hi), chunk_sum<D, 7>(blk, xq, lo, hi)));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(i0, i1)), _mm256_set1_ps(s.d * dx), acc[r]);
      if constexpr (!D::kSigned) {
        const __m256i o = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(s.mn)), bs);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(o), _mm256_set1_ps(s.dm * dx), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; r++) y[r] = V::hsum(acc[r]);
}

template <class D>
Q4T_INT_TARGET void dot_rows(float* y, const uint8_t* w, int64_t rb, const RoundedX& x, int64_t n_rows, int64_t n) {
  // Rows that share each load of x: 4 for the 32-weight blocks; the 256-weight blocks stream one row at a time
  // (measured on a Zen 4 core, one thread, 4096 x 14336: Q6_K 2.6-2.7 ms against 4.1-4.2 with 4 rows and 5.4-5.5
  // with 2, Q3_K 2.1-2.2 against 3.3, Q4_K 2.0-2.1 against 2.4-2.5; Q4_0 2.7 with 4 rows against 3.0 with 1).
  constexpr int G = D::kElems == 32 ? 4 : 1;
  const auto group = [&]<int R>(int64_t r) Q4T_INT_TARGET {
    if constexpr (D::kElems == 32) dot_group32<D, R>(y + r, w + r * rb, rb, x, n / 32);
    else dot_group256<D, R>(y + r, w + r * rb, rb, x, n / 256);
  };
  int64_t r = 0;
  for (; r + G <= n_rows; r += G) group.template operator()<G>(r);
  for (; r < n_rows; r++) group.template operator()<1>(r);
}

template <class D>
constexpr IntRowKernels kInt = {Q4T_INT_NAME, D::kElems, D::kBytes, D::kElems == 32 ? round_q8_0 : round_q8_k,
                                dot_rows<D>};

template <Format F>
struct DecoderOf;
#define Q4T_DECODER(fmt) \
  template <>            \
  struct DecoderOf<Format::fmt> { using type = fmt; };
Q4T_INT_FORMATS(Q4T_DECODER)
#undef Q4T_DECODER

}  // namespace

// This build's loops of format F.
template <Format F>
const IntRowKernels* Q4T_INT_SET() {
  return &kInt<typename DecoderOf<F>::type>;
}
#define Q4T_INSTANTIATE(fmt) template const IntRowKernels* Q4T_INT_SET<Format::fmt>();
Q4T_INT_FORMATS(Q4T_INSTANTIATE)
#undef Q4T_INSTANTIATE

}  // namespace q4t::cpu::detail


