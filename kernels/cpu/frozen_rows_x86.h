// The x86 vector layers of frozen_rows_skeleton.h. Avx2: 8 floats in a ymm register, 32 bytes in another; its
// functions carry their own target attributes (AVX2, FMA, F16C), so any build at least that wide can inline
// them. Included by the x86 builds of the skeleton, each of which gets its own copy (unnamed namespace).
#pragma once
#if defined(__x86_64__) || defined(__i386__)
// GCC 12's intrinsic headers self-initialise their "undefined" vectors, which -Wuninitialized flags
// (GCC bug 105593); the warning points into the header, so silence it there only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cmath>
#include <cstdint>
#include <cstring>

#define Q4T_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

namespace q4t::cpu::detail {
namespace {

struct Avx2 {
  static constexpr int kLanes = 8;
  using F = __m256;
  using B = __m256i;
  using I = __m256i;
  static constexpr bool kLookup = false;  // a 16-entry float lookup takes two permutes and a blend

  Q4T_AVX2_TARGET static F zero() { return _mm256_setzero_ps(); }
  Q4T_AVX2_TARGET static F load(const float* p) { return _mm256_loadu_ps(p); }
  Q4T_AVX2_TARGET static void store(float* p, F a) { _mm256_storeu_ps(p, a); }
  template <int N>
  Q4T_AVX2_TARGET static F loadn(const float* p) {
    static_assert(N == kLanes);
    return load(p);
  }
  template <int N>
  Q4T_AVX2_TARGET static void storen(float* p, F a) {
    static_assert(N == kLanes);
    store(p, a);
  }
  Q4T_AVX2_TARGET static F set1(float s) { return _mm256_set1_ps(s); }
  Q4T_AVX2_TARGET static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  Q4T_AVX2_TARGET static F add(F a, F b) { return _mm256_add_ps(a, b); }
  Q4T_AVX2_TARGET static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  Q4T_AVX2_TARGET static float fma1(float a, float b, float c) { return std::fma(a, b, c); }
  Q4T_AVX2_TARGET static float hsum(F a) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
  Q4T_AVX2_TARGET static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
  }
  static float bf16_one(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    const uint32_t b = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  }
  Q4T_AVX2_TARGET static F levels(const int8_t* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  }
  Q4T_AVX2_TARGET static F f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  Q4T_AVX2_TARGET static F bf16(const uint8_t* p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }

  Q4T_AVX2_TARGET static I u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  Q4T_AVX2_TARGET static I srl(I a, int n) { return _mm256_srli_epi32(a, n); }
  template <int N>
  Q4T_AVX2_TARGET static F low(I a) {
    if constexpr (N == 2) return _mm256_permutevar8x32_ps(_mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3), a);
    else return _mm256_cvtepi32_ps(_mm256_and_si256(a, _mm256_set1_epi32((1 << N) - 1)));
  }

  Q4T_AVX2_TARGET static B load32(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  Q4T_AVX2_TARGET static B load16(const uint8_t* p) {
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  Q4T_AVX2_TARGET static B from_u32(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return _mm256_zextsi128_si256(_mm_setr_epi32(int(a), int(b), int(c), int(d)));
  }
  Q4T_AVX2_TARGET static void store32(int8_t* p, B a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), a); }
  Q4T_AVX2_TARGET static B nibbles(const uint8_t* p) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(15));
  }
  Q4T_AVX2_TARGET static B and8(B a, uint8_t m) { return _mm256_and_si256(a, _mm256_set1_epi8(char(m))); }
  Q4T_AVX2_TARGET static B sub8(B a, uint8_t m) { return _mm256_sub_epi8(a, _mm256_set1_epi8(char(m))); }
  Q4T_AVX2_TARGET static B or_(B a, B b) { return _mm256_or_si256(a, b); }
  // 16-bit shifts: the bits they carry across bytes are what the callers' masks drop.
  Q4T_AVX2_TARGET static B shr(B a, int n) { return _mm256_srli_epi16(a, n); }
  Q4T_AVX2_TARGET static B shl(B a, int n) { return _mm256_slli_epi16(a, n); }
  Q4T_AVX2_TARGET static B lookup16(B a, const int8_t* table) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(table));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), a);
  }
  // GGML's bytes_from_bits_32: byte i takes the word's byte i / 8, sets every bit but bit i % 8 and compares.
  Q4T_AVX2_TARGET static B bits(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(int(x)), shuf);
    const __m256i m = _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE);
    return _mm256_cmpeq_epi8(_mm256_or_si256(b, m), _mm256_set1_epi64x(-1));
  }
  template <int I>
  Q4T_AVX2_TARGET static void scales(float* out, B a, float m) {
    const __m128i h = I < 2 ? _mm256_castsi256_si128(a) : _mm256_extracti128_si256(a, 1);
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(I % 2 ? _mm_srli_si128(h, 8) : h));
    _mm256_storeu_ps(out, _mm256_mul_ps(v, _mm256_set1_ps(m)));
  }
};

}  // namespace
}  // namespace q4t::cpu::detail
#endif
