// Quantizing a weight again: rounding alone, on the old grid as well, or with calibration inputs' error feedback.
#include "train/requantize.h"

#include <Eigen/Cholesky>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "kernels/cpu/threads.h"
#include "kernels/formats.h"

namespace q4t {
namespace {

using gguf::GgmlType;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The bits of a block that belong to one weight alone (its quant), per weight: found by flipping each bit of a
// block quantized from random values and seeing which weights change, so no format needs code of its own here.
// k = 0 where the weights do not all own the same number (1 to 8) of bits (F16, BF16: not blocks of quants).
struct QuantBits {
  int k = 0;
  std::vector<std::vector<int64_t>> bits;  // bits[i]: weight i's bit positions in the block
  std::vector<uint8_t> mask;               // every weight's bits
  std::vector<std::vector<uint8_t>> all;   // all[v]: the bits that give every weight the quant pattern v
};

QuantBits probe_quant_bits(const FormatTraits& f) {
  QuantBits q;
  const int64_t n = f.block_elems;
  if (n < 2) return q;
  std::vector<float> x(static_cast<size_t>(n)), ref(x.size()), got(x.size());
  uint64_t state = 0x9E3779B97F4A7C15ull;  // a fixed pseudo-random block: every scale of it non-zero
  for (float& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = float(int64_t(state >> 40) % 2001 - 1000) / 1000.0f;
  }
  std::vector<uint8_t> block(static_cast<size_t>(f.block_bytes));
  f.quantize_row(block.data(), x.data(), n);
  f.dequantize_row(ref.data(), block.data(), n);
  q.bits.assign(static_cast<size_t>(n), {});
  for (int64_t bit = 0; bit < 8 * f.block_bytes; ++bit) {
    block[size_t(bit / 8)] ^= uint8_t(1u << (bit % 8));
    f.dequantize_row(got.data(), block.data(), n);
    block[size_t(bit / 8)] ^= uint8_t(1u << (bit % 8));
    int64_t changed = -1, count = 0;
    for (int64_t i = 0; i < n; ++i)
      if (!(got[size_t(i)] == ref[size_t(i)])) changed = i, ++count;
    if (count == 1) q.bits[size_t(changed)].push_back(bit);
  }
  const size_t k = q.bits[0].size();
  for (const auto& b : q.bits)
    if (b.size() != k || k < 1 || k > 8) return QuantBits{};
  q.k = int(k);
  q.mask.assign(block.size(), 0);
  q.all.assign(size_t(1) << k, std::vector<uint8_t>(block.size(), 0));
  for (const auto& b : q.bits)
    for (size_t j = 0; j < k; ++j) {
      const auto bit = uint8_t(1u << (b[j] % 8));
      q.mask[size_t(b[j] / 8)] |= bit;
      for (uint32_t v = 0; v < (1u << k); ++v)
        if ((v >> j) & 1u) q.all[v][size_t(b[j] / 8)] |= bit;
    }
  return q;
}

const QuantBits& quant_bits(const FormatTraits& f) {
  static std::mutex m;
  static std::map<Format, QuantBits> probed;
  std::lock_guard<std::mutex> lock(m);
  auto it = probed.find(f.format);
  if (it == probed.end()) it = probed.emplace(f.format, probe_quant_bits(f)).first;
  return it->second;
}

void set_quant(uint8_t* block, const std::vector<int64_t>& bits, uint32_t v) {
  for (size_t j = 0; j < bits.size(); ++j) {
    const auto mask = uint8_t(1u << (bits[j] % 8));
    uint8_t& byte = block[size_t(bits[j] / 8)];
    byte = (v >> j) & 1u ? uint8_t(byte | mask) : uint8_t(byte & ~mask);
  }
}

double squared_error(const float* a, const float* b, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) e += double(a[i] - b[i]) * double(a[i] - b[i]);
  return e;
}

// The bytes of W[n_out, n_in] in `type` (F32, or any format q4tune writes). With `before` (the weight's bytes
// before the merge, in the same type), each block is also rounded on its old grid (its old scales kept, each
// weight's quant chosen anew), and the block keeps whichever of that and the block quantized afresh lies closer
// The value each weight of `block` takes with each quant v, its scales kept: grid[v·n + i] (n weights).
void grid_values(const FormatTraits& f, const QuantBits& q, const uint8_t* block, std::vector<uint8_t>& scratch,
                 std::vector<float>& grid) {
  const int64_t n = f.block_elems;
  scratch.assign(block, block + f.block_bytes);
  grid.resize(static_cast<size_t>(n) << q.k);
  for (uint32_t v = 0; v < (1u << q.k); ++v) {
    for (size_t j = 0; j < scratch.size(); ++j) scratch[j] = uint8_t((scratch[j] & ~q.mask[j]) | q.all[v][j]);
    f.dequantize_row(grid.data() + size_t(v) * size_t(n), scratch.data(), n);
  }
}

// The quant whose value lies nearest x for weight i (the first of equals).
uint32_t nearest(const std::vector<float>& grid, int64_t n, int k, int64_t i, float x) {
  uint32_t best = 0;
  float d = INFINITY;
  for (uint32_t v = 0; v < (1u << k); ++v) {
    const float e = std::abs(grid[size_t(v) * size_t(n) + size_t(i)] - x);
    if (e < d) d = e, best = v;
  }
  return best;
}

// Rows quantized afresh; where `before` is given, each block replaced by its old grid's rounding when closer.
void encode_rounding(const std::vector<float>& w, const FormatTraits& f, const QuantBits& q, int64_t n_out,
                     int64_t n_in, const uint8_t* before, std::vector<uint8_t>& bytes) {
  const int64_t rb = row_bytes(f.format, n_in);
  cpu::parallel_for(n_out, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) f.quantize_row(bytes.data() + r * rb, w.data() + r * n_in, n_in);
  });
  if (!before || q.k == 0) return;
  const int64_t n = f.block_elems, blocks = n_out * (n_in / n);  // rows are whole blocks: block b holds weights b·n ..
  cpu::parallel_for(blocks, 64, [&](int64_t b0, int64_t b1) {
    std::vector<float> fresh(static_cast<size_t>(n)), deq(fresh.size()), grid;
    std::vector<uint8_t> old(static_cast<size_t>(f.block_bytes)), scratch;
    for (int64_t b = b0; b < b1; ++b) {
      uint8_t* out = bytes.data() + b * f.block_bytes;
      const float* x = w.data() + b * n;
      std::memcpy(old.data(), before + b * f.block_bytes, old.size());
      grid_values(f, q, old.data(), scratch, grid);
      for (int64_t i = 0; i < n; ++i) set_quant(old.data(), q.bits[size_t(i)], nearest(grid, n, q.k, i, x[i]));
      f.dequantize_row(deq.data(), old.data(), n);
      f.dequantize_row(fresh.data(), out, n);
      if (squared_error(deq.data(), x, n) < squared_error(fresh.data(), x, n)) std::memcpy(out, old.data(), old.size());
    }
  });
}

// One block of one row on the grid of `block` (its quants rewritten in place): weight j of the block (column
// c0 + j) takes the quant nearest its value after the feedback of the weights before it in the block, and its
// error e_j = (value - quant's value) / U[c0+j, c0+j] moves the later weights of the block by e_j·U[c0+j, ..].
// Returns Σ e_j² (the output error this block adds, up to a constant); errs gets the e_j.
double round_with_feedback(const FormatTraits& f, const QuantBits& q, uint8_t* block, const float* x,
                           const Eigen::MatrixXf& U, int64_t c0, std::vector<uint8_t>& scratch,
                           std::vector<float>& grid, std::vector<float>& t, float* errs) {
  const int64_t n = f.block_elems;
  grid_values(f, q, block, scratch, grid);
  t.assign(x, x + n);
  double loss = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t v = nearest(grid, n, q.k, j, t[size_t(j)]);
    set_quant(block, q.bits[size_t(j)], v);
    const float e = (t[size_t(j)] - grid[size_t(v) * size_t(n) + size_t(j)]) / U(c0 + j, c0 + j);
    errs[j] = e;
    loss += double(e) * double(e);
    for (int64_t i = j + 1; i < n; ++i) t[size_t(i)] -= e * U(c0 + j, c0 + i);
  }
  return loss;
}

// Block column by block column: every row's block rounded with feedback on its fresh grid and on its old one (the
// smaller error kept), then the columns after the block absorb the blocks' errors through U.
void encode_with_inputs(std::vector<float>& w, const FormatTraits& f, const QuantBits& q, int64_t n_out, int64_t n_in,
                        const uint8_t* before, const InputFactor& in, std::vector<uint8_t>& bytes) {
  if (in.U.rows() != n_in || in.U.cols() != n_in)
    throw std::invalid_argument("encode_weight: calibration inputs of " + std::to_string(in.U.rows()) +
                                " columns for a weight of " + std::to_string(n_in));
  const int64_t n = f.block_elems, rb = row_bytes(f.format, n_in);
  Eigen::Map<RowMajor> W(w.data(), n_out, n_in);
  RowMajor E(n_out, n);
  for (int64_t c0 = 0; c0 < n_in; c0 += n) {
    const int64_t at = c0 / n * f.block_bytes;
    cpu::parallel_for(n_out, 8, [&](int64_t r0, int64_t r1) {
      std::vector<uint8_t> cand(static_cast<size_t>(f.block_bytes)), scratch;
      std::vector<float> grid, t, errs(static_cast<size_t>(n));
      for (int64_t r = r0; r < r1; ++r) {
        uint8_t* out = bytes.data() + r * rb + at;
        const float* x = &W(r, c0);
        f.quantize_row(out, x, n);
        double best = round_with_feedback(f, q, out, x, in.U, c0, scratch, grid, t, &E(r, 0));
        if (!before) continue;
        std::memcpy(cand.data(), before + r * rb + at, cand.size());
        if (round_with_feedback(f, q, cand.data(), x, in.U, c0, scratch, grid, t, errs.data()) < best) {
          std::memcpy(out, cand.data(), cand.size());
          std::memcpy(&E(r, 0), errs.data(), errs.size() * sizeof(float));
        }
      }
    });
    const int64_t rest = n_in - c0 - n;
    if (rest > 0) W.rightCols(rest).noalias() -= E * in.U.block(c0, c0 + n, n, rest);
  }
}

}  // namespace

std::shared_ptr<const InputFactor> input_factor(const Eigen::MatrixXf& X, double damp) {
  const int64_t k = X.cols(), N = X.rows();
  Eigen::MatrixXf Hf = Eigen::MatrixXf::Zero(k, k);
  Hf.selfadjointView<Eigen::Lower>().rankUpdate(X.transpose());
  Eigen::MatrixXd H = Hf.selfadjointView<Eigen::Lower>().toDenseMatrix().cast<double>() / double(std::max<int64_t>(N, 1));
  const double mean = H.diagonal().mean();
  H.diagonal().array() += damp * (mean > 0 ? mean : 1.0);
  // With P the reversal of the columns' order and P·H·P = L·Lᵀ: H⁻¹ = (P·L⁻¹·P)ᵀ(P·L⁻¹·P), and P·L⁻¹·P is upper.
  const Eigen::MatrixXd R = H.reverse();
  Eigen::LLT<Eigen::MatrixXd> llt(R);
  if (llt.info() != Eigen::Success) throw std::runtime_error("calibration inputs: their covariance is not positive definite");
  Eigen::MatrixXd Linv = Eigen::MatrixXd::Identity(k, k);
  llt.matrixL().solveInPlace(Linv);
  auto f = std::make_shared<InputFactor>();
  f->U = Linv.reverse().cast<float>();
  f->tokens = N;
  return f;
}

std::vector<uint8_t> encode_weight(std::vector<float>& w, GgmlType type, int64_t n_out, int64_t n_in,
                                   const uint8_t* before, const InputFactor* inputs) {
  if (type == GgmlType::F32) {
    std::vector<uint8_t> bytes(w.size() * sizeof(float));
    std::memcpy(bytes.data(), w.data(), bytes.size());
    return bytes;
  }
  const FormatTraits& f = *find_format(uint32_t(type));
  std::vector<uint8_t> bytes(static_cast<size_t>(n_out * row_bytes(f.format, n_in)));
  const QuantBits& q = quant_bits(f);
  if (inputs && q.k > 0)
    encode_with_inputs(w, f, q, n_out, n_in, before, *inputs, bytes);
  else
    encode_rounding(w, f, q, n_out, n_in, before, bytes);
  return bytes;
}

double output_error(const std::vector<float>& w, const std::vector<uint8_t>& bytes, GgmlType type, int64_t n_out,
                    int64_t n_in, const Eigen::MatrixXf& X) {
  const std::vector<float> d = type == GgmlType::F32
                                   ? std::vector<float>(reinterpret_cast<const float*>(bytes.data()),
                                                        reinterpret_cast<const float*>(bytes.data()) + n_out * n_in)
                                   : dequantize_matrix(find_format(uint32_t(type))->format, bytes, n_out, n_in);
  const RowMajor delta = Eigen::Map<const RowMajor>(w.data(), n_out, n_in) - Eigen::Map<const RowMajor>(d.data(), n_out, n_in);
  return double((X * delta.transpose()).squaredNorm()) / double(std::max<Eigen::Index>(X.rows(), 1));
}

}  // namespace q4t
