// AVX-512 Q4_0 kernels (16 f32 lanes). Compiled for every x86 build through target attributes and only
// called when the CPU reports AVX-512F, so the binary still runs on older CPUs.
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

#define Q4T_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))

namespace q4t::cpu::detail {

namespace {

constexpr int kGroupRows = 4;         // rows that share each load of x (or of dx in the backward)
constexpr int64_t kScaleChunk = 128;  // blocks whose scales are converted ahead of an axpy loop

// d of up to 16 consecutive blocks at w, times mul (n < 16 at a row's end: the mask keeps the gather inside
// the row). The 32-bit gather at each block start reads d in its low half.
Q4T_TARGET inline __m512 gather_scales16(const uint8_t* w, int64_t n, __m512 mul) {
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(int(kQ4_0BlockBytes)));
  const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
  const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offsets, w, 1);
  return _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw)), mul);
}

// out[b] = mul * d of block b, for nb blocks.
Q4T_TARGET void load_scales(float* out, const uint8_t* w, int64_t nb, float mul) {
  for (int64_t b = 0; b < nb; b += 16) {
    const __mmask16 m = nb - b >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (nb - b)) - 1);
    _mm512_mask_storeu_ps(out + b, m, gather_scales16(w + b * kQ4_0BlockBytes, nb - b, _mm512_set1_ps(mul)));
  }
}

// The 32 weights of one block as q - 8: lo = weights 0..15 (low nibbles), hi = 16..31 (high nibbles).
// vpermps reads only the low 4 bits of each index lane, so the low nibble needs no mask.
Q4T_TARGET inline void expand(const uint8_t* qs, __m512& lo, __m512& hi) {
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  lo = _mm512_permutexvar_ps(v, table);
  hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
}

// y[0..R) = R consecutive rows · x, x given as prepare_x_terms. Each block's scale is read where it is used, a
// scalar f16 load and conversion: gathering 16 blocks' scales ahead (one vpgatherdd per row and 16 blocks) took
// about half the time on Zen 4, where the gathers stall on the rows' cache misses.
template <int R>
Q4T_TARGET void dot_group(float* y, const uint8_t* w, int64_t row_bytes, const float* xt, int64_t nb) {
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  const float* t = xt;
  for (int64_t b = 0; b < nb; b++, w += kQ4_0BlockBytes, t += kXTermFloats) {
    const __m512 ta = _mm512_load_ps(t), tb = _mm512_load_ps(t + 16), tc = _mm512_load_ps(t + 32);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const uint8_t* block = w + r * row_bytes;
      uint16_t h;
      std::memcpy(&h, block, sizeof h);
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
      __m512 p = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, table), ta, tc);
      p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), tb, p);
      acc[r] = _mm512_fmadd_ps(p, _mm512_set1_ps(_cvtsh_ss(h)), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(acc[r]);
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
  for (int64_t b = 0; b < nb; b++, w += stride, y += kQ4_0BlockElems) {
    uint16_t h;
    std::memcpy(&h, w, sizeof h);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
    __m512 lo, hi;
    expand(w + 2, lo, hi);
    _mm512_storeu_ps(y, _mm512_mul_ps(lo, d));
    _mm512_storeu_ps(y + 16, _mm512_mul_ps(hi, d));
  }
}

constexpr int64_t kPanelTokens = 12;  // 12 tokens x 32 columns = 24 zmm accumulators

// C[M, :n] (+)= A · P, one 12 x 32 register tile at a time: per k, two panel loads feed 24 FMAs.
Q4T_TARGET void panel_gemm(float* C, int64_t ldc, const float* A_packed, const float* P, int64_t M, int64_t n,
                           int64_t K, bool accumulate) {
  const __mmask16 m0 = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
  const __mmask16 m1 = n >= 32 ? __mmask16(0xFFFF) : n > 16 ? __mmask16((1u << (n - 16)) - 1) : __mmask16(0);
  for (int64_t t0 = 0; t0 < M; t0 += kPanelTokens, C += kPanelTokens * ldc) {
    __m512 c0[kPanelTokens], c1[kPanelTokens];
#pragma GCC unroll 12
    for (int i = 0; i < kPanelTokens; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    const float* a = A_packed + t0 * K;
    const float* p = P;
    for (int64_t k = 0; k < K; k++, a += kPanelTokens, p += kPanelCols) {
      const __m512 b0 = _mm512_loadu_ps(p), b1 = _mm512_loadu_ps(p + 16);
#pragma GCC unroll 12
      for (int i = 0; i < kPanelTokens; i++) {
        const __m512 ai = _mm512_set1_ps(a[i]);
        c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
        c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
      }
    }
    const int64_t rows = std::min(kPanelTokens, M - t0);
#pragma GCC unroll 12
    for (int i = 0; i < kPanelTokens; i++) {
      if (i >= rows) break;
      float* ci = C + i * ldc;
      if (accumulate) {
        c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(m0, ci));
        c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(m1, ci + 16));
      }
      _mm512_mask_storeu_ps(ci, m0, c0[i]);
      _mm512_mask_storeu_ps(ci + 16, m1, c1[i]);
    }
  }
}

// dx[n*32] += sum over R rows of s[r]·W[r, chunk] for one chunk of n <= kScaleChunk blocks; dx stays in
// registers across the R rows.
template <int R>
Q4T_TARGET void axpy_group(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n) {
  alignas(64) float c[R][kScaleChunk];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) load_scales(c[r], w + r * row_bytes, n, s[r]);
  for (int64_t b = 0; b < n; b++) {
    float* xb = dx + b * kQ4_0BlockElems;
    __m512 a0 = _mm512_loadu_ps(xb), a1 = _mm512_loadu_ps(xb + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m512 lo, hi;
      expand(w + r * row_bytes + b * kQ4_0BlockBytes + 2, lo, hi);
      const __m512 cr = _mm512_set1_ps(c[r][b]);
      a0 = _mm512_fmadd_ps(lo, cr, a0);
      a1 = _mm512_fmadd_ps(hi, cr, a1);
    }
    _mm512_storeu_ps(xb, a0);
    _mm512_storeu_ps(xb + 16, a1);
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

const Q4_0Kernels kQ4_0Avx512 = {Isa::Avx512, "avx512", dot_rows, dequant, axpy_rows, panel_gemm, kPanelTokens};

}  // namespace q4t::cpu::detail
#endif
