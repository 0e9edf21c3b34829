// The CPU Q4_0 linear's driver (the Q4_0 row of kernels/formats.h): GEMV, GEMM and the dx backward. W is never dequantised as a whole. GEMV and the
// single-token backward run fused kernels over the blocks; more tokens dequantise one small tile of W at a
// time and multiply it either with the kernel set's packed-panel GEMM (x86 SIMD sets) or with Eigen
// (portable set). Kernel sets: kernels/cpu/q4_0_rows.h.
#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/frozen_linear.h"
#include "kernels/formats.h"
#include "kernels/cpu/q4_0_rows.h"
#include "kernels/cpu/threads.h"
#include "kernels/shapes.h"

namespace q4t::cpu {

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstView = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
using View = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;
using detail::kPanelCols;
using detail::Q4_0Kernels;

constexpr int64_t kMinChunkBytes = 128 * 1024;  // weight bytes per thread chunk: less is not worth a wake-up
// Below these token counts one fused pass over W per token beats dequantising W into panels (measured at
// 4096x4096 with AVX-512; the GEMM's panels also pay a transpose and pad tokens to a 12-row tile).
constexpr int64_t kGemmPanelTokens = 12;
constexpr int64_t kDxPanelTokens = 4;
constexpr int64_t kDepth = 256;              // K per panel: a 256 x 32 panel is 32 KiB and stays in L1
constexpr int64_t kPanelGroup = 8;           // panels sharing one packing of the token rows
constexpr int64_t kTileFloats = 128 * 1024;  // Eigen path: a 512 KiB dequantised tile, in L2
constexpr int64_t kMaxTileRows = 256;        // Eigen path: GEMM output rows per tile
constexpr int64_t kDxColBlocks = 16;         // Eigen path: dx columns per tile, in blocks
constexpr int64_t kDxTileRows = 256;         // Eigen path: dx rows j per tile

// A 64-byte aligned per-thread buffer, grown on demand and kept: tiles are hundreds of KiB and a fresh
// allocation per call would fault its pages in every time.
float* tile_buffer(int64_t n) {
  thread_local std::vector<float> buf;
  if (int64_t(buf.size()) < n + 16) buf.resize(size_t(n + 16));
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

// y[n_out] = W · x, threads over row ranges (a multiple of the 4-row groups the kernels share x over).
void gemv(float* y, const uint8_t* w, const float* x, int64_t n_out, int64_t n_in) {
  const Q4_0Kernels& k = detail::q4_0_kernels();
  const int64_t row_bytes = q4t::row_bytes(Format::Q4_0, n_in);
  const int64_t grain = ceil_div(std::max<int64_t>(4, kMinChunkBytes / row_bytes), 4) * 4;
  parallel_for(n_out, grain, [&](int64_t r0, int64_t r1) {
    k.dot_rows(y + r0, w + r0 * row_bytes, row_bytes, x, r1 - r0, n_in / kQ4_0BlockElems);
  });
}

// dx[n_in] (+)= dy[j_start:j_end] · W[j_start:j_end, :], threads over column ranges of whole blocks.
void dx_one_token(float* dx, const uint8_t* w, const float* dy, int64_t n_in, int64_t j_start, int64_t j_end,
                  bool accumulate) {
  const Q4_0Kernels& k = detail::q4_0_kernels();
  const int64_t row_bytes = q4t::row_bytes(Format::Q4_0, n_in);
  const int64_t grain = std::max<int64_t>(1, kMinChunkBytes / ((j_end - j_start) * kQ4_0BlockBytes));
  parallel_for(n_in / kQ4_0BlockElems, grain, [&](int64_t b0, int64_t b1) {
    float* out = dx + b0 * kQ4_0BlockElems;
    if (!accumulate) std::memset(out, 0, size_t((b1 - b0) * kQ4_0BlockElems) * sizeof(float));
    k.axpy_rows(out, w + j_start * row_bytes + b0 * kQ4_0BlockBytes, row_bytes, dy + j_start, j_end - j_start,
                b1 - b0);
  });
}

// P[k][i] = rows[i][k] for i < n and 0 for n <= i < 32: the GEMM's B = Wᵀ, 32 output rows wide.
void transpose_into_panel(float* P, float* rows, int64_t n, int64_t kc) {
  std::memset(rows + n * kc, 0, size_t((kPanelCols - n) * kc) * sizeof(float));
  for (int64_t kk = 0; kk < kc; kk++)
    for (int64_t i = 0; i < kPanelCols; i++) P[kk * kPanelCols + i] = rows[i * kc + kk];
}

// Y[:, r0:r1] = X · W[r0:r1, :]ᵀ with packed panels: for each block of 8 panels (256 output rows) and each
// 256-deep slice of K, X's slice is packed once and each panel of W is dequantised, transposed and
// multiplied while it sits in L1.
void gemm_panels(const Q4_0Kernels& k, float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
                 int64_t n_in, int64_t r0, int64_t r1) {
  const int64_t row_bytes = q4t::row_bytes(Format::Q4_0, n_in);
  const int64_t packed = ceil_div(T, k.panel_tokens) * k.panel_tokens * kDepth;
  float* A = tile_buffer(packed + 2 * kDepth * kPanelCols);
  float* P = A + packed;
  float* rows = P + kDepth * kPanelCols;  // one panel's W rows, row-major, before the transpose
  for (int64_t jc = r0; jc < r1; jc += kPanelGroup * kPanelCols) {
    const int64_t jc_end = std::min(r1, jc + kPanelGroup * kPanelCols);
    for (int64_t k0 = 0; k0 < n_in; k0 += kDepth) {
      const int64_t kc = std::min(kDepth, n_in - k0);
      detail::pack_panel_tokens(A, X + k0, n_in, T, kc, k.panel_tokens);
      for (int64_t p0 = jc; p0 < jc_end; p0 += kPanelCols) {
        const int64_t n = std::min(kPanelCols, jc_end - p0);
        for (int64_t i = 0; i < n; i++)
          k.dequant(rows + i * kc, w + (p0 + i) * row_bytes + k0 / kQ4_0BlockElems * kQ4_0BlockBytes,
                    kc / kQ4_0BlockElems, kQ4_0BlockBytes);
        transpose_into_panel(P, rows, n, kc);
        k.panel_gemm(Y + p0, n_out, A, P, T, n, kc, k0 > 0);
      }
    }
  }
}

// dX[:, 32*cb0 : 32*cb1] (+)= dY[:, j_start:j_end] · W[j_start:j_end, those columns]. A panel is one column
// of blocks over 256 rows j: dequantised straight into [k][32] layout, no transpose.
void dx_panels(const Q4_0Kernels& k, float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate, int64_t cb0, int64_t cb1) {
  const int64_t row_bytes = q4t::row_bytes(Format::Q4_0, n_in);
  const int64_t packed = ceil_div(T, k.panel_tokens) * k.panel_tokens * kDepth;
  float* A = tile_buffer(packed + kDepth * kPanelCols);
  float* P = A + packed;
  for (int64_t jc = cb0; jc < cb1; jc += kPanelGroup) {
    const int64_t jc_end = std::min(cb1, jc + kPanelGroup);
    for (int64_t j0 = j_start; j0 < j_end; j0 += kDepth) {
      const int64_t kc = std::min(kDepth, j_end - j0);
      detail::pack_panel_tokens(A, dY + j0, n_out, T, kc, k.panel_tokens);
      for (int64_t c = jc; c < jc_end; c++) {
        k.dequant(P, w + j0 * row_bytes + c * kQ4_0BlockBytes, kc, row_bytes);
        k.panel_gemm(dX + c * kQ4_0BlockElems, n_in, A, P, T, kPanelCols, kc, accumulate || j0 > j_start);
      }
    }
  }
}

// Y[:, r0:r1] = X · W[r0:r1, :]ᵀ through Eigen: tiles of rows x kc columns of W, dequantised, then
// Y[:, rows] (+)= X[:, kc] · tileᵀ, the first column slice overwriting.
void gemm_tiles(const Q4_0Kernels& k, float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
                int64_t n_in, int64_t r0, int64_t r1, int64_t tile_rows) {
  const int64_t row_bytes = q4t::row_bytes(Format::Q4_0, n_in);
  const int64_t kc =
      std::clamp<int64_t>(kTileFloats / tile_rows / kQ4_0BlockElems * kQ4_0BlockElems, kQ4_0BlockElems, n_in);
  float* tile = tile_buffer(tile_rows * kc);
  for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, r1 - t0);
    View Yt(Y + t0, T, rows, Eigen::OuterStride<>(n_out));
    for (int64_t k0 = 0; k0 < n_in; k0 += kc) {
      const int64_t cols = std::min(kc, n_in - k0);
      for (int64_t r = 0; r < rows; r++)
        k.dequant(tile + r * cols, w + (t0 + r) * row_bytes + k0 / kQ4_0BlockElems * kQ4_0BlockBytes,
                  cols / kQ4_0BlockElems, kQ4_0BlockBytes);
      ConstView Wt(tile, rows, cols, Eigen::OuterStride<>(cols));
      ConstView Xc(X + k0, T, cols, Eigen::OuterStride<>(n_in));
      if (k0 == 0)
        Yt.noalias() = Xc * Wt.transpose();
      else
        Yt.noalias() += Xc * Wt.transpose();
    }
  }
}

// dX[:, 32*cb0 : 32*cb1] (+)= dY[:, j_start:j_end] · W[j_start:j_end, those columns] through Eigen.
void dx_tiles(const Q4_0Kernels& k, float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out,
              int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate, int64_t cb0, int64_t cb1) {
  const int64_t row_bytes = q4t::row_bytes(Format::Q4_0, n_in);
  float* tile = tile_buffer(kDxTileRows * kDxColBlocks * kQ4_0BlockElems);
  for (int64_t c0 = cb0; c0 < cb1; c0 += kDxColBlocks) {
    const int64_t nbc = std::min(kDxColBlocks, cb1 - c0), cols = nbc * kQ4_0BlockElems;
    View dXc(dX + c0 * kQ4_0BlockElems, T, cols, Eigen::OuterStride<>(n_in));
    for (int64_t j0 = j_start; j0 < j_end; j0 += kDxTileRows) {
      const int64_t rows = std::min(kDxTileRows, j_end - j0);
      for (int64_t r = 0; r < rows; r++)
        k.dequant(tile + r * cols, w + (j0 + r) * row_bytes + c0 * kQ4_0BlockBytes, nbc, kQ4_0BlockBytes);
      ConstView Wt(tile, rows, cols, Eigen::OuterStride<>(cols));
      ConstView dYt(dY + j0, T, rows, Eigen::OuterStride<>(n_out));
      if (j0 == j_start && !accumulate)
        dXc.noalias() = dYt * Wt;
      else
        dXc.noalias() += dYt * Wt;
    }
  }
}

}  // namespace

namespace detail {

// Threads own disjoint row ranges of W, hence disjoint columns of Y.
void q4_0_gemm(float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out, int64_t n_in) {
  if (T < kGemmPanelTokens) {
    // Y is [T, n_out]: token t's outputs are contiguous, so each token is one GEMV.
    for (int64_t t = 0; t < T; t++) gemv(Y + t * n_out, w, X + t * n_in, n_out, n_in);
    return;
  }
  const Q4_0Kernels& k = q4_0_kernels();
  if (k.panel_gemm) {
    parallel_for(n_out, kPanelCols, [&](int64_t r0, int64_t r1) { gemm_panels(k, Y, w, X, T, n_out, n_in, r0, r1); });
    return;
  }
  const int64_t tile_rows = std::min(kMaxTileRows, ceil_div(ceil_div(n_out, num_threads()), 4) * 4);
  parallel_for(n_out, tile_rows, [&](int64_t r0, int64_t r1) {
    gemm_tiles(k, Y, w, X, T, n_out, n_in, r0, r1, tile_rows);
  });
}

// Threads own disjoint column ranges of dX (whole blocks), so no two ever write the same element.
void q4_0_dx(float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start,
             int64_t j_end, bool accumulate) {
  if (T < kDxPanelTokens) {
    for (int64_t t = 0; t < T; t++) dx_one_token(dX + t * n_in, w, dY + t * n_out, n_in, j_start, j_end, accumulate);
    return;
  }
  const Q4_0Kernels& k = q4_0_kernels();
  parallel_for(n_in / kQ4_0BlockElems, 1, [&](int64_t b0, int64_t b1) {
    if (k.panel_gemm)
      dx_panels(k, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate, b0, b1);
    else
      dx_tiles(k, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate, b0, b1);
  });
}

}  // namespace detail

}  // namespace q4t::cpu
