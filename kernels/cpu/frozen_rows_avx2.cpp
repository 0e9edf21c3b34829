// AVX2 + FMA + F16C loops of the Q8_0, Q4_K, Q6_K and F16 linears (8 f32 lanes). Compiled for every x86 build through
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
#include <utility>

#include "kernels/cpu/frozen_rows.h"
#include "kernels/formats.h"
#include "kernels/shapes.h"

#define Q4T_TARGET __attribute__((target("avx2,fma,f16c")))
#define Q4T_ROWS_TARGET Q4T_TARGET
#include "kernels/cpu/frozen_rows_skeleton.h"

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

// --- Q4_K: 144-byte blocks { f16 d, dmin; u8 scales[12]; u8 qs[128] } (kernels/quant/k_quants.h) ---------------

// A block's 8 sub-block scales d·sc and mins dmin·m as floats (both products exact in f32).
struct Q4_KScales {
  alignas(32) float scale[8];
  alignas(32) float min[8];
};

Q4T_TARGET inline void q4_k_scales(Q4_KScales* s, const uint8_t* block) {
  uint32_t u[3];
  std::memcpy(u, block + 4, sizeof u);
  // GGML's unpacking (k4_scale_min for all 8 at once): sub-blocks 0-3 keep 6 bits in bytes 0-3 (scale) and 4-7
  // (min); 4-7 keep 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the top bits of bytes 0-7.
  const uint32_t sc_lo = u[0] & 0x3F3F3F3F, m_lo = u[1] & 0x3F3F3F3F;
  const uint32_t sc_hi = (u[2] & 0x0F0F0F0F) | (((u[0] >> 6) & 0x03030303) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0F0F0F0F) | (((u[1] >> 6) & 0x03030303) << 4);
  const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32(int(sc_lo), int(sc_hi), 0, 0)));
  const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32(int(m_lo), int(m_hi), 0, 0)));
  _mm256_store_ps(s->scale, _mm256_mul_ps(sc, _mm256_set1_ps(half_at(block))));
  _mm256_store_ps(s->min, _mm256_mul_ps(m, _mm256_set1_ps(half_at(block + 2))));
}

// Quants 8k..8k+8 of sub-block J as 8 floats: the 64-weight chunk J/2 keeps sub-block J in the low (J even) or
// high (J odd) nibbles of qs[32(J/2) .. +32).
template <int J>
Q4T_TARGET inline __m256 q4_k_lanes(const uint8_t* block, int k) {
  const uint8_t* qs = block + 16 + 32 * (J / 2) + 8 * k;
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_cvtepi32_ps(J % 2 ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(0xF)));
}

// Calls f.operator()<J>() for J = 0..N-1 (sub-block indices known at compile time).
template <int N, class F>
Q4T_TARGET inline void for_sub_blocks(F&& f) {
  [&]<int... J>(std::integer_sequence<int, J...>) Q4T_TARGET { (f.template operator()<J>(), ...); }(
      std::make_integer_sequence<int, N>());
}

// y[0..R) = R consecutive Q4_K rows · x. Per 32-weight sub-block, Σ x·(d·sc·q − dmin·m) = d·sc·Σ x·q − dmin·m·Σ x:
// the lanes of Σ x·q per row and of Σ x (shared by the rows) are scaled into one accumulator per row. A chunk
// of 32 bytes holds two sub-blocks (low and high nibbles), so each byte is widened once for both.
template <int R>
Q4T_TARGET void q4_k_dot_group(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t nb) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi32(0xF);
  for (int64_t b = 0; b < nb; b++) {
    const float* xb = x + b * kQK_KBlockElems;
    Q4_KScales s[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) q4_k_scales(&s[r], w + r * row_bytes + b * kQ4_KBlockBytes);
    for (int c = 0; c < 4; c++) {
      const float* xl = xb + 64 * c;  // sub-block 2c; xl + 32: sub-block 2c + 1
      __m256 lo[R], hi[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
      for (int k = 0; k < 4; k++) {
        const __m256 x0 = _mm256_loadu_ps(xl + 8 * k), x1 = _mm256_loadu_ps(xl + 32 + 8 * k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
          const uint8_t* qs = w + r * row_bytes + b * kQ4_KBlockBytes + 16 + 32 * c + 8 * k;
          const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
          lo[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, low4)), x0, lo[r]);
          hi[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), x1, hi[r]);
        }
      }
      const __m256 sx0 = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xl), _mm256_loadu_ps(xl + 8)),
                                        _mm256_add_ps(_mm256_loadu_ps(xl + 16), _mm256_loadu_ps(xl + 24)));
      const __m256 sx1 = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xl + 32), _mm256_loadu_ps(xl + 40)),
                                        _mm256_add_ps(_mm256_loadu_ps(xl + 48), _mm256_loadu_ps(xl + 56)));
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        acc[r] = _mm256_fmadd_ps(lo[r], _mm256_set1_ps(s[r].scale[2 * c]), acc[r]);
        acc[r] = _mm256_fmadd_ps(hi[r], _mm256_set1_ps(s[r].scale[2 * c + 1]), acc[r]);
        acc[r] = _mm256_fnmadd_ps(sx0, _mm256_set1_ps(s[r].min[2 * c]), acc[r]);
        acc[r] = _mm256_fnmadd_ps(sx1, _mm256_set1_ps(s[r].min[2 * c + 1]), acc[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) y[r] = hsum(acc[r]);
}

Q4T_TARGET void q4_k_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows,
                              int64_t n) {
  for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
    q4_k_dot_group<R>(y + r, w + r * row_bytes, row_bytes, x, n / kQK_KBlockElems);
  });
}

// dx[nb*256] += Σ over R rows of s[r]·W[r, :]: per sub-block, q times s[r]·d·sc for each row, then the rows'
// Σ s[r]·dmin·m subtracted once.
template <int R>
Q4T_TARGET void q4_k_axpy_group(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t nb) {
  for (int64_t b = 0; b < nb; b++) {
    Q4_KScales c[R];
    __m256 e = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      q4_k_scales(&c[r], w + r * row_bytes + b * kQ4_KBlockBytes);
      const __m256 sr = _mm256_set1_ps(s[r]);
      _mm256_store_ps(c[r].scale, _mm256_mul_ps(_mm256_load_ps(c[r].scale), sr));
      e = _mm256_fmadd_ps(_mm256_load_ps(c[r].min), sr, e);
    }
    alignas(32) float e_sub[8];
    _mm256_store_ps(e_sub, e);
    for_sub_blocks<8>([&]<int J>() Q4T_TARGET {
      float* xs = dx + b * kQK_KBlockElems + 32 * J;
#pragma GCC unroll 4
      for (int k = 0; k < 4; k++) {
        __m256 a = _mm256_loadu_ps(xs + 8 * k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
          a = _mm256_fmadd_ps(q4_k_lanes<J>(w + r * row_bytes + b * kQ4_KBlockBytes, k),
                              _mm256_set1_ps(c[r].scale[J]), a);
        _mm256_storeu_ps(xs + 8 * k, _mm256_sub_ps(a, _mm256_set1_ps(e_sub[J])));
      }
    });
  }
}

Q4T_TARGET void q4_k_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows,
                               int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += kAxpyChunk) {
    const int64_t nb = std::min(kAxpyChunk, n - c0) / kQK_KBlockElems;
    const uint8_t* wc = w + c0 / kQK_KBlockElems * kQ4_KBlockBytes;
    for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
      q4_k_axpy_group<R>(dx + c0, wc + r * row_bytes, row_bytes, s + r, nb);
    });
  }
}

// (d·sc)·q − dmin·m with one rounding, as GGML's float expression: d·sc·q is exact, so the fused form rounds the
// same difference.
Q4T_TARGET void q4_k_decode(float* y, const uint8_t* w, int64_t n) {
  for (int64_t b = 0; b < n / kQK_KBlockElems; b++, w += kQ4_KBlockBytes, y += kQK_KBlockElems) {
    Q4_KScales s;
    q4_k_scales(&s, w);
    for_sub_blocks<8>([&]<int J>() Q4T_TARGET {
      const __m256 sc = _mm256_set1_ps(s.scale[J]), m = _mm256_set1_ps(s.min[J]);
#pragma GCC unroll 4
      for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 32 * J + 8 * k, _mm256_fmsub_ps(q4_k_lanes<J>(w, k), sc, m));
    });
  }
}

// --- Q6_K: 210-byte blocks { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d } ------------------------------------

// A block's 256 quants q − 32 as int8 (read by q8_lanes) in weight order, and its 16 scales d·scale as floats
// (exact).
struct Q6_KUnpacked {
  alignas(32) uint8_t q[256];
  alignas(32) float scale[16];
};

// Per 128-weight half, 32 lanes l at a time: weights l, l+32, l+64, l+96 take the low and high nibbles of ql[l]
// and ql[l+32] and bit pairs 0-1, 2-3, 4-5, 6-7 of qh[l] (16-bit shifts: the bits they carry across bytes are
// masked off).
Q4T_TARGET inline void q6_k_unpack(Q6_KUnpacked* u, const uint8_t* block) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
  for (int h = 0; h < 2; h++) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h));
    const __m256i q[4] = {
        _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45)),
        _mm256_or_si256(_mm256_and_si256(b, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(hb, bits45)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4),
                        _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45))};
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
      _mm256_store_si256(reinterpret_cast<__m256i*>(u->q + 128 * h + 32 * i), _mm256_sub_epi8(q[i], k32));
  }
  const __m256 d = _mm256_set1_ps(half_at(block + 208));
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192));
  _mm256_store_ps(u->scale, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
  _mm256_store_ps(u->scale + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d));
}

// y[0..R) = R consecutive Q6_K rows · x: per 16-weight sub-block, Σ x·(q − 32) times d·scale.
template <int R>
Q4T_TARGET void q6_k_dot_group(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t nb) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const float* xb = x + b * kQK_KBlockElems;
    Q6_KUnpacked u[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) q6_k_unpack(&u[r], w + r * row_bytes + b * kQ6_KBlockBytes);
    for (int j = 0; j < 16; j++) {
      const __m256 x0 = _mm256_loadu_ps(xb + 16 * j), x1 = _mm256_loadu_ps(xb + 16 * j + 8);
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const __m256 p =
            _mm256_fmadd_ps(q8_lanes(u[r].q + 16 * j + 8), x1, _mm256_mul_ps(q8_lanes(u[r].q + 16 * j), x0));
        acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(u[r].scale[j]), acc[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) y[r] = hsum(acc[r]);
}

Q4T_TARGET void q6_k_dot_rows(float* y, const uint8_t* w, int64_t row_bytes, const float* x, int64_t n_rows,
                              int64_t n) {
  for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
    q6_k_dot_group<R>(y + r, w + r * row_bytes, row_bytes, x, n / kQK_KBlockElems);
  });
}

template <int R>
Q4T_TARGET void q6_k_axpy_group(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t nb) {
  for (int64_t b = 0; b < nb; b++) {
    Q6_KUnpacked u[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) q6_k_unpack(&u[r], w + r * row_bytes + b * kQ6_KBlockBytes);
    float* xb = dx + b * kQK_KBlockElems;
    for (int j = 0; j < 16; j++) {
      __m256 a0 = _mm256_loadu_ps(xb + 16 * j), a1 = _mm256_loadu_ps(xb + 16 * j + 8);
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const __m256 c = _mm256_set1_ps(s[r] * u[r].scale[j]);
        a0 = _mm256_fmadd_ps(q8_lanes(u[r].q + 16 * j), c, a0);
        a1 = _mm256_fmadd_ps(q8_lanes(u[r].q + 16 * j + 8), c, a1);
      }
      _mm256_storeu_ps(xb + 16 * j, a0);
      _mm256_storeu_ps(xb + 16 * j + 8, a1);
    }
  }
}

Q4T_TARGET void q6_k_axpy_rows(float* dx, const uint8_t* w, int64_t row_bytes, const float* s, int64_t n_rows,
                               int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += kAxpyChunk) {
    const int64_t nb = std::min(kAxpyChunk, n - c0) / kQK_KBlockElems;
    const uint8_t* wc = w + c0 / kQK_KBlockElems * kQ6_KBlockBytes;
    for_row_groups(n_rows, [&]<int R>(int64_t r) Q4T_TARGET {
      q6_k_axpy_group<R>(dx + c0, wc + r * row_bytes, row_bytes, s + r, nb);
    });
  }
}

// (d·scale)·(q − 32): exact, as GGML's float expression.
Q4T_TARGET void q6_k_decode(float* y, const uint8_t* w, int64_t n) {
  for (int64_t b = 0; b < n / kQK_KBlockElems; b++, w += kQ6_KBlockBytes, y += kQK_KBlockElems) {
    Q6_KUnpacked u;
    q6_k_unpack(&u, w);
    for (int j = 0; j < 16; j++) {
      const __m256 sc = _mm256_set1_ps(u.scale[j]);
      _mm256_storeu_ps(y + 16 * j, _mm256_mul_ps(q8_lanes(u.q + 16 * j), sc));
      _mm256_storeu_ps(y + 16 * j + 8, _mm256_mul_ps(q8_lanes(u.q + 16 * j + 8), sc));
    }
  }
}


// The vector layer of frozen_rows_skeleton.h on AVX2: 8 floats in a ymm register, 32 bytes in another.
struct Avx2 {
  using F = __m256;
  using B = __m256i;

  Q4T_TARGET static F zero() { return _mm256_setzero_ps(); }
  Q4T_TARGET static F load(const float* p) { return _mm256_loadu_ps(p); }
  Q4T_TARGET static void store(float* p, F a) { _mm256_storeu_ps(p, a); }
  Q4T_TARGET static F set1(float s) { return _mm256_set1_ps(s); }
  Q4T_TARGET static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  Q4T_TARGET static F add(F a, F b) { return _mm256_add_ps(a, b); }
  Q4T_TARGET static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  Q4T_TARGET static float fma1(float a, float b, float c) { return std::fma(a, b, c); }
  Q4T_TARGET static float hsum(F a) { return detail::hsum(a); }
  Q4T_TARGET static float half(const uint8_t* p) { return half_at(p); }
  static float bf16_one(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    const uint32_t b = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  }
  Q4T_TARGET static F levels(const int8_t* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  }
  Q4T_TARGET static F f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  Q4T_TARGET static F bf16(const uint8_t* p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }

  Q4T_TARGET static B load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  Q4T_TARGET static B load16(const uint8_t* p) {
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  Q4T_TARGET static B from_u32(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return _mm256_zextsi128_si256(_mm_setr_epi32(int(a), int(b), int(c), int(d)));
  }
  Q4T_TARGET static void store32(int8_t* p, B a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), a); }
  Q4T_TARGET static B nibbles(const uint8_t* p) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(15));
  }
  Q4T_TARGET static B and8(B a, uint8_t m) { return _mm256_and_si256(a, _mm256_set1_epi8(char(m))); }
  Q4T_TARGET static B sub8(B a, uint8_t m) { return _mm256_sub_epi8(a, _mm256_set1_epi8(char(m))); }
  Q4T_TARGET static B or_(B a, B b) { return _mm256_or_si256(a, b); }
  // 16-bit shifts: the bits they carry across bytes are what the callers' masks drop.
  Q4T_TARGET static B shr(B a, int n) { return _mm256_srli_epi16(a, n); }
  Q4T_TARGET static B shl(B a, int n) { return _mm256_slli_epi16(a, n); }
  Q4T_TARGET static B lookup16(B a, const int8_t* table) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table))),
                               a);
  }
  // GGML's bytes_from_bits_32: byte i takes the word's byte i / 8, keeps bit i % 8 and compares.
  Q4T_TARGET static B bits(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(int(x)), shuf);
    const __m256i m = _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE);
    return _mm256_cmpeq_epi8(_mm256_or_si256(b, m), _mm256_set1_epi64x(-1));
  }
  template <int I>
  Q4T_TARGET static F to_f(B a) {
    const __m128i h = I < 2 ? _mm256_castsi256_si128(a) : _mm256_extracti128_si256(a, 1);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(I % 2 ? _mm_srli_si128(h, 8) : h));
  }
};

}  // namespace

const FrozenRowKernels kQ4_KAvx2 = {"avx2", kQK_KBlockElems, kQ4_KBlockBytes,
                                    q4_k_dot_rows, q4_k_axpy_rows, q4_k_decode};
const FrozenRowKernels kQ6_KAvx2 = {"avx2", kQK_KBlockElems, kQ6_KBlockBytes,
                                    q6_k_dot_rows, q6_k_axpy_rows, q6_k_decode};
const FrozenRowKernels kQ8_0Avx2 = {"avx2", kQ8_0BlockElems, kQ8_0BlockBytes,
                                    q8_0_dot_rows, q8_0_axpy_rows, q8_0_decode};
const FrozenRowKernels kF16Avx2 = {"avx2", 1, 2, f16_dot_rows, f16_axpy_rows, f16_decode};

namespace {
template <class D>
constexpr FrozenRowKernels kAvx2 = rows::kernels<Avx2, D>("avx2");
}  // namespace

// TEMP: the hand-written loops, for comparison.
const FrozenRowKernels* avx2_legacy_row_kernels(Format f) {
  switch (f) {
    case Format::Q4_K: return &kQ4_KAvx2;
    case Format::Q6_K: return &kQ6_KAvx2;
    case Format::Q8_0: return &kQ8_0Avx2;
    case Format::F16: return &kF16Avx2;
    default: return nullptr;
  }
}

const FrozenRowKernels* avx2_row_kernels(Format f) {
  switch (f) {
    case Format::F16: return &kAvx2<rows::F16>;
    case Format::BF16: return &kAvx2<rows::BF16>;
    case Format::Q8_0: return &kAvx2<rows::Q8_0>;
    case Format::Q4_1: return &kAvx2<rows::Q4_1>;
    case Format::Q5_0: return &kAvx2<rows::Q5_0>;
    case Format::Q5_1: return &kAvx2<rows::Q5_1>;
    case Format::IQ4_NL: return &kAvx2<rows::IQ4_NL>;
    case Format::Q2_K: return &kAvx2<rows::Q2_K>;
    case Format::Q3_K: return &kAvx2<rows::Q3_K>;
    case Format::Q4_K: return &kAvx2<rows::Q4_K>;
    case Format::Q5_K: return &kAvx2<rows::Q5_K>;
    case Format::Q6_K: return &kAvx2<rows::Q6_K>;
    case Format::IQ4_XS: return &kAvx2<rows::IQ4_XS>;
    default: return nullptr;
  }
}

}  // namespace q4t::cpu::detail
#endif
