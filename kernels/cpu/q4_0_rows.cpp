// The portable kernel set (plain loops the compiler may vectorise) and the choice between kernel sets.
#include "kernels/cpu/q4_0_rows.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kernels/quant/f16.h"
#include "kernels/shapes.h"

namespace q4t::cpu::detail {

namespace {

float block_scale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return quant::f16_to_f32(h);
}

// 16 per-lane partial sums (lane j takes weights j and j+16 of every block): the compiler can vectorise
// across lanes without reassociating a single sum.
void dot_rows_portable(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows,
                       int64_t nb) {
  for (int64_t r = 0; r < n_rows; r++) {
    const uint8_t* row = w + r * row_bytes;
    float lanes[16] = {};
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* qs = row + b * kQ4_0BlockBytes + 2;
      const float* xb = x + b * kQ4_0BlockElems;
      const float d = block_scale(row + b * kQ4_0BlockBytes);
      for (int j = 0; j < 16; j++)
        lanes[j] += d * (float((qs[j] & 0xF) - 8) * xb[j] + float((qs[j] >> 4) - 8) * xb[j + 16]);
    }
    float sum = 0.0f;
    for (float v : lanes) sum += v;
    y[r] = sum;
  }
}

void dequant_portable(float* y, const uint8_t* w, int64_t nb, int64_t stride) {
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* qs = w + b * stride + 2;
    const float d = block_scale(w + b * stride);
    float* yb = y + b * kQ4_0BlockElems;
    for (int j = 0; j < 16; j++) {
      yb[j] = float((qs[j] & 0xF) - 8) * d;
      yb[j + 16] = float((qs[j] >> 4) - 8) * d;
    }
  }
}

void axpy_rows_portable(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows,
                        int64_t nb) {
  for (int64_t r = 0; r < n_rows; r++) {
    const uint8_t* row = w + r * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t* qs = row + b * kQ4_0BlockBytes + 2;
      const float c = s[r] * block_scale(row + b * kQ4_0BlockBytes);
      float* xb = dx + b * kQ4_0BlockElems;
      for (int j = 0; j < 16; j++) {
        xb[j] += c * float((qs[j] & 0xF) - 8);
        xb[j + 16] += c * float((qs[j] >> 4) - 8);
      }
    }
  }
}

const Q4_0Kernels kPortable = {
    Isa::Portable, "portable", dot_rows_portable, dequant_portable, axpy_rows_portable, nullptr, 0};

bool cpu_supports(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 itself: clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  switch (isa) {
    case Isa::Portable: return true;
    case Isa::Avx2: return avx2;
    case Isa::Avx512: return avx2 && __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == Isa::Portable;
#endif
}

const Q4_0Kernels* best_kernels() {
  for (Isa isa : {Isa::Avx512, Isa::Avx2})
    if (const Q4_0Kernels* k = q4_0_kernels_for(isa)) return k;
  return &kPortable;
}

std::atomic<const Q4_0Kernels*>& active() {
  static std::atomic<const Q4_0Kernels*> k{best_kernels()};
  return k;
}

}  // namespace

void prepare_x_terms(float* t, const float* x, int64_t nb) {
  for (int64_t b = 0; b < nb; b++, t += kXTermFloats) {
    const float* xb = x + b * kQ4_0BlockElems;
    for (int j = 0; j < 16; j++) {
      const float y16 = xb[j + 16] * (1.0f / 16);  // exact: a power of two
      t[j] = xb[j] - y16;
      t[16 + j] = y16;
      t[32 + j] = -8.0f * (xb[j] + xb[j + 16]);
    }
  }
}

void pack_panel_tokens(float* packed, const float* A, int64_t lda, int64_t M, int64_t K, int64_t mr) {
  for (int64_t t0 = 0; t0 < M; t0 += mr)
    for (int64_t k = 0; k < K; k++)
      for (int64_t i = 0; i < mr; i++) *packed++ = t0 + i < M ? A[(t0 + i) * lda + k] : 0.0f;
}

float* thread_scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (int64_t(buf.size()) < n + 16) buf.resize(size_t(n + 16));
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

const Q4_0Kernels* q4_0_kernels_for(Isa isa) {
  if (!cpu_supports(isa)) return nullptr;
  switch (isa) {
    case Isa::Portable: return &kPortable;
#if defined(__x86_64__) || defined(__i386__)
    case Isa::Avx2: return &kQ4_0Avx2;
    case Isa::Avx512: return &kQ4_0Avx512;
#else
    default: return nullptr;
#endif
  }
  return nullptr;
}

const Q4_0Kernels& q4_0_kernels() { return *active().load(std::memory_order_relaxed); }

void use_q4_0_kernels(Isa isa) {
  const Q4_0Kernels* k = q4_0_kernels_for(isa);
  if (!k) throw std::invalid_argument("use_q4_0_kernels: this CPU cannot run the requested kernel set");
  active().store(k, std::memory_order_relaxed);
}

}  // namespace q4t::cpu::detail
