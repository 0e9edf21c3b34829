// Tiling and threading of the CPU Q8_0, Q4_K, Q6_K and F16 linears (see frozen_linear.h). The structure follows
// linear_q4_0.cpp; only the decoding of a row range differs, and it comes from FrozenRowKernels.
//
// FrozenRowKernels only decode ranges that start on a block boundary, and a block may be wider than a 32-column
// panel (the K-quants' 256). So every column range here, whether decoded or handed to a thread, starts on a
// multiple of the format's column unit, lcm(32, block_elems): one panel for Q8_0 and F16, eight for the K-quants,
// which are decoded a whole block per row and used panel by panel.
#include "kernels/cpu/frozen_linear.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/cpu/q4_0_rows.h"
#include "kernels/cpu/threads.h"
#include "kernels/shapes.h"

namespace q4t::cpu::detail {

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstView = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
using View = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;

constexpr int64_t kMinChunkBytes = 128 * 1024;  // weight bytes per thread chunk: less is not worth a wake-up
// Below these token counts one fused pass over W per token beats decoding W into panels (as for Q4_0).
constexpr int64_t kGemmPanelTokens = 12;
constexpr int64_t kDxPanelTokens = 4;
constexpr int64_t kDepth = 256;              // K per panel: a 256 x 32 panel is 32 KiB and stays in L1;
                                             // a multiple of every block size (1, 32, 256)
constexpr int64_t kPanelGroup = 8;           // panels sharing one packing of the token rows
constexpr int64_t kTileFloats = 128 * 1024;  // Eigen path: a 512 KiB decoded tile, in L2
constexpr int64_t kMaxTileRows = 256;        // Eigen path: GEMM output rows per tile
constexpr int64_t kDxTileCols = 512;         // Eigen path: dx columns per tile
constexpr int64_t kDxTileRows = 256;         // Eigen path: dx rows j per tile

// Columns per unit: whole panels and whole blocks (32 for Q8_0 and F16, 256 for Q4_K and Q6_K).
int64_t column_unit(const FrozenRowKernels& k) { return std::lcm(kPanelCols, k.block_elems); }
int64_t row_bytes(const FrozenRowKernels& k, int64_t n_in) { return byte_offset(k, n_in); }

// y[n_out] = W · x, threads over row ranges (a multiple of the 4-row groups the loops share x over).
void gemv(const FrozenRowKernels& k, float* y, const uint8_t* w, const float* x, int64_t n_out, int64_t n_in) {
  const int64_t rb = row_bytes(k, n_in);
  const int64_t grain = ceil_div(std::max<int64_t>(4, kMinChunkBytes / rb), 4) * 4;
  parallel_for(n_out, grain, [&](int64_t r0, int64_t r1) {
    k.dot_rows(y + r0, w + r0 * rb, rb, x, r1 - r0, n_in);
  });
}

// dx[n_in] (+)= dy[j_start:j_end] · W[j_start:j_end, :], threads over column ranges of whole units.
void dx_one_token(const FrozenRowKernels& k, float* dx, const uint8_t* w, const float* dy, int64_t n_in,
                  int64_t j_start, int64_t j_end, bool accumulate) {
  const int64_t rb = row_bytes(k, n_in), unit = column_unit(k);
  const int64_t grain = std::max<int64_t>(1, kMinChunkBytes / ((j_end - j_start) * byte_offset(k, unit)));
  parallel_for(ceil_div(n_in, unit), grain, [&](int64_t u0, int64_t u1) {
    const int64_t c0 = u0 * unit, c1 = std::min(n_in, u1 * unit);
    if (!accumulate) std::memset(dx + c0, 0, size_t(c1 - c0) * sizeof(float));
    k.axpy_rows(dx + c0, w + j_start * rb + byte_offset(k, c0), rb, dy + j_start, j_end - j_start, c1 - c0);
  });
}

// P[k][i] = rows[i][k] for i < n and 0 for n <= i < 32: the GEMM's B = Wᵀ, 32 output rows wide.
void transpose_into_panel(float* P, float* rows, int64_t n, int64_t kc) {
  std::memset(rows + n * kc, 0, size_t((kPanelCols - n) * kc) * sizeof(float));
  for (int64_t kk = 0; kk < kc; kk++)
    for (int64_t i = 0; i < kPanelCols; i++) P[kk * kPanelCols + i] = rows[i * kc + kk];
}

// Y[:, r0:r1] = X · W[r0:r1, :]ᵀ with packed panels: for each block of 8 panels (256 output rows) and each
// 256-deep slice of K, X's slice is packed once and each panel of W is decoded, transposed and multiplied
// while it sits in L1.
void gemm_panels(const Q4_0Kernels& pk, const FrozenRowKernels& k, float* Y, const uint8_t* w, const float* X,
                 int64_t T, int64_t n_out, int64_t n_in, int64_t r0, int64_t r1) {
  const int64_t rb = row_bytes(k, n_in);
  const int64_t packed = ceil_div(T, pk.panel_tokens) * pk.panel_tokens * kDepth;
  float* A = thread_scratch(packed + 2 * kDepth * kPanelCols);
  float* P = A + packed;
  float* rows = P + kDepth * kPanelCols;  // one panel's W rows, row-major, before the transpose
  for (int64_t jc = r0; jc < r1; jc += kPanelGroup * kPanelCols) {
    const int64_t jc_end = std::min(r1, jc + kPanelGroup * kPanelCols);
    for (int64_t k0 = 0; k0 < n_in; k0 += kDepth) {
      const int64_t kc = std::min(kDepth, n_in - k0);
      pack_panel_tokens(A, X + k0, n_in, T, kc, pk.panel_tokens);
      for (int64_t p0 = jc; p0 < jc_end; p0 += kPanelCols) {
        const int64_t n = std::min(kPanelCols, jc_end - p0);
        for (int64_t i = 0; i < n; i++) k.decode(rows + i * kc, w + (p0 + i) * rb + byte_offset(k, k0), kc);
        transpose_into_panel(P, rows, n, kc);
        pk.panel_gemm(Y + p0, n_out, A, P, T, n, kc, k0 > 0);
      }
    }
  }
}

// W[0:kc, 0:n) (rows rb bytes apart, n <= one unit) -> ceil(n/32) panels of [kc][32], panel p at P + p·kc·32,
// zero past column n. A unit of one panel is decoded straight into it; a wider one (a K-quant block) is decoded
// once per row into `row` and dealt out to its panels.
void decode_unit_into_panels(const FrozenRowKernels& k, float* P, float* row, const uint8_t* w, int64_t rb,
                             int64_t kc, int64_t n) {
  if (n <= kPanelCols) {
    for (int64_t kk = 0; kk < kc; kk++) {
      float* Pk = P + kk * kPanelCols;
      k.decode(Pk, w + kk * rb, n);
      std::fill(Pk + n, Pk + kPanelCols, 0.0f);
    }
    return;
  }
  for (int64_t kk = 0; kk < kc; kk++) {
    k.decode(row, w + kk * rb, n);
    for (int64_t c0 = 0; c0 < n; c0 += kPanelCols) {
      float* Pk = P + c0 * kc + kk * kPanelCols;
      const int64_t m = std::min(kPanelCols, n - c0);
      std::copy(row + c0, row + c0 + m, Pk);
      std::fill(Pk + m, Pk + kPanelCols, 0.0f);
    }
  }
}

// dX[:, c0:c1] (+)= dY[:, j_start:j_end] · W[j_start:j_end, c0:c1], c0 on a unit. For each group of 8 panels
// (256 columns) and 256-deep slice of j, dY's slice is packed once; then each unit's panels are decoded in
// [k][32] layout (no transpose) and multiplied. The last panel may be narrower.
void dx_panels(const Q4_0Kernels& pk, const FrozenRowKernels& k, float* dX, const uint8_t* w, const float* dY,
               int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate, int64_t c0,
               int64_t c1) {
  const int64_t rb = row_bytes(k, n_in), unit = column_unit(k);
  const int64_t group = std::lcm(unit, kPanelGroup * kPanelCols);
  const int64_t packed = ceil_div(T, pk.panel_tokens) * pk.panel_tokens * kDepth;
  float* A = thread_scratch(packed + kDepth * unit + unit);
  float* P = A + packed;          // one unit's panels, [unit / 32][kc][32]
  float* row = P + kDepth * unit;  // one row of a unit, decoded
  for (int64_t g0 = c0; g0 < c1; g0 += group) {
    const int64_t g1 = std::min(c1, g0 + group);
    for (int64_t j0 = j_start; j0 < j_end; j0 += kDepth) {
      const int64_t kc = std::min(kDepth, j_end - j0);
      pack_panel_tokens(A, dY + j0, n_out, T, kc, pk.panel_tokens);
      for (int64_t u0 = g0; u0 < g1; u0 += unit) {
        const int64_t n = std::min(unit, g1 - u0);
        decode_unit_into_panels(k, P, row, w + j0 * rb + byte_offset(k, u0), rb, kc, n);
        for (int64_t p0 = 0; p0 < n; p0 += kPanelCols)
          pk.panel_gemm(dX + u0 + p0, n_in, A, P + p0 * kc, T, std::min(kPanelCols, n - p0), kc,
                        accumulate || j0 > j_start);
      }
    }
  }
}

// Y[:, r0:r1] = X · W[r0:r1, :]ᵀ through Eigen: tiles of rows x kc columns of W, decoded, then
// Y[:, rows] (+)= X[:, kc] · tileᵀ, the first column slice overwriting.
void gemm_tiles(const FrozenRowKernels& k, float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
                int64_t n_in, int64_t r0, int64_t r1, int64_t tile_rows) {
  const int64_t rb = row_bytes(k, n_in), unit = column_unit(k);
  const int64_t kc = std::min(n_in, std::max(unit, kTileFloats / tile_rows / unit * unit));
  float* tile = thread_scratch(tile_rows * kc);
  for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, r1 - t0);
    View Yt(Y + t0, T, rows, Eigen::OuterStride<>(n_out));
    for (int64_t k0 = 0; k0 < n_in; k0 += kc) {
      const int64_t cols = std::min(kc, n_in - k0);
      for (int64_t r = 0; r < rows; r++) k.decode(tile + r * cols, w + (t0 + r) * rb + byte_offset(k, k0), cols);
      ConstView Wt(tile, rows, cols, Eigen::OuterStride<>(cols));
      ConstView Xc(X + k0, T, cols, Eigen::OuterStride<>(n_in));
      if (k0 == 0)
        Yt.noalias() = Xc * Wt.transpose();
      else
        Yt.noalias() += Xc * Wt.transpose();
    }
  }
}

// dX[:, col0:col1] (+)= dY[:, j_start:j_end] · W[j_start:j_end, col0:col1] through Eigen (col0 on a unit;
// kDxTileCols is a multiple of every unit).
void dx_tiles(const FrozenRowKernels& k, float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out,
              int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate, int64_t col0, int64_t col1) {
  const int64_t rb = row_bytes(k, n_in);
  float* tile = thread_scratch(kDxTileRows * kDxTileCols);
  for (int64_t c0 = col0; c0 < col1; c0 += kDxTileCols) {
    const int64_t cols = std::min(kDxTileCols, col1 - c0);
    View dXc(dX + c0, T, cols, Eigen::OuterStride<>(n_in));
    for (int64_t j0 = j_start; j0 < j_end; j0 += kDxTileRows) {
      const int64_t rows = std::min(kDxTileRows, j_end - j0);
      for (int64_t r = 0; r < rows; r++) k.decode(tile + r * cols, w + (j0 + r) * rb + byte_offset(k, c0), cols);
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

// Threads own disjoint row ranges of W, hence disjoint columns of Y.
void frozen_gemm(const FrozenRowKernels& k, float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
                 int64_t n_in) {
  if (T < kGemmPanelTokens) {
    // Y is [T, n_out]: token t's outputs are contiguous, so each token is one GEMV.
    for (int64_t t = 0; t < T; t++) gemv(k, Y + t * n_out, w, X + t * n_in, n_out, n_in);
    return;
  }
  const Q4_0Kernels& pk = q4_0_kernels();
  if (pk.panel_gemm) {
    parallel_for(n_out, kPanelCols, [&](int64_t r0, int64_t r1) {
      gemm_panels(pk, k, Y, w, X, T, n_out, n_in, r0, r1);
    });
    return;
  }
  const int64_t tile_rows = std::min(kMaxTileRows, ceil_div(ceil_div(n_out, num_threads()), 4) * 4);
  parallel_for(n_out, tile_rows, [&](int64_t r0, int64_t r1) {
    gemm_tiles(k, Y, w, X, T, n_out, n_in, r0, r1, tile_rows);
  });
}

// Threads own disjoint column ranges of dX (whole units), so no two ever write the same element.
void frozen_dx(const FrozenRowKernels& k, float* dX, const uint8_t* w, const float* dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) {
  if (T < kDxPanelTokens) {
    for (int64_t t = 0; t < T; t++)
      dx_one_token(k, dX + t * n_in, w, dY + t * n_out, n_in, j_start, j_end, accumulate);
    return;
  }
  const Q4_0Kernels& pk = q4_0_kernels();
  const int64_t unit = column_unit(k);
  parallel_for(ceil_div(n_in, unit), 1, [&](int64_t u0, int64_t u1) {
    const int64_t c0 = u0 * unit, c1 = std::min(n_in, u1 * unit);
    if (pk.panel_gemm)
      dx_panels(pk, k, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate, c0, c1);
    else
      dx_tiles(k, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate, c0, c1);
  });
}

}  // namespace q4t::cpu::detail
