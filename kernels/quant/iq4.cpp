#include "kernels/quant/iq4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant/f16.h"
#include "kernels/quant/quant_util.h"

namespace q4t::quant {

namespace {

constexpr int kSub = 32;                     // weights per scale (an IQ4_NL block, an IQ4_XS sub-block)
constexpr int kQK = int(kQK_KBlockElems);    // IQ4_XS super-block
constexpr int kTries = 7;                    // GGML's ntry: step sizes −7..7 around the largest level
constexpr float kLowest = kIQ4Levels[0];     // −127

// The index of the level nearest to v: the levels are ascending, so v takes level i once it reaches the midpoint
// of levels i−1 and i (a tie goes up). Comparing 2v with the sum of the two levels keeps both sides exact; a
// 4-step binary search finds the last midpoint reached. NaN takes level 0, as GGML's best_index_int8.
int nearest_level(float v) {
  const float twice = v + v;
  int idx = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int j = idx + step;
    if (twice >= float(kIQ4Levels[size_t(j - 1)] + kIQ4Levels[size_t(j)])) idx = j;
  }
  return idx;
}

// GGML's scale search for 32 weights (no importance matrix: weights x²). The value of largest magnitude maps to
// the lowest level (−127), then the step sizes (−127 + t)/max, t in [−7, 7], are tried; each gives levels and
// their weighted least-squares scale Σw·q·x / Σw·q², and the scale with the largest Σw·q·x · scale is kept. A
// block whose largest magnitude is below GROUP_MAX_EPS has scale 0.
float fit_scale(const float* x) {
  float weight[kSub];
  for (int j = 0; j < kSub; j++) weight[j] = x[j] * x[j];
  float amax = 0, max = 0;
  for (int j = 0; j < kSub; j++) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax < detail::kGroupMaxEps) return 0.0f;
  // Σ w·q·x and Σ w·q² of the levels nearest to x·inv_scale.
  auto sums = [&](float inv_scale, float* sum_qx, float* sum_q2) {
    *sum_qx = 0;
    *sum_q2 = 0;
    for (int j = 0; j < kSub; j++) {
      const float q = kIQ4Levels[size_t(nearest_level(inv_scale * x[j]))];
      *sum_qx += weight[j] * q * x[j];
      *sum_q2 += weight[j] * q * q;
    }
  };
  float sum_qx, sum_q2;
  sums(1.0f / (-max / kLowest), &sum_qx, &sum_q2);
  float scale = sum_q2 > 0 ? sum_qx / sum_q2 : 0.0f;
  float best = scale * sum_qx;
  for (int t = -kTries; t <= kTries; t++) {
    sums(float(t + kIQ4Levels[0]) / max, &sum_qx, &sum_q2);
    if (sum_q2 > 0 && sum_qx * sum_qx > best * sum_q2) {
      scale = sum_qx / sum_q2;
      best = scale * sum_qx;
    }
  }
  return scale;
}

// Level indices of 32 weights against inv_scale, packed as nibbles: weight j < 16 low, j >= 16 high.
void pack_levels(uint8_t* qs, const float* x, float inv_scale) {
  uint8_t L[kSub];
  for (int j = 0; j < kSub; j++) L[j] = uint8_t(nearest_level(inv_scale * x[j]));
  for (int j = 0; j < 16; j++) qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
}

template <typename T>
void dequantize_nl(T* y, const BlockIQ4_NL* x, int64_t n) {
  for (int64_t b = 0; b < n / kSub; b++) {
    const T d = T(f16_to_f32(x[b].d));
    T* yb = y + b * kSub;
    for (int j = 0; j < 16; j++) {
      yb[j] = d * T(kIQ4Levels[x[b].qs[j] & 0xF]);
      yb[j + 16] = d * T(kIQ4Levels[x[b].qs[j] >> 4]);
    }
  }
}

template <typename T>
void dequantize_xs(T* y, const BlockIQ4_XS* x, int64_t n) {
  for (int64_t b = 0; b < n / kQK; b++) {
    const BlockIQ4_XS& blk = x[b];
    const T d = T(f16_to_f32(blk.d));
    for (int s = 0; s < kQK / kSub; s++) {
      const T dl = d * T(iq4_xs_scale(blk, s));
      const uint8_t* qs = blk.qs + 16 * s;
      T* yb = y + b * kQK + kSub * s;
      for (int j = 0; j < 16; j++) {
        yb[j] = dl * T(kIQ4Levels[qs[j] & 0xF]);
        yb[j + 16] = dl * T(kIQ4Levels[qs[j] >> 4]);
      }
    }
  }
}

void check_nl(const char* fn, int64_t n) { detail::check_row(fn, n, kSub, "IQ4_NL block size"); }
void check_xs(const char* fn, int64_t n) { detail::check_row(fn, n, kQK, "IQ4_XS super-block size"); }

}  // namespace

void quantize_row_iq4_nl(BlockIQ4_NL* out, const float* x, int64_t n) {
  check_nl("quantize_row_iq4_nl", n);
  for (int64_t b = 0; b < n / kSub; b++) {
    const float* xb = x + b * kSub;
    const float scale = fit_scale(xb);
    out[b].d = f32_to_f16(scale);
    // The levels are chosen against the unrounded scale (a zero block takes level 8, the 1 nearest to 0).
    pack_levels(out[b].qs, xb, scale != 0.0f ? 1.0f / scale : 0.0f);
  }
}

void quantize_row_iq4_xs(BlockIQ4_XS* out, const float* x, int64_t n) {
  check_xs("quantize_row_iq4_xs", n);
  constexpr int kSubs = kQK / kSub;
  for (int64_t b = 0; b < n / kQK; b++) {
    const float* xb = x + b * kQK;
    BlockIQ4_XS& blk = out[b];
    float scales[kSubs];
    float max_scale = 0, amax_scale = 0;  // the sub-block scale of largest magnitude, signed
    for (int s = 0; s < kSubs; s++) {
      scales[s] = fit_scale(xb + kSub * s);
      if (std::fabs(scales[s]) > amax_scale) {
        amax_scale = std::fabs(scales[s]);
        max_scale = scales[s];
      }
    }
    // The largest scale maps to sub-block scale −32; an all-zero block gets d = −0.
    const float d = -max_scale / 32.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    blk.d = f32_to_f16(d);
    blk.scales_h = 0;
    std::memset(blk.scales_l, 0, sizeof blk.scales_l);
    for (int s = 0; s < kSubs; s++) {
      const int l = std::clamp(detail::nearest(id * scales[s]), -32, 31);
      // The levels are chosen against d·l with d unrounded.
      const float dl = d * float(l);
      pack_levels(blk.qs + 16 * s, xb + kSub * s, dl != 0.0f ? 1.0f / dl : 0.0f);
      const int ls = l + 32;
      blk.scales_l[s / 2] |= uint8_t((ls & 0xF) << (4 * (s % 2)));
      blk.scales_h |= uint16_t((ls >> 4) << (2 * s));
    }
  }
}

void dequantize_row_iq4_nl(float* y, const BlockIQ4_NL* x, int64_t n) {
  check_nl("dequantize_row_iq4_nl", n);
  dequantize_nl(y, x, n);
}
void dequantize_row_iq4_nl(double* y, const BlockIQ4_NL* x, int64_t n) {
  check_nl("dequantize_row_iq4_nl", n);
  dequantize_nl(y, x, n);
}
void dequantize_row_iq4_xs(float* y, const BlockIQ4_XS* x, int64_t n) {
  check_xs("dequantize_row_iq4_xs", n);
  dequantize_xs(y, x, n);
}
void dequantize_row_iq4_xs(double* y, const BlockIQ4_XS* x, int64_t n) {
  check_xs("dequantize_row_iq4_xs", n);
  dequantize_xs(y, x, n);
}

}  // namespace q4t::quant
