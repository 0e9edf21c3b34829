// The AVX-512 build of the row loops (frozen_rows_skeleton.h over 16 f32 lanes; the 32-byte work of the block
// decoders stays on frozen_rows_x86.h's AVX2 layer). Compiled for every x86 build through target attributes and
// only called when the CPU reports AVX-512F (the Q4_0 AVX-512 set is in use).
#if defined(__x86_64__) || defined(__i386__)
#include "kernels/cpu/frozen_rows_x86.h"

#define Q4T_AVX512_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))
#define Q4T_ROWS_TARGET Q4T_AVX512_TARGET
#include "kernels/cpu/frozen_rows_skeleton.h"

namespace q4t::cpu::detail {

namespace {

struct Avx512 : Avx2 {
  static constexpr int kLanes = 16;
  using F = __m512;
  using I = __m512i;
  static constexpr bool kLookup = true;
  Q4T_AVX512_TARGET static I u8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  Q4T_AVX512_TARGET static I srl(I a, int n) { return _mm512_srli_epi32(a, n); }
  Q4T_AVX512_TARGET static F lut8(I a, const float* t) { return _mm512_permutexvar_ps(a, _mm512_load_ps(t)); }
  Q4T_AVX512_TARGET static F lut16(I a, const float* t) { return _mm512_permutexvar_ps(a, _mm512_load_ps(t)); }
  Q4T_AVX512_TARGET static F lut32(I a, const float* t) {
    return _mm512_permutex2var_ps(_mm512_load_ps(t), a, _mm512_load_ps(t + 16));
  }
  Q4T_AVX512_TARGET static I sll(I a, int n) { return _mm512_slli_epi32(a, n); }
  template <int M>
  Q4T_AVX512_TARGET static I select(I a, I b) {
    return _mm512_ternarylogic_epi32(a, b, _mm512_set1_epi32(M), 0xE4);  // m ? a : b, bit by bit
  }
  Q4T_AVX512_TARGET static I bits_at(uint32_t x, int i, int to) {
    const __m512i t = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_rorv_epi32(_mm512_set1_epi32(int(x)), _mm512_add_epi32(t, _mm512_set1_epi32(i - to)));
  }
  template <int N>
  Q4T_AVX512_TARGET static F low(I a) {  // a lookup: no mask, no conversion
    constexpr int m = (1 << N) - 1;
    return _mm512_permutexvar_ps(a, _mm512_setr_ps(0 & m, 1 & m, 2 & m, 3 & m, 4 & m, 5 & m, 6 & m, 7 & m, 8 & m,
                                                   9 & m, 10 & m, 11 & m, 12 & m, 13 & m, 14 & m, 15 & m));
  }

  Q4T_AVX512_TARGET static F zero() { return _mm512_setzero_ps(); }
  Q4T_AVX512_TARGET static F load(const float* p) { return _mm512_loadu_ps(p); }
  Q4T_AVX512_TARGET static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
  template <int N>
  Q4T_AVX512_TARGET static F loadn(const float* p) {
    static_assert(N == 8 || N == 16);
    if constexpr (N == 8) return _mm512_zextps256_ps512(_mm256_loadu_ps(p));
    else return load(p);
  }
  template <int N>
  Q4T_AVX512_TARGET static void storen(float* p, F a) {
    static_assert(N == 8 || N == 16);
    if constexpr (N == 8) _mm256_storeu_ps(p, _mm512_castps512_ps256(a));
    else store(p, a);
  }
  Q4T_AVX512_TARGET static F set1(float s) { return _mm512_set1_ps(s); }
  Q4T_AVX512_TARGET static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  Q4T_AVX512_TARGET static F add(F a, F b) { return _mm512_add_ps(a, b); }
  Q4T_AVX512_TARGET static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  Q4T_AVX512_TARGET static float hsum(F a) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    return Avx2::hsum(h);
  }
  Q4T_AVX512_TARGET static F levels(const int8_t* q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  }
  Q4T_AVX512_TARGET static F f16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  Q4T_AVX512_TARGET static F bf16(const uint8_t* p) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
};

template <class D>
constexpr FrozenRowKernels kAvx512 = rows::kernels<Avx512, D>("avx512");

}  // namespace

const FrozenRowKernels* avx512_row_kernels(Format f) {
  switch (f) {
    case Format::F16: return &kAvx512<rows::F16>;
    case Format::BF16: return &kAvx512<rows::BF16>;
    case Format::Q8_0: return &kAvx512<rows::Q8_0>;
    case Format::Q4_1: return &kAvx512<rows::Q4_1>;
    case Format::Q5_0: return &kAvx512<rows::Q5_0>;
    case Format::Q5_1: return &kAvx512<rows::Q5_1>;
    case Format::IQ4_NL: return &kAvx512<rows::IQ4_NL>;
    case Format::Q2_K: return &kAvx512<rows::Q2_K>;
    case Format::Q3_K: return &kAvx512<rows::Q3_K>;
    case Format::Q4_K: return &kAvx512<rows::Q4_K>;
    case Format::Q5_K: return &kAvx512<rows::Q5_K>;
    case Format::Q6_K: return &kAvx512<rows::Q6_K>;
    case Format::IQ4_XS: return &kAvx512<rows::IQ4_XS>;
    default: return nullptr;
  }
}

}  // namespace q4t::cpu::detail
#endif
