// AVX2 + FMA Q4_0 kernels (8 f32 lanes). Compiled for every x86 build through target attributes and only
// called when the CPU reports AVX2, FMA and F16C.
#if defined(__x86_64__) || defined(__i386__)
// GCC 12's intrinsic headers self-initialise their "undefined" vectors, which -Wuninitialized flags
// (GCC bug 105593); the warning points into the header, so silence it there only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>

#include "kernels/cpu/q4_0_rows.h"
#include "kernels/shapes.h"

#define Q4T_TARGET __attribute__((target("avx2,fma,f16c")))

namespace q4t::cpu::detail {

namespace {

constexpr int kGroupRows = 4;         // rows that share each load of x (or of dx in the backward)
constexpr int64_t kScaleChunk = 128;  // blocks whose scales are converted to f32 ahead of the main loop

// out[b] = mul * d of block b, for nb blocks 18 bytes apart.
Q4T_TARGET void load_scales(float* out, const uint8_t* w, int64_t nb, float mul) {
  for (int64_t b = 0; b < nb; b++) {
    uint16_t h;
    std::memcpy(&h, w + b * kQ4_0BlockBytes, sizeof h);
    out[b] = _cvtsh_ss(h) * mul;
  }
}

// The nibbles of one block as unsigned q in [0, 15] (not yet minus 8): q[0] = weights 0..7, q[1] = 8..15,
// q[2] = 16..23, q[3] = 24..31.
Q4T_TARGET inline void expand(const uint8_t* qs, __m256 q[4]) {
  const __m256i low4 = _mm256_set1_epi32(0xF);
  const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
  q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, low4));
  q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, low4));
  q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
  q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

// y[0..R) = R consecutive rows · x, x given as prepare_x_terms. Each block is two halves of 8 lanes: bytes
// qs[0..7] carry weights 0..7 (low nibbles) and 16..23 (high), qs[8..15] weights 8..15 and 24..31.
template <int R>
Q4T_TARGET void dot_group(float* y, const uint8_t* w, int64_t row_bytes, const float* xt, int64_t nb) {
  const __m256i low4 = _mm256_set1_epi32(0xF);
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  alignas(32) float d[R][kScaleChunk];
  for (int64_t c0 = 0; c0 < nb; c0 += kScaleChunk) {
    const int64_t n = std::min(kScaleChunk, nb - c0);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) load_scales(d[r], w + r * row_bytes + c0 * kQ4_0BlockBytes, n, 1.0f);
    const uint8_t* qs = w + c0 * kQ4_0BlockBytes + 2;
    const float* t = xt + c0 * kXTermFloats;
    for (int64_t b = 0; b < n; b++, qs += kQ4_0BlockBytes, t += kXTermFloats) {
      const __m256 a0 = _mm256_load_ps(t), a1 = _mm256_load_ps(t + 8);
      const __m256 b0 = _mm256_load_ps(t + 16), b1 = _mm256_load_ps(t + 24);
      const __m256 c = _mm256_add_ps(_mm256_load_ps(t + 32), _mm256_load_ps(t + 40));
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        const uint8_t* q = qs + r * row_bytes;
        const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
        const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
        __m256 p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, low4)), a0, c);
        p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v0), b0, p);
        p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, low4)), a1, p);
        p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v1), b1, p);
        acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(d[r][b]), acc[r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    y[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
}

Q4T_TARGET void dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows,
                         int64_t nb) {
  float* xt = thread_scratch(nb * kXTermFloats);
  prepare_x_terms(xt, x, nb);
  int64_t r = 0;
  for (; r + kGroupRows <= n_rows; r += kGroupRows)
    dot_group<kGroupRows>(y + r, w + r * row_bytes, row_bytes, xt, nb);
  switch (n_rows - r) {
    case 3: dot_group<3>(y + r, w + r * row_bytes, row_bytes, xt, nb); break;
    case 2: dot_group<2>(y + r, w + r * row_bytes, row_bytes, xt, nb); break;
    case 1: dot_group<1>(y + r, w + r * row_bytes, row_bytes, xt, nb); break;
    default: break;
  }
}

Q4T_TARGET void dequant(float* y, const uint8_t* w, int64_t nb, int64_t stride) {
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t b = 0; b < nb; b++, w += stride, y += kQ4_0BlockElems) {
    uint16_t h;
    std::memcpy(&h, w, sizeof h);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    __m256 q[4];
    expand(w + 2, q);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_sub_ps(q[k], eight), d));
  }
}

constexpr int64_t kPanelTokens = 6;  // 6 tokens x 16 columns = 12 ymm accumulators

// Lane mask for storing the first `valid` (0..8) floats of a ymm.
Q4T_TARGET inline __m256i first_lanes(int64_t valid) {
  alignas(32) static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - valid));
}

// C[M, :n] (+)= A · P, one 6 x 16 register tile at a time (the 32-column panel in two halves).
Q4T_TARGET void panel_gemm(float* C, int64_t ldc, const float* A_packed, const float* P, int64_t M, int64_t n,
                           int64_t K, bool accumulate) {
  for (int64_t half = 0; half * 16 < n; half++) {
    const int64_t cols = std::min<int64_t>(16, n - half * 16);
    const __m256i mask0 = first_lanes(std::min<int64_t>(8, cols)),
                  mask1 = first_lanes(std::max<int64_t>(0, cols - 8));
    for (int64_t t0 = 0; t0 < M; t0 += kPanelTokens) {
      __m256 c0[kPanelTokens], c1[kPanelTokens];
#pragma GCC unroll 6
      for (int i = 0; i < kPanelTokens; i++) c0[i] = c1[i] = _mm256_setzero_ps();
      const float* a = A_packed + t0 * K;
      const float* p = P + half * 16;
      for (int64_t k = 0; k < K; k++, a += kPanelTokens, p += kPanelCols) {
        const __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);
#pragma GCC unroll 6
        for (int i = 0; i < kPanelTokens; i++) {
          const __m256 ai = _mm256_broadcast_ss(a + i);
          c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
          c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
        }
      }
      const int64_t rows = std::min(kPanelTokens, M - t0);
#pragma GCC unroll 6
      for (int i = 0; i < kPanelTokens; i++) {
        if (i >= rows) break;
        float* ci = C + (t0 + i) * ldc + half * 16;
        if (accumulate) {
          c0[i] = _mm256_add_ps(c0[i], _mm256_maskload_ps(ci, mask0));
          c1[i] = _mm256_add_ps(c1[i], _mm256_maskload_ps(ci + 8, mask1));
        }
        _mm256_maskstore_ps(ci, mask0, c0[i]);
        _mm256_maskstore_ps(ci + 8, mask1, c1[i]);
      }
    }
  }
}

// dx[n*32] += sum over R rows of s[r]·W[r, chunk] for one chunk of n <= kScaleChunk blocks. With
// c_r = s[r]·d_r, sum_r c_r·(q_r - 8) = sum_r c_r·q_r - 8·sum_r c_r: the second term is one scalar per block.
template <int R>
Q4T_TARGET void axpy_group(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n) {
  alignas(32) float c[R][kScaleChunk];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) load_scales(c[r], w + r * row_bytes, n, s[r]);
  for (int64_t b = 0; b < n; b++) {
    float csum = 0.0f;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) csum += c[r][b];
    const __m256 bias = _mm256_set1_ps(-8.0f * csum);
    float* xb = dx + b * kQ4_0BlockElems;
    __m256 a[4];
#pragma GCC unroll 8
    for (int k = 0; k < 4; k++) a[k] = _mm256_add_ps(_mm256_loadu_ps(xb + 8 * k), bias);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m256 q[4];
      expand(w + r * row_bytes + b * kQ4_0BlockBytes + 2, q);
      const __m256 cr = _mm256_set1_ps(c[r][b]);
#pragma GCC unroll 8
      for (int k = 0; k < 4; k++) a[k] = _mm256_fmadd_ps(q[k], cr, a[k]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(xb + 8 * k, a[k]);
  }
}

// Column chunks outside, rows inside: a chunk of dx (16 KiB) stays in L1 while every row passes over it.
Q4T_TARGET void axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows,
                          int64_t nb) {
  for (int64_t c0 = 0; c0 < nb; c0 += kScaleChunk) {
    const int64_t n = std::min(kScaleChunk, nb - c0);
    float* dxc = dx + c0 * kQ4_0BlockElems;
    const uint8_t* wc = w + c0 * kQ4_0BlockBytes;
    int64_t r = 0;
    for (; r + kGroupRows <= n_rows; r += kGroupRows)
      axpy_group<kGroupRows>(dxc, wc + r * row_bytes, row_bytes, s + r, n);
    switch (n_rows - r) {
      case 3: axpy_group<3>(dxc, wc + r * row_bytes, row_bytes, s + r, n); break;
      case 2: axpy_group<2>(dxc, wc + r * row_bytes, row_bytes, s + r, n); break;
      case 1: axpy_group<1>(dxc, wc + r * row_bytes, row_bytes, s + r, n); break;
      default: break;
    }
  }
}

}  // namespace

const Q4_0Kernels kQ4_0Avx2 = {Isa::Avx2, "avx2", dot_rows, dequant, axpy_rows, panel_gemm, kPanelTokens};

}  // namespace q4t::cpu::detail
#endif
