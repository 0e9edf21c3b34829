// The portable build of the row loops (frozen_rows_skeleton.h over plain arrays the compiler may vectorise) and
// the choice between loop sets.
#include "kernels/cpu/frozen_rows.h"

#include <cstring>

#include "kernels/quant/f16.h"

#define Q4T_ROWS_TARGET
#include "kernels/cpu/frozen_rows_skeleton.h"

namespace q4t::cpu::detail {

namespace {

// The vector layer of frozen_rows_skeleton.h as arrays: 8 floats, 32 bytes.
struct Portable {
  struct F {
    float v[8];
  };
  struct B {
    uint8_t v[32];
  };

  static F zero() { return F{}; }
  static F load(const float* p) {
    F r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static void store(float* p, const F& a) { std::memcpy(p, a.v, sizeof a.v); }
  static F set1(float s) {
    F r;
    for (float& v : r.v) v = s;
    return r;
  }
  static F mul(F a, const F& b) {
    for (int i = 0; i < 8; i++) a.v[i] *= b.v[i];
    return a;
  }
  static F add(F a, const F& b) {
    for (int i = 0; i < 8; i++) a.v[i] += b.v[i];
    return a;
  }
  static float fma1(float a, float b, float c) { return a * b + c; }
  static F fma(const F& a, const F& b, F c) {
    for (int i = 0; i < 8; i++) c.v[i] = fma1(a.v[i], b.v[i], c.v[i]);
    return c;
  }
  static float hsum(const F& a) {
    return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
  }
  static uint16_t u16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return h;
  }
  static float half(const uint8_t* p) { return quant::f16_to_f32(u16_at(p)); }
  static float bf16_one(const uint8_t* p) { return quant::bf16_to_f32(u16_at(p)); }
  static F levels(const int8_t* q) {
    F r;
    for (int i = 0; i < 8; i++) r.v[i] = float(q[i]);
    return r;
  }
  static F f16(const uint8_t* p) {
    F r;
    for (int i = 0; i < 8; i++) r.v[i] = half(p + 2 * i);
    return r;
  }
  static F bf16(const uint8_t* p) {
    F r;
    for (int i = 0; i < 8; i++) r.v[i] = bf16_one(p + 2 * i);
    return r;
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
    for (int i = 0; i < 16; i++) r.v[i] = p[i] & 15, r.v[i + 16] = p[i] >> 4;
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
    for (int i = 0; i < 32; i++) r.v[i] = (x >> i) & 1 ? 0xFF : 0;
    return r;
  }
  template <int I>
  static F to_f(const B& a) {
    F r;
    for (int i = 0; i < 8; i++) r.v[i] = float(int8_t(a.v[8 * I + i]));
    return r;
  }
};

template <class D>
constexpr FrozenRowKernels kPortable = rows::kernels<Portable, D>("portable");

}  // namespace

template <Format F>
const FrozenRowKernels& row_kernels() {
#if defined(__x86_64__) || defined(__i386__)
  if (q4_0_kernels().isa != Isa::Portable) return *avx2_row_kernels(F);
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
