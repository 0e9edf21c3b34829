// The portable build of the row loops (frozen_rows_skeleton.h over the compiler's generic vectors) and the choice
// between loop sets.
#include "kernels/cpu/frozen_rows.h"

#include <cstring>

#include "kernels/quant/f16.h"

#define Q4T_ROWS_TARGET
#include "kernels/cpu/frozen_rows_skeleton.h"

namespace q4t::cpu::detail {

namespace {

// The vector layer of frozen_rows_skeleton.h on the compiler's generic 16-byte vectors (what a baseline x86-64 or
// an ARM core holds in one register), two to a vector of 8 floats or words, and 32-byte arrays for the decoders'
// byte work. Bytes widen with byte and word interleaves, which baseline SSE2 has (a direct conversion goes
// through scalars).
struct Portable {
  static constexpr int kLanes = 8;
  using F4 = float __attribute__((vector_size(16)));
  using S32 = int32_t __attribute__((vector_size(16)));
  using S16 = int16_t __attribute__((vector_size(16)));
  using S8 = int8_t __attribute__((vector_size(16)));
  using U64 = uint64_t __attribute__((vector_size(16)));
  using U32 = uint32_t __attribute__((vector_size(16)));
  struct F {
    F4 lo, hi;
  };
  struct I {
    S32 lo, hi;
  };
  struct B {
    uint8_t v[32];
  };
  static constexpr bool kLookup = false;

  static F zero() { return F{}; }
  static F load(const float* p) {
    F r;
    std::memcpy(&r.lo, p, 16);
    std::memcpy(&r.hi, p + 4, 16);
    return r;
  }
  static void store(float* p, F a) {
    std::memcpy(p, &a.lo, 16);
    std::memcpy(p + 4, &a.hi, 16);
  }
  template <int N>
  static F loadn(const float* p) {
    static_assert(N == kLanes);
    return load(p);
  }
  template <int N>
  static void storen(float* p, F a) {
    static_assert(N == kLanes);
    store(p, a);
  }
  static F set1(float s) { return {F4{s, s, s, s}, F4{s, s, s, s}}; }
  static F mul(F a, F b) { return {a.lo * b.lo, a.hi * b.hi}; }
  static F add(F a, F b) { return {a.lo + b.lo, a.hi + b.hi}; }
  static float fma1(float a, float b, float c) { return a * b + c; }
  static F fma(F a, F b, F c) { return {a.lo * b.lo + c.lo, a.hi * b.hi + c.hi}; }
  static float hsum(F a) {
    const F4 s = a.lo + a.hi;
    return (s[0] + s[2]) + (s[1] + s[3]);
  }
  static uint16_t u16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return h;
  }
  static float half(const uint8_t* p) { return quant::f16_to_f32(u16_at(p)); }
  static float bf16_one(const uint8_t* p) { return quant::bf16_to_f32(u16_at(p)); }
  // 8 bytes at p in the low lanes of a vector.
  static S8 bytes8(const uint8_t* p) {
    uint64_t w;
    std::memcpy(&w, p, sizeof w);
    return S8(U64{w, 0});
  }
  static I widen(S8 b, bool sign) {
    const S16 w = S16(__builtin_shufflevector(b, b, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    const S16 h = sign ? w >> 8 : w & 0xFF;
    const S32 lo = S32(__builtin_shufflevector(h, h, 0, 0, 1, 1, 2, 2, 3, 3));
    const S32 hi = S32(__builtin_shufflevector(h, h, 4, 4, 5, 5, 6, 6, 7, 7));
    if (sign) return {lo >> 16, hi >> 16};
    return {lo & 0xFFFF, hi & 0xFFFF};
  }
  static F cvt(I a) { return {__builtin_convertvector(a.lo, F4), __builtin_convertvector(a.hi, F4)}; }
  static F levels(const int8_t* q) { return cvt(widen(bytes8(reinterpret_cast<const uint8_t*>(q)), true)); }
  // quant::f16_to_f32 on four halves (the low 16 bits of each word): rebias the exponent; zero and subnormals as
  // mant·2^-24; inf and NaN keep their payload, NaN made quiet.
  static F4 f16_words(S32 h) {
    const S32 e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const S32 normal = ((e + 112) << 23) | (m << 13);
    const S32 special = 0x7F800000 | (m << 13) | ((m != 0) & 0x400000);
    const S32 small = S32(__builtin_convertvector(m, F4) * 0x1p-24f);
    return F4(((h & 0x8000) << 16) | (e == 31 ? special : e == 0 ? small : normal));
  }
  static F f16(const uint8_t* p) {
    S16 h;
    std::memcpy(&h, p, sizeof h);
    const S32 lo = S32(__builtin_shufflevector(h, h, 0, 0, 1, 1, 2, 2, 3, 3)) & 0xFFFF;
    const S32 hi = S32(__builtin_shufflevector(h, h, 4, 4, 5, 5, 6, 6, 7, 7)) & 0xFFFF;
    return {f16_words(lo), f16_words(hi)};
  }
  static F bf16(const uint8_t* p) {
    S16 h;
    std::memcpy(&h, p, sizeof h);
    const S32 lo = S32(__builtin_shufflevector(h, h, 0, 0, 1, 1, 2, 2, 3, 3)) & int32_t(0xFFFF0000);
    const S32 hi = S32(__builtin_shufflevector(h, h, 4, 4, 5, 5, 6, 6, 7, 7)) & int32_t(0xFFFF0000);
    return {F4(lo), F4(hi)};  // each value in the top half of its word
  }

  static I u8(const uint8_t* p) { return widen(bytes8(p), false); }
  static I srl(I a, int n) { return {S32(U32(a.lo) >> n), S32(U32(a.hi) >> n)}; }
  template <int N>
  static F low(I a) {
    return cvt({a.lo & ((1 << N) - 1), a.hi & ((1 << N) - 1)});
  }

  static B load32(const uint8_t* p) {
    B r;
    std::memcpy(r.v, p, 32);
    return r;
  }
  static B load16(const uint8_t* p) {
    B r{};
    std::memcpy(r.v, p, 16);
    return r;
  }
  static B from_u32(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    const uint32_t w[4] = {a, b, c, d};
    B r{};
    std::memcpy(r.v, w, sizeof w);
    return r;
  }
  static void store32(int8_t* p, const B& a) { std::memcpy(p, a.v, 32); }
  static B nibbles(const uint8_t* p) {
    B r;
    for (int i = 0; i < 16; i++) r.v[i] = p[i] & 15;
    for (int i = 0; i < 16; i++) r.v[i + 16] = p[i] >> 4;
    return r;
  }
  static B and8(B a, uint8_t m) {
    for (uint8_t& v : a.v) v &= m;
    return a;
  }
  static B sub8(B a, uint8_t m) {
    for (uint8_t& v : a.v) v = uint8_t(v - m);
    return a;
  }
  static B or_(B a, const B& b) {
    for (int i = 0; i < 32; i++) a.v[i] |= b.v[i];
    return a;
  }
  static B shr(B a, int n) {
    for (uint8_t& v : a.v) v = uint8_t(v >> n);
    return a;
  }
  static B shl(B a, int n) {
    for (uint8_t& v : a.v) v = uint8_t(v << n);
    return a;
  }
  static B lookup16(B a, const int8_t* table) {
    for (uint8_t& v : a.v) v = uint8_t(table[v]);
    return a;
  }
  static B bits(uint32_t x) {
    B r;
    for (int k = 0; k < 4; k++) {
      const uint8_t byte = uint8_t(x >> 8 * k);
      for (int t = 0; t < 8; t++) r.v[8 * k + t] = byte & (1u << t) ? 0xFF : 0;
    }
    return r;
  }
  template <int I>
  static void scales(float* out, const B& a, float m) {
    for (int i = 0; i < 8; i++) out[i] = float(int8_t(a.v[8 * I + i])) * m;
  }
};

template <class D>
constexpr FrozenRowKernels kPortable = rows::kernels<Portable, D>("portable");

}  // namespace

template <Format F>
const FrozenRowKernels& row_kernels() {
#if defined(__x86_64__) || defined(__i386__)
  switch (q4_0_kernels().isa) {
    case Isa::Avx512: return *avx512_row_kernels(F);
    case Isa::Avx2: return *avx2_row_kernels(F);
    case Isa::Portable: break;
  }
#endif
  return kPortable<typename rows::DecoderOf<F>::type>;
}

template const FrozenRowKernels& row_kernels<Format::F16>();
template const FrozenRowKernels& row_kernels<Format::BF16>();
template const FrozenRowKernels& row_kernels<Format::Q8_0>();
template const FrozenRowKernels& row_kernels<Format::Q4_1>();
template const FrozenRowKernels& row_kernels<Format::Q5_0>();
template const FrozenRowKernels& row_kernels<Format::Q5_1>();
template const FrozenRowKernels& row_kernels<Format::IQ4_NL>();
template const FrozenRowKernels& row_kernels<Format::Q2_K>();
template const FrozenRowKernels& row_kernels<Format::Q3_K>();
template const FrozenRowKernels& row_kernels<Format::Q4_K>();
template const FrozenRowKernels& row_kernels<Format::Q5_K>();
template const FrozenRowKernels& row_kernels<Format::Q6_K>();
template const FrozenRowKernels& row_kernels<Format::IQ4_XS>();

}  // namespace q4t::cpu::detail
