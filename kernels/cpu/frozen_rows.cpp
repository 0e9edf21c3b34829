// The portable Q8_0, Q4_K, Q6_K and F16 loops (plain code the compiler may vectorise) and the choice between loop sets.
#include "kernels/cpu/frozen_rows.h"

#include <cstring>

#include "kernels/cpu/q4_0_rows.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/shapes.h"

namespace q4t::cpu::detail {

namespace {

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return quant::f16_to_f32(h);
}

// 32 per-lane partial sums (lane j takes weight j of every block), so the compiler can vectorise across
// lanes without reassociating a single sum.
void q8_0_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; r++) {
    const uint8_t* row = w + r * row_bytes;
    float lanes[32] = {};
    for (int64_t b = 0; b < n / kQ8_0BlockElems; b++) {
      const uint8_t* block = row + b * kQ8_0BlockBytes;
      const auto* qs = reinterpret_cast<const int8_t*>(block + 2);
      const float d = half_at(block);
      const float* xb = x + b * kQ8_0BlockElems;
      for (int j = 0; j < 32; j++) lanes[j] += d * (float(qs[j]) * xb[j]);
    }
    float sum = 0.0f;
    for (float v : lanes) sum += v;
    y[r] = sum;
  }
}

void q8_0_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; r++) {
    for (int64_t b = 0; b < n / kQ8_0BlockElems; b++) {
      const uint8_t* block = w + r * row_bytes + b * kQ8_0BlockBytes;
      const auto* qs = reinterpret_cast<const int8_t*>(block + 2);
      const float c = s[r] * half_at(block);
      float* xb = dx + b * kQ8_0BlockElems;
      for (int j = 0; j < 32; j++) xb[j] += c * float(qs[j]);
    }
  }
}

void q8_0_decode(float* y, const uint8_t* w, int64_t n) {
  for (int64_t b = 0; b < n / kQ8_0BlockElems; b++) {
    const uint8_t* block = w + b * kQ8_0BlockBytes;
    const auto* qs = reinterpret_cast<const int8_t*>(block + 2);
    const float d = half_at(block);
    for (int j = 0; j < 32; j++) y[b * kQ8_0BlockElems + j] = float(qs[j]) * d;
  }
}

// 8 lanes: lane j takes weights i with i % 8 == j.
void f16_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; r++) {
    const uint8_t* row = w + r * row_bytes;
    float lanes[8] = {};
    for (int64_t i = 0; i < n; i++) lanes[i % 8] += half_at(row + 2 * i) * x[i];
    float sum = 0.0f;
    for (float v : lanes) sum += v;
    y[r] = sum;
  }
}

void f16_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; r++)
    for (int64_t i = 0; i < n; i++) dx[i] += s[r] * half_at(w + r * row_bytes + 2 * i);
}

void f16_decode(float* y, const uint8_t* w, int64_t n) { quant::f16_row_to_f32(y, w, n); }

// Q4_K and Q6_K: each 256-weight block decoded exactly as GGML does, then used in f32.
void q4_k_decode(float* y, const uint8_t* w, int64_t n) {
  quant::BlockQ4_K blk;
  for (int64_t b = 0; b < n / kQK_KBlockElems; b++) {
    std::memcpy(&blk, w + b * kQ4_KBlockBytes, sizeof blk);
    quant::dequantize_row_q4_k(y + b * kQK_KBlockElems, &blk, kQK_KBlockElems);
  }
}

void q6_k_decode(float* y, const uint8_t* w, int64_t n) {
  quant::BlockQ6_K blk;
  for (int64_t b = 0; b < n / kQK_KBlockElems; b++) {
    std::memcpy(&blk, w + b * kQ6_KBlockBytes, sizeof blk);
    quant::dequantize_row_q6_k(y + b * kQK_KBlockElems, &blk, kQK_KBlockElems);
  }
}

// One block at a time through `decode`, 8 lanes per sum.
template <void (*Decode)(float*, const uint8_t*, int64_t), int64_t kBlockBytes>
void k_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows, int64_t n) {
  float v[kQK_KBlockElems];
  for (int64_t r = 0; r < n_rows; r++) {
    float lanes[8] = {};
    for (int64_t b = 0; b < n / kQK_KBlockElems; b++) {
      Decode(v, w + r * row_bytes + b * kBlockBytes, kQK_KBlockElems);
      const float* xb = x + b * kQK_KBlockElems;
      for (int i = 0; i < kQK_KBlockElems; i++) lanes[i % 8] += v[i] * xb[i];
    }
    float sum = 0.0f;
    for (float l : lanes) sum += l;
    y[r] = sum;
  }
}

template <void (*Decode)(float*, const uint8_t*, int64_t), int64_t kBlockBytes>
void k_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows, int64_t n) {
  float v[kQK_KBlockElems];
  for (int64_t r = 0; r < n_rows; r++)
    for (int64_t b = 0; b < n / kQK_KBlockElems; b++) {
      Decode(v, w + r * row_bytes + b * kBlockBytes, kQK_KBlockElems);
      float* xb = dx + b * kQK_KBlockElems;
      for (int i = 0; i < kQK_KBlockElems; i++) xb[i] += s[r] * v[i];
    }
}

const FrozenRowKernels kQ4_KPortable = {"portable", kQK_KBlockElems, kQ4_KBlockBytes,
                                        k_dot_rows<q4_k_decode, kQ4_KBlockBytes>,
                                        k_axpy_rows<q4_k_decode, kQ4_KBlockBytes>, q4_k_decode};
const FrozenRowKernels kQ6_KPortable = {"portable", kQK_KBlockElems, kQ6_KBlockBytes,
                                        k_dot_rows<q6_k_decode, kQ6_KBlockBytes>,
                                        k_axpy_rows<q6_k_decode, kQ6_KBlockBytes>, q6_k_decode};

const FrozenRowKernels kQ8_0Portable = {"portable", kQ8_0BlockElems, kQ8_0BlockBytes,
                                        q8_0_dot_rows, q8_0_axpy_rows, q8_0_decode};
const FrozenRowKernels kF16Portable = {"portable", 1, 2, f16_dot_rows, f16_axpy_rows, f16_decode};

}  // namespace

const FrozenRowKernels& q8_0_row_kernels() {
#if defined(__x86_64__) || defined(__i386__)
  if (q4_0_kernels().isa != Isa::Portable) return kQ8_0Avx2;
#endif
  return kQ8_0Portable;
}

const FrozenRowKernels& f16_row_kernels() {
#if defined(__x86_64__) || defined(__i386__)
  if (q4_0_kernels().isa != Isa::Portable) return kF16Avx2;
#endif
  return kF16Portable;
}

const FrozenRowKernels& q4_k_row_kernels() {
#if defined(__x86_64__) || defined(__i386__)
  if (q4_0_kernels().isa != Isa::Portable) return kQ4_KAvx2;
#endif
  return kQ4_KPortable;
}

const FrozenRowKernels& q6_k_row_kernels() {
#if defined(__x86_64__) || defined(__i386__)
  if (q4_0_kernels().isa != Isa::Portable) return kQ6_KAvx2;
#endif
  return kQ6_KPortable;
}

}  // namespace q4t::cpu::detail
