// Quantizing a weight again after a change (q4tune merge): W [n_out, n_in] in f32 to a format's bytes, by
// rounding alone, with the weight's bytes from before the change as a second candidate grid, and with the
// inputs the weight sees on calibration data, whose correlations steer each rounding error into the weights
// not yet rounded (the order-by-column error feedback of GPTQ, Frantar et al. 2022).
#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/gguf.h"

namespace q4t {

// What the calibration inputs X [N, n_in] of a weight come to for quantizing it: the upper-triangular U with
// Uᵀ·U = (XᵀX/N + λ·I)⁻¹, λ = damp · the mean of XᵀX/N's diagonal (so a column no token uses still has a
// finite inverse). Rounding weight j by e moves the output by e·x_j; the weights after j absorb e / U[j,j] ·
// U[j, j+1..], which is the least-squares answer over the calibration tokens.
struct InputFactor {
  Eigen::MatrixXf U;  // [n_in, n_in], upper triangular
  int64_t tokens = 0;
};
std::shared_ptr<const InputFactor> input_factor(const Eigen::MatrixXf& X, double damp = 0.01);

// The bytes of W [n_out, n_in] (row-major) in `type` (F32, or any format q4tune writes).
// - before (the weight's bytes before the change, in the same type): each block is also rounded on its old grid
//   (its old scales kept, each weight's quant chosen anew), and the closer of the two grids is kept, so a small
//   change costs at most itself, not a whole new rounding of the block.
// - inputs: the blocks are rounded in column order, each weight on its block's grid (quantized afresh from the
//   weights as the feedback has left them, or the old grid) with the error feedback above, and each block keeps
//   the grid with the smaller output error. w is changed by the feedback. Formats without per-weight quants
//   (F16, BF16) round alone.
std::vector<uint8_t> encode_weight(std::vector<float>& w, gguf::GgmlType type, int64_t n_out, int64_t n_in,
                                   const uint8_t* before = nullptr, const InputFactor* inputs = nullptr);

// Σ over the calibration tokens of |(W - deq(bytes))·x|², divided by N: the output error that encode_weight with
// inputs lowers (tests and the merge's report).
double output_error(const std::vector<float>& w, const std::vector<uint8_t>& bytes, gguf::GgmlType type, int64_t n_out,
                    int64_t n_in, const Eigen::MatrixXf& X);

}  // namespace q4t
