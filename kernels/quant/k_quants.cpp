#include "kernels/quant/k_quants.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/quant/f16.h"
#include "kernels/quant/quant_util.h"

namespace q4t::quant {

namespace {

using detail::kGroupMaxEps;
using detail::nearest;

constexpr int kQK = int(kQK_KBlockElems);

void check_row(const char* fn, int64_t n) { detail::check_row(fn, n, kQK, "k-quant super-block size"); }

// The error fit_scale_min minimises, Σ cost(w[i], diff[i]), and the float order it is evaluated in.
enum class FitCost {
  kSquared,        // w·(diff·diff): GGML's make_qkx2_quants (Q5_K)
  kAbsolute,       // w·|diff|: GGML's make_qkx2_quants with use_mad (Q2_K)
};

// Fits x[i] ≈ scale·L[i] + min with L in [0, nmax] and min ≤ 0, minimising Σ w[i]·(scale·L[i] + min − x[i])²
// (or Σ w[i]·|scale·L[i] + min − x[i]|, Q2_K's fit): start from the full range, then try nstep + 1 slightly
// different step sizes, each followed by the weighted least-squares scale and min of its levels. Returns the
// scale; *neg_min receives −min (≥ 0). n is at most 32.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep, FitCost fit_cost) {
  auto cost = [fit_cost](float w, float diff) {
    switch (fit_cost) {
      case FitCost::kAbsolute:
        return w * std::fabs(diff);
      case FitCost::kSquared:
        break;
    }
    return w * (diff * diff);
  };
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; i++) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::fill(L, L + n, uint8_t(0));
    *neg_min = -lo;
    return 0.0f;
  }
  float iscale = float(nmax) / (hi - lo), scale = 1.0f / iscale, best_error = 0.0f;
  for (int i = 0; i < n; i++) {
    L[i] = uint8_t(std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * float(L[i]) + lo - x[i];
    best_error += cost(w[i], diff);
  }
  uint8_t trial[32];
  for (int step = 0; step <= nstep; step++) {
    iscale = (rmin + rdelta * float(step) + float(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
      const int l = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; i++) {
      const float diff = this_scale * float(trial[i]) + this_min - x[i];
      error += cost(w[i], diff);
    }
    if (error < best_error) {
      std::copy(trial, trial + n, L);
      best_error = error;
      scale = this_scale;
      lo = this_min;
    }
  }
  *neg_min = -lo;
  return scale;
}

// Fits x[i] ≈ scale·(L[i] − nmax) with L[i] − nmax in [−nmax, nmax − 1], weights x[i]²: the value of largest
// magnitude maps to −nmax, then 18 nearby step sizes are tried and the one with the best weighted
// least-squares fit kept. Returns the (signed) scale.
float fit_signed_scale(int n, int nmax, const float* x, uint8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; i++) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, uint8_t(0));
    return 0.0f;
  }
  auto fit = [&](float iscale, bool store, float* sum_lx, float* sum_l2) {
    *sum_lx = 0;
    *sum_l2 = 0;
    for (int i = 0; i < n; i++) {
      const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
      if (store) L[i] = uint8_t(l + nmax);
      const float w = x[i] * x[i];
      *sum_lx += w * x[i] * float(l);
      *sum_l2 += w * float(l) * float(l);
    }
  };
  float sum_lx, sum_l2;
  fit(-float(nmax) / max, true, &sum_lx, &sum_l2);
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int step = -9; step <= 9; step++) {
    if (step == 0) continue;
    const float iscale = -(float(nmax) + 0.1f * float(step)) / max;
    fit(iscale, false, &sum_lx, &sum_l2);
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      fit(iscale, true, &sum_lx, &sum_l2);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

// GGML's make_q3_quants for Q3_K: x[i] ≈ scale·(L[i] − nmax) with L[i] − nmax in [−nmax, nmax − 1], weights x[i]²:
// the value of largest magnitude maps to −nmax, then up to 5 passes move single levels to the one that maximises
// (Σ w·x·l)² / Σ w·l² while that improves. Returns the (signed) scale; an all-but-zero group (largest magnitude
// below GROUP_MAX_EPS) has scale 0 and levels 0. n is at most 16.
float fit_q3_scale(int n, int nmax, const float* x, uint8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; i++) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, uint8_t(0));
    return 0.0f;
  }
  const float iscale = -float(nmax) / max;
  int l[16];
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < n; i++) {
    l[i] = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * float(l[i]);
    sum_l2 += w * float(l[i]) * float(l[i]);
  }
  for (int pass = 0; pass < 5; pass++) {
    int changed = 0;
    for (int i = 0; i < n; i++) {
      // The sums without weight i, then with weight i at the level that fits their scale best.
      const float w = x[i] * x[i];
      float slx = sum_lx - w * x[i] * float(l[i]);
      if (!(slx > 0)) continue;
      float sl2 = sum_l2 - w * float(l[i]) * float(l[i]);
      const int moved = std::clamp(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (moved == l[i]) continue;
      slx += w * x[i] * float(moved);
      sl2 += w * float(moved) * float(moved);
      if (sl2 > 0 && slx * slx * sum_l2 > sum_lx * sum_lx * sl2) {
        l[i] = moved;
        sum_lx = slx;
        sum_l2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; i++) L[i] = uint8_t(l[i] + nmax);
  return sum_l2 > 0 ? sum_lx / sum_l2 : 0.0f;
}

// The sub-block scales and mins of Q4_K and Q5_K (GGML's reference): per 32 weights a fit_scale_min with weights
// rms(x) + |x| (levels 0..nmax, nstep + 1 step sizes from rmin in 0.1 steps), then 6-bit scales and mins against the
// largest of each, packed into scales (k4_scale_min), the f16 d and dmin, and every level requantised against
// the stored values (a sub-block whose scale is 0 keeps its fit's levels). L receives the 256 levels.
void fit_k4_scales(const float* xb, int nmax, float rmin, int nstep, FitCost cost, uint8_t* L, uint8_t* packed,
                   uint16_t* d_out, uint16_t* dmin_out) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; j++) {
    const float* xs = xb + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; l++) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, 0.1f, nstep, cost);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(packed, 0, 12);
  for (int j = 0; j < 8; j++) {
    // Narrowed to 8 bits before the clamp, as GGML does (only a negative level would notice).
    const uint8_t ls = std::min<uint8_t>(63, uint8_t(nearest(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, uint8_t(nearest(inv_min * mins[j])));
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] |= uint8_t((ls >> 4) << 6);
      packed[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  *d_out = f32_to_f16(max_scale / 63.0f);
  *dmin_out = f32_to_f16(max_min / 63.0f);
  // Requantise against the stored (rounded) scales and mins.
  for (int j = 0; j < 8; j++) {
    uint8_t sc, m;
    k4_scale_min(packed, j, &sc, &m);
    const float d = f16_to_f32(*d_out) * float(sc);
    if (d == 0.0f) continue;
    const float dm = f16_to_f32(*dmin_out) * float(m);
    for (int l = 0; l < 32; l++) L[32 * j + l] = uint8_t(std::clamp(nearest((xb[32 * j + l] + dm) / d), 0, nmax));
  }
}

// 256 2-bit levels into 64 bytes (Q2_K's and Q3_K's qs): level 128h + 32j + l goes to bits 2j..2j+1 of
// qs[32h + l].
void pack_2bit(uint8_t* qs, const uint8_t* L) {
  for (int h = 0; h < 2; h++) {
    const uint8_t* Lh = L + 128 * h;
    for (int l = 0; l < 32; l++)
      qs[32 * h + l] = uint8_t(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
  }
}

// The 2-bit level of weight i (0..255) of a Q2_K or Q3_K block.
inline int level_2bit(const uint8_t* qs, int i) { return (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3; }

template <typename T>
void dequantize_q2_k(T* y, const BlockQ2_K* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const BlockQ2_K& blk = x[b];
    const T d = T(f16_to_f32(blk.d)), dmin = T(f16_to_f32(blk.dmin));
    T* out = y + b * kQK;
    for (int s = 0; s < 16; s++) {
      const T dl = d * T(blk.scales[s] & 0xF), ml = dmin * T(blk.scales[s] >> 4);
      for (int i = 16 * s; i < 16 * s + 16; i++) out[i] = dl * T(level_2bit(blk.qs, i)) - ml;
    }
  }
}

template <typename T>
void dequantize_q3_k(T* y, const BlockQ3_K* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const BlockQ3_K& blk = x[b];
    const T d = T(f16_to_f32(blk.d));
    T* out = y + b * kQK;
    for (int s = 0; s < 16; s++) {
      const T dl = d * T(k3_scale(blk.scales, s));
      for (int i = 16 * s; i < 16 * s + 16; i++) {
        const bool high = (blk.hmask[i % 32] >> (i / 32)) & 1;
        out[i] = dl * T(level_2bit(blk.qs, i) - (high ? 0 : 4));
      }
    }
  }
}

template <typename T>
void dequantize_q5_k(T* y, const BlockQ5_K* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const BlockQ5_K& blk = x[b];
    const T d = T(f16_to_f32(blk.d)), dmin = T(f16_to_f32(blk.dmin));
    T* out = y + b * kQK;
    for (int j = 0; j < 8; j++) {
      uint8_t sc, m;
      k4_scale_min(blk.scales, j, &sc, &m);
      const T d1 = d * T(sc), m1 = dmin * T(m);
      const uint8_t* q = blk.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; l++) {
        const int level = ((q[l] >> shift) & 0xF) + (((blk.qh[l] >> j) & 1) ? 16 : 0);
        out[32 * j + l] = d1 * T(level) - m1;
      }
    }
  }
}

template <typename T>
void dequantize_q4_k(T* y, const BlockQ4_K* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const BlockQ4_K& blk = x[b];
    const T d = T(f16_to_f32(blk.d)), dmin = T(f16_to_f32(blk.dmin));
    T* out = y + b * kQK;
    for (int j = 0; j < 8; j++) {
      uint8_t sc, m;
      k4_scale_min(blk.scales, j, &sc, &m);
      const T d1 = d * T(sc), m1 = dmin * T(m);
      const uint8_t* q = blk.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; l++) out[32 * j + l] = d1 * T((q[l] >> shift) & 0xF) - m1;
    }
  }
}

template <typename T>
void dequantize_q6_k(T* y, const BlockQ6_K* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const BlockQ6_K& blk = x[b];
    const T d = T(f16_to_f32(blk.d));
    for (int h = 0; h < 2; h++) {
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      const int8_t* sc = blk.scales + 8 * h;
      T* out = y + b * kQK + 128 * h;
      for (int l = 0; l < 32; l++) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[l] = d * T(sc[is + 0]) * T(q1);
        out[l + 32] = d * T(sc[is + 2]) * T(q2);
        out[l + 64] = d * T(sc[is + 4]) * T(q3);
        out[l + 96] = d * T(sc[is + 6]) * T(q4);
      }
    }
  }
}

}  // namespace

void quantize_row_q2_k(BlockQ2_K* out, const float* x, int64_t n) {
  check_row("quantize_row_q2_k", n);
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    BlockQ2_K& blk = out[b];
    float scales[16], mins[16], weights[16];
    uint8_t L[256];
    float max_scale = 0, max_min = 0;
    for (int s = 0; s < 16; s++) {
      const float* xs = xb + 16 * s;
      for (int l = 0; l < 16; l++) weights[l] = std::fabs(xs[l]);
      scales[s] = fit_scale_min(16, 3, xs, weights, L + 16 * s, &mins[s], -0.5f, 0.1f, 15, FitCost::kAbsolute);
      max_scale = std::max(max_scale, scales[s]);
      max_min = std::max(max_min, mins[s]);
    }
    // 4-bit scales and mins against the largest of each; narrowed to 8 bits as GGML stores them.
    if (max_scale > 0) {
      const float inv_scale = 15.0f / max_scale;
      for (int s = 0; s < 16; s++) blk.scales[s] = uint8_t(nearest(inv_scale * scales[s]));
      blk.d = f32_to_f16(max_scale / 15.0f);
    } else {
      std::memset(blk.scales, 0, sizeof blk.scales);
      blk.d = f32_to_f16(0.0f);
    }
    if (max_min > 0) {
      const float inv_min = 15.0f / max_min;
      for (int s = 0; s < 16; s++) blk.scales[s] = uint8_t(blk.scales[s] | (nearest(inv_min * mins[s]) << 4));
      blk.dmin = f32_to_f16(max_min / 15.0f);
    } else {
      blk.dmin = f32_to_f16(0.0f);
    }
    // Requantise against the stored (rounded) scales and mins; a sub-block whose scale is 0 keeps its fit's levels.
    for (int s = 0; s < 16; s++) {
      const float d = f16_to_f32(blk.d) * float(blk.scales[s] & 0xF);
      if (d == 0.0f) continue;
      const float dm = f16_to_f32(blk.dmin) * float(blk.scales[s] >> 4);
      for (int i = 0; i < 16; i++) L[16 * s + i] = uint8_t(std::clamp(nearest((xb[16 * s + i] + dm) / d), 0, 3));
    }
    pack_2bit(blk.qs, L);
  }
}

void quantize_row_q3_k(BlockQ3_K* out, const float* x, int64_t n) {
  check_row("quantize_row_q3_k", n);
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    BlockQ3_K& blk = out[b];
    float scales[16];
    uint8_t L[256];
    float max_scale = 0, amax = 0;  // the sub-block scale of largest magnitude, signed
    for (int s = 0; s < 16; s++) {
      scales[s] = fit_q3_scale(16, 4, xb + 16 * s, L + 16 * s);
      if (std::fabs(scales[s]) > amax) {
        amax = std::fabs(scales[s]);
        max_scale = scales[s];
      }
    }
    std::memset(blk.scales, 0, sizeof blk.scales);
    if (max_scale != 0.0f) {
      // The largest scale maps to −32; each 6-bit scale is stored as sc + 32 (k3_scale).
      const float iscale = -32.0f / max_scale;
      for (int s = 0; s < 16; s++) {
        // Narrowed to 8 bits before the clamp, as GGML does.
        const int ls = std::clamp(int(int8_t(nearest(iscale * scales[s]))), -32, 31) + 32;
        if (s < 8)
          blk.scales[s] = uint8_t(ls & 0xF);
        else
          blk.scales[s - 8] |= uint8_t((ls & 0xF) << 4);
        blk.scales[8 + s % 4] |= uint8_t((ls >> 4) << (2 * (s / 4)));
      }
      blk.d = f32_to_f16(1.0f / iscale);
    } else {
      blk.d = f32_to_f16(0.0f);
    }
    // Requantise against the stored (rounded) scales; a sub-block whose scale is 0 keeps its fit's levels.
    for (int s = 0; s < 16; s++) {
      const float d = f16_to_f32(blk.d) * float(k3_scale(blk.scales, s));
      if (d == 0.0f) continue;
      for (int i = 0; i < 16; i++) L[16 * s + i] = uint8_t(std::clamp(nearest(xb[16 * s + i] / d), -4, 3) + 4);
    }
    // The high bit of level i goes to bit i/32 of hmask[i % 32], the low 2 bits to qs as Q2_K's.
    std::memset(blk.hmask, 0, sizeof blk.hmask);
    for (int i = 0; i < kQK; i++) {
      if (L[i] > 3) {
        blk.hmask[i % 32] |= uint8_t(1 << (i / 32));
        L[i] -= 4;
      }
    }
    pack_2bit(blk.qs, L);
  }
}

void quantize_row_q4_k(BlockQ4_K* out, const float* x, int64_t n) {
  check_row("quantize_row_q4_k", n);
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    BlockQ4_K& blk = out[b];
    uint8_t L[256];
    fit_k4_scales(xb, 15, -1.0f, 20, FitCost::kSquared, L, blk.scales, &blk.d, &blk.dmin);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++) blk.qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_row_q5_k(BlockQ5_K* out, const float* x, int64_t n) {
  check_row("quantize_row_q5_k", n);
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    BlockQ5_K& blk = out[b];
    uint8_t L[256];
    fit_k4_scales(xb, 31, -0.5f, 15, FitCost::kSquared, L, blk.scales, &blk.d, &blk.dmin);
    // Chunk c's sub-blocks 2c and 2c+1: low 4 bits as Q4_K's nibbles, fifth bits to bits 2c and 2c+1 of qh.
    std::memset(blk.qh, 0, sizeof blk.qh);
    for (int c = 0; c < 4; c++) {
      for (int l = 0; l < 32; l++) {
        const uint8_t lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        blk.qs[32 * c + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
        blk.qh[l] |= uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_row_q6_k(BlockQ6_K* out, const float* x, int64_t n) {
  check_row("quantize_row_q6_k", n);
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    BlockQ6_K& blk = out[b];
    float scales[16];
    uint8_t L[256];
    float max_scale = 0, max_abs_scale = 0;
    for (int s = 0; s < 16; s++) {
      scales[s] = fit_signed_scale(16, 32, xb + 16 * s, L + 16 * s);
      if (std::fabs(scales[s]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[s]);
        max_scale = scales[s];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&blk, 0, sizeof blk);
      continue;
    }
    const float iscale = -128.0f / max_scale;
    blk.d = f32_to_f16(1.0f / iscale);
    for (int s = 0; s < 16; s++) blk.scales[s] = int8_t(std::min(127, nearest(iscale * scales[s])));
    // Requantise against the stored (rounded) scales.
    for (int s = 0; s < 16; s++) {
      const float d = f16_to_f32(blk.d) * float(blk.scales[s]);
      if (d == 0.0f) continue;
      for (int i = 0; i < 16; i++) L[16 * s + i] = uint8_t(std::clamp(nearest(xb[16 * s + i] / d), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++) {
      const uint8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; l++) {
        blk.ql[64 * h + l] = uint8_t((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        blk.ql[64 * h + l + 32] = uint8_t((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        blk.qh[32 * h + l] =
            uint8_t((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

void dequantize_row_q2_k(float* y, const BlockQ2_K* x, int64_t n) {
  check_row("dequantize_row_q2_k", n);
  dequantize_q2_k(y, x, n);
}
void dequantize_row_q2_k(double* y, const BlockQ2_K* x, int64_t n) {
  check_row("dequantize_row_q2_k", n);
  dequantize_q2_k(y, x, n);
}
void dequantize_row_q3_k(float* y, const BlockQ3_K* x, int64_t n) {
  check_row("dequantize_row_q3_k", n);
  dequantize_q3_k(y, x, n);
}
void dequantize_row_q3_k(double* y, const BlockQ3_K* x, int64_t n) {
  check_row("dequantize_row_q3_k", n);
  dequantize_q3_k(y, x, n);
}
void dequantize_row_q5_k(float* y, const BlockQ5_K* x, int64_t n) {
  check_row("dequantize_row_q5_k", n);
  dequantize_q5_k(y, x, n);
}
void dequantize_row_q5_k(double* y, const BlockQ5_K* x, int64_t n) {
  check_row("dequantize_row_q5_k", n);
  dequantize_q5_k(y, x, n);
}
void dequantize_row_q4_k(float* y, const BlockQ4_K* x, int64_t n) {
  check_row("dequantize_row_q4_k", n);
  dequantize_q4_k(y, x, n);
}
void dequantize_row_q4_k(double* y, const BlockQ4_K* x, int64_t n) {
  check_row("dequantize_row_q4_k", n);
  dequantize_q4_k(y, x, n);
}
void dequantize_row_q6_k(float* y, const BlockQ6_K* x, int64_t n) {
  check_row("dequantize_row_q6_k", n);
  dequantize_q6_k(y, x, n);
}
void dequantize_row_q6_k(double* y, const BlockQ6_K* x, int64_t n) {
  check_row("dequantize_row_q6_k", n);
  dequantize_q6_k(y, x, n);
}


namespace {
constexpr size_t kQ6_KBody = offsetof(BlockQ6_K, d);  // 208 bytes before d
constexpr size_t kQ6_KGroupBytes = size_t(kQ6_KGroupBlocks) * kQ6_KBlockBytes;
constexpr size_t kQ6_KGroupD = size_t(kQ6_KGroupBlocks) * kQ6_KBody;  // the d's after the group's bodies
static_assert(kQ6_KBody == 208 && sizeof(BlockQ6_K::d) == 2);

// Where block i's body and d lie in the grouped layout.
size_t q6_k_body_at(size_t i) { return i / kQ6_KGroupBlocks * kQ6_KGroupBytes + i % kQ6_KGroupBlocks * kQ6_KBody; }
size_t q6_k_d_at(size_t i) { return i / kQ6_KGroupBlocks * kQ6_KGroupBytes + kQ6_KGroupD + 2 * (i % kQ6_KGroupBlocks); }
}  // namespace

std::vector<uint8_t> q6_k_to_device(std::span<const uint8_t> blocks) {
  if (blocks.size() % kQ6_KBlockBytes != 0)
    throw ShapeError("q6_k_to_device: " + std::to_string(blocks.size()) + " bytes are not whole 210-byte Q6_K blocks");
  const size_t n = blocks.size() / kQ6_KBlockBytes;
  std::vector<uint8_t> out(size_t(q6_k_device_bytes(int64_t(n), kQK_KBlockElems)), 0);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* src = blocks.data() + i * kQ6_KBlockBytes;
    std::memcpy(out.data() + q6_k_body_at(i), src, kQ6_KBody);
    std::memcpy(out.data() + q6_k_d_at(i), src + kQ6_KBody, 2);
  }
  return out;
}

std::vector<uint8_t> q6_k_from_device(std::span<const uint8_t> grouped, int64_t n_blocks) {
  if (n_blocks < 0 || grouped.size() < size_t(q6_k_device_bytes(n_blocks, kQK_KBlockElems)))
    throw ShapeError("q6_k_from_device: " + std::to_string(grouped.size()) + " bytes cannot hold " +
                     std::to_string(n_blocks) + " grouped Q6_K blocks");
  std::vector<uint8_t> out(size_t(n_blocks) * kQ6_KBlockBytes);
  for (size_t i = 0; i < size_t(n_blocks); ++i) {
    uint8_t* dst = out.data() + i * kQ6_KBlockBytes;
    std::memcpy(dst, grouped.data() + q6_k_body_at(i), kQ6_KBody);
    std::memcpy(dst + kQ6_KBody, grouped.data() + q6_k_d_at(i), 2);
  }
  return out;
}

}  // namespace q4t::quant
