// AVX2 + FMA + F16C loops of the Q8_0 and F16 linears (8 f32 lanes). Compiled for every x86 build through
// target attributes and only called when the CPU reports AVX2, FMA and F16C (the Q4_0 AVX2 or AVX-512 set is
// in use).
#if defined(__x86_64__) || defined(__i386__)
// GCC 12's intrinsic headers self-initialise their "undefined" vectors, which -Wuninitialized flags
// (GCC bug 105593); the warning points into the header, so silence it there only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/frozen_rows.h"
#include "kernels/shapes.h"

#define Q4T_TARGET __attribute__((target("avx2,fma,f16c")))

namespace q4t::cpu::detail {

namespace {

constexpr int kGroupRows = 4;          // rows that share each load of x (or of dx in the backward)
constexpr int64_t kAxpyChunk = 4096;   // dx columns kept in L1 (16 KiB) while every row passes over them

Q4T_TARGET inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

Q4T_TARGET inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// Signed quants qs[0..7] as 8 floats.
Q4T_TARGET inline __m256 q8_lanes(const uint8_t* qs) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs))));
}

// Calls group<R>(row offset, R) over n_rows rows in groups of kGroupRows, then the 1..3 left over.
template <class Group>
Q4T_TARGET void for_row_groups(int64_t n_rows, Group&& group) {
  int64_t r = 0;
  for (; r + kGroupRows <= n_rows; r += kGroupRows) group.template operator()<kGroupRows>(r);
  switch (n_rows - r) {
    case 3: group.template operator()<3>(r); break;
    case 2: group.template operator()<2>(r); break;
    case 1: group.template operator()<1>(r); break;
    default: break;
  }
}

// y[0..R) = R consecutive Q8_0 rows · x: per block, the 32 products in one register, then times d.
template <int R>
Q4T_TARGET void q8_0_dot_group(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t nb) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const float* xb = x + b * kQ8_0BlockElems;
    const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
    const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const uint8_t* block = w + r * row_bytes + b * kQ8_0BlockBytes;
      __m256 p = _mm256_mul_ps(q8_lanes(block + 2), x0);
      p = _mm256_fmadd_ps(q8_lanes(block + 10), x1, p);
      p = _mm256_fmadd_ps(q8_lanes(block + 18), x2, p);
      p = _mm256_fmadd_ps(q8_lanes(block + 26), x3, p);
      acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(half_at(block)), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) y[r] = hsum(acc[r]);
}

Q4T_TARGET void q8_0_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows,
                              int64_t n) {
  for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
    q8_0_dot_group<R>(y + r, w + r * row_bytes, row_bytes, x, n / kQ8_0BlockElems);
  });
}

// dx[nb*32] += Σ over R rows of s[r]·W[r, :] for nb blocks.
template <int R>
Q4T_TARGET void q8_0_axpy_group(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t nb) {
  for (int64_t b = 0; b < nb; b++) {
    float* xb = dx + b * kQ8_0BlockElems;
    __m256 a[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) a[k] = _mm256_loadu_ps(xb + 8 * k);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const uint8_t* block = w + r * row_bytes + b * kQ8_0BlockBytes;
      const __m256 c = _mm256_set1_ps(s[r] * half_at(block));
#pragma GCC unroll 4
      for (int k = 0; k < 4; k++) a[k] = _mm256_fmadd_ps(q8_lanes(block + 2 + 8 * k), c, a[k]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(xb + 8 * k, a[k]);
  }
}

// Column chunks outside, rows inside: a chunk of dx stays in L1 while every row passes over it.
Q4T_TARGET void q8_0_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows,
                               int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += kAxpyChunk) {
    const int64_t nb = std::min(kAxpyChunk, n - c0) / kQ8_0BlockElems;
    const uint8_t* wc = w + c0 / kQ8_0BlockElems * kQ8_0BlockBytes;
    for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
      q8_0_axpy_group<R>(dx + c0, wc + r * row_bytes, row_bytes, s + r, nb);
    });
  }
}

Q4T_TARGET void q8_0_decode(float* y, const uint8_t* w, int64_t n) {
  for (int64_t b = 0; b < n / kQ8_0BlockElems; b++, w += kQ8_0BlockBytes, y += kQ8_0BlockElems) {
    const __m256 d = _mm256_set1_ps(half_at(w));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(q8_lanes(w + 2 + 8 * k), d));
  }
}

// 8 halves at p as floats.
Q4T_TARGET inline __m256 f16_lanes(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// y[0..R) = R consecutive F16 rows · x; the n % 8 tail is added after the lanes.
template <int R>
Q4T_TARGET void f16_dot_group(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  const int64_t n8 = n / 8 * 8;
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(f16_lanes(w + r * row_bytes + 2 * i), xv, acc[r]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    float sum = hsum(acc[r]);
    for (int64_t i = n8; i < n; i++) sum += half_at(w + r * row_bytes + 2 * i) * x[i];
    y[r] = sum;
  }
}

Q4T_TARGET void f16_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows,
                             int64_t n) {
  for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
    f16_dot_group<R>(y + r, w + r * row_bytes, row_bytes, x, n);
  });
}

template <int R>
Q4T_TARGET void f16_axpy_group(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  for (int64_t i = 0; i < n8; i += 8) {
    __m256 a = _mm256_loadu_ps(dx + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) a = _mm256_fmadd_ps(f16_lanes(w + r * row_bytes + 2 * i), _mm256_set1_ps(s[r]), a);
    _mm256_storeu_ps(dx + i, a);
  }
  // The tail in the same order and with the same fused rounding as the lanes, so a column's result does not
  // depend on whether a thread's range puts it in a vector or in the tail.
  for (int64_t i = n8; i < n; i++) {
    for (int r = 0; r < R; r++) dx[i] = std::fma(half_at(w + r * row_bytes + 2 * i), s[r], dx[i]);
  }
}

Q4T_TARGET void f16_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows,
                              int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += kAxpyChunk) {
    const int64_t nc = std::min(kAxpyChunk, n - c0);
    for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
      f16_axpy_group<R>(dx + c0, w + r * row_bytes + 2 * c0, row_bytes, s + r, nc);
    });
  }
}

Q4T_TARGET void f16_decode(float* y, const uint8_t* w, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(y + i, f16_lanes(w + 2 * i));
  for (int64_t i = n8; i < n; i++) y[i] = half_at(w + 2 * i);
}

}  // namespace

const FrozenRowKernels kQ8_0Avx2 = {"avx2", kQ8_0BlockElems, kQ8_0BlockBytes,
                                    q8_0_dot_rows, q8_0_axpy_rows, q8_0_decode};
const FrozenRowKernels kF16Avx2 = {"avx2", 1, 2, f16_dot_rows, f16_axpy_rows, f16_decode};

}  // namespace q4t::cpu::detail
#endif
