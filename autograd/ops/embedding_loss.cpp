// embedding (the token lookup), cross_entropy and linear_cross_entropy (the loss, with or without the [T, V]
// logits). T = tokens, C = channels, V = vocabulary.
//
// Both losses share one online log-sum-exp over vocabulary tiles and one statistics tensor per node,
//   stats [3T + 1] = m[T] | s[T] | z[T] | n
// m: the running row max (the log-sum-exp lse once the last tile is in), s: the running Σ exp(logit − m),
// z: the logit of the token's label, n: the number of counted tokens (label ≠ -100). cross_entropy is the
// special case of a single tile holding the whole vocabulary.
//
// Labels: -100 marks a token that is not counted; when no token is counted the loss is 0 and so is its gradient
// (instead of 0/0). Any other label must lie in [0, V): the CPU throws std::out_of_range at forward time,
// the GPU (which cannot throw) does not count such a token. Likewise embedding ids outside [0, V) throw on the
// CPU and are clamped to the nearest row on the GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"
#include "kernels/cpu/linear.h"
#include "kernels/shapes.h"

namespace q4t::ag {

namespace {

constexpr int32_t kIgnoreLabel = -100;

// The suffix of the per-format GLSL kernels for a table or output matrix (embedding_forward_<suffix>,
// linear_ce_*_<suffix>): the frozen format's name, or f32.
std::string shader_suffix(DType t) { return is_frozen_storage(t) ? format_name(frozen_format(t)) : "f32"; }

// --- embedding: y[T, C] = table[ids[t], :] ------------------------------------------------------------------

Shape embedding_shape(const Graph& g, const Node& n) {
  const Tensor &table = g.node(n.inputs[0]).value, &ids = g.node(n.inputs[1]).value;
  if (table.shape().size() != 2)
    throw GraphError("embedding: the table must be a matrix [V, C], not " + shape_str(table.shape()));
  if (ids.dtype() != DType::I32 || ids.shape().size() != 1)
    throw GraphError("embedding: ids must be an i32 vector [T], not " + std::string(dtype_name(ids.dtype())) + " " +
                     shape_str(ids.shape()));
  return {ids.dim(0), table.dim(1)};
}

template <class T>
void embedding_forward_cpu(OpContext& c) {
  const Tensor &table = c.in(0), &ids = c.in(1);
  const int64_t V = table.dim(0), C = table.dim(1), Tn = ids.numel();
  const int32_t* pid = ids.data<int32_t>();
  T* y = c.node.value.data<T>();
  for (int64_t t = 0; t < Tn; ++t) {
    if (pid[t] < 0 || pid[t] >= V)
      throw std::out_of_range("embedding: token " + std::to_string(t) + " has id " + std::to_string(pid[t]) +
                              ", outside the table's " + std::to_string(V) + " rows");
    matrix_row(y + t * C, table, pid[t]);
  }
}

// dtable[ids[t], :] += dy[t, :], tokens in order.
template <class T>
void embedding_backward_cpu(OpContext& c) {
  const Tensor& ids = c.in(1);
  const int64_t C = c.in(0).dim(1), Tn = ids.numel();
  const int32_t* pid = ids.data<int32_t>();
  const T* dy = c.node.grad.data<T>();
  T* dtable = c.in_grad(0).data<T>();
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t i = 0; i < C; ++i) dtable[pid[t] * C + i] += dy[t * C + i];
}

struct EmbeddingPush {
  uint32_t T, C, V, format;
};
struct EmbeddingBackwardPush {
  uint32_t T, C, V;
};

void embedding_forward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? embedding_forward_cpu<double>(c) : embedding_forward_cpu<float>(c);
  const Tensor &table = c.in(0), &ids = c.in(1), &y = c.node.value;
  EmbeddingPush push{uint32_t(ids.numel()), uint32_t(table.dim(1)), uint32_t(table.dim(0)),
                     0};
  const auto& p = c.be.pipeline("embedding_forward_" + shader_suffix(table.dtype()), 3, sizeof(push));
  c.seq->dispatch(p, {&y.buffer(), &table.buffer(), &ids.buffer()}, push, groups_for(y.numel(), 256));
}

void embedding_backward(OpContext& c) {
  if (!c.needs_grad(0)) return;
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? embedding_backward_cpu<double>(c) : embedding_backward_cpu<float>(c);
  const Tensor &table = c.in(0), &ids = c.in(1);
  EmbeddingBackwardPush push{uint32_t(ids.numel()), uint32_t(table.dim(1)), uint32_t(table.dim(0))};
  const auto& p = c.be.pipeline("embedding_backward", 3, sizeof(push));
  c.seq->dispatch(p, {&c.in_grad(0).buffer(), &c.node.grad.buffer(), &ids.buffer()}, push,
                  {ceil_div_u32(table.dim(1), 64), 1, 1});
}

// --- the online log-sum-exp shared by both losses (CPU; the GPU twins are cross_entropy_*.comp) -------------

void check_labels(const char* op, const Tensor& labels, int64_t V) {
  const int32_t* l = labels.data<int32_t>();
  for (int64_t t = 0; t < labels.numel(); ++t)
    if (l[t] != kIgnoreLabel && (l[t] < 0 || l[t] >= V))
      throw std::out_of_range(std::string(op) + ": token " + std::to_string(t) + " has label " +
                              std::to_string(l[t]) + ", outside the vocabulary [0, " + std::to_string(V) +
                              ") (-100 marks a token that is not counted)");
}

// Folds one vocabulary tile logits [T, n] (columns j0 .. j0+n-1) into stats; `first` starts afresh.
template <class T>
void lse_tile_cpu(T* st, const T* logits, const int32_t* labels, int64_t Tn, int64_t n, int64_t j0, bool first) {
  for (int64_t t = 0; t < Tn; ++t) {
    const T* row = logits + t * n;
    const T tile_max = *std::max_element(row, row + n);
    const T m_old = first ? tile_max : st[t];
    const T m_new = std::max(m_old, tile_max);
    T s = 0;
    for (int64_t j = 0; j < n; ++j) s += std::exp(row[j] - m_new);
    st[Tn + t] = (first ? T(0) : st[Tn + t] * std::exp(m_old - m_new)) + s;
    st[t] = m_new;
    if (first) st[2 * Tn + t] = 0;
    if (labels[t] >= j0 && labels[t] < j0 + n) st[2 * Tn + t] = row[labels[t] - j0];
  }
}

// After the last tile: m becomes lse, n is counted; returns the mean loss over counted tokens (0 if none).
template <class T>
T lse_finish_cpu(T* st, const int32_t* labels, int64_t Tn) {
  T sum = 0;
  int64_t n = 0;
  for (int64_t t = 0; t < Tn; ++t) {
    st[t] += std::log(st[Tn + t]);
    if (labels[t] == kIgnoreLabel) continue;
    sum += st[t] - st[2 * Tn + t];
    ++n;
  }
  st[3 * Tn] = T(n);
  return n > 0 ? sum / T(n) : T(0);
}

// dlogits of one tile [T, n]: seed / n_counted · (softmax − onehot) on counted rows, 0 elsewhere. Written into
// g (which may be `logits` itself) or added into it.
template <class T>
void softmax_grad_cpu(T* g, const T* logits, bool add, const int32_t* labels, const T* st, T seed, int64_t Tn,
                      int64_t n, int64_t j0) {
  const T n_counted = st[3 * Tn];
  for (int64_t t = 0; t < Tn; ++t) {
    const bool counted = labels[t] != kIgnoreLabel && n_counted > 0;
    const T scale = counted ? seed / n_counted : T(0);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = t * n + j;
      const T d = counted ? scale * (std::exp(logits[i] - st[t]) - T(labels[t] == j0 + j ? 1 : 0)) : T(0);
      g[i] = add ? g[i] + d : d;
    }
  }
}

// The same three steps recorded on Vulkan.
void lse_tile_vk(OpContext& c, const Tensor& stats, const Tensor& logits, const Tensor& labels, int64_t Tn,
                 int64_t n, int64_t j0) {
  struct { uint32_t T, n, j0, first; } push{uint32_t(Tn), uint32_t(n), uint32_t(j0), j0 == 0 ? 1u : 0u};
  const auto& p = c.be.pipeline("cross_entropy_tile", 3, sizeof(push));
  c.seq->dispatch(p, {&stats.buffer(), &logits.buffer(), &labels.buffer()}, push, groups_for(Tn, 1));
}

void lse_finish_vk(OpContext& c, const Tensor& stats, const Tensor& labels, int64_t Tn, int64_t V) {
  struct { uint32_t T, V; } push{uint32_t(Tn), uint32_t(V)};
  const auto& p = c.be.pipeline("cross_entropy_loss", 3, sizeof(push));
  c.seq->dispatch(p, {&c.node.value.buffer(), &stats.buffer(), &labels.buffer()}, push, {1, 1, 1});
}

void softmax_grad_vk(OpContext& c, const Tensor& g, const Tensor& logits, bool add, const Tensor& labels,
                     const Tensor& stats, int64_t Tn, int64_t n, int64_t j0, int64_t V) {
  struct { uint32_t T, n, j0, V, in_place; } push{uint32_t(Tn), uint32_t(n), uint32_t(j0), uint32_t(V), add ? 0u : 1u};
  const auto& p = c.be.pipeline("cross_entropy_backward", 5, sizeof(push));
  c.seq->dispatch(p, {&g.buffer(), &logits.buffer(), &labels.buffer(), &stats.buffer(), &c.node.grad.buffer()}, push,
                  groups_for(Tn * n, 256));
}

// --- cross_entropy(logits [T, V], labels [T]) → [1] ----------------------------------------------------------

void check_labels_shape(const char* op, const Tensor& labels, int64_t Tn) {
  if (labels.dtype() != DType::I32 || labels.numel() != Tn || labels.shape().size() != 1)
    throw GraphError(std::string(op) + ": labels must be an i32 vector [" + std::to_string(Tn) + "], not " +
                     dtype_name(labels.dtype()) + " " + shape_str(labels.shape()));
}

Shape cross_entropy_shape(const Graph& g, const Node& n) {
  const Tensor &logits = g.node(n.inputs[0]).value, &labels = g.node(n.inputs[1]).value;
  if (logits.shape().size() != 2)
    throw GraphError("cross_entropy: logits must be [T, V], not " + shape_str(logits.shape()));
  check_labels_shape("cross_entropy", labels, logits.rows());
  return {1};
}

// saved[0]: stats [3T + 1].
void cross_entropy_prepare(OpContext& c) {
  c.node.saved.push_back(c.scratch({3 * c.in(0).rows() + 1}, c.be.real(), Scratch::Saved));
}

template <class T>
void cross_entropy_forward_cpu(OpContext& c) {
  const Tensor &logits = c.in(0), &labels = c.in(1);
  const int64_t Tn = logits.rows(), V = logits.cols();
  check_labels("cross_entropy", labels, V);
  T* st = c.node.saved[0].data<T>();
  lse_tile_cpu(st, logits.data<T>(), labels.data<int32_t>(), Tn, V, 0, true);
  c.node.value.data<T>()[0] = lse_finish_cpu(st, labels.data<int32_t>(), Tn);
}

template <class T>
void cross_entropy_backward_cpu(OpContext& c) {
  const Tensor& logits = c.in(0);
  softmax_grad_cpu(c.in_grad(0).data<T>(), logits.data<T>(), true, c.in(1).data<int32_t>(),
                   c.node.saved[0].data<T>(), c.node.grad.data<T>()[0], logits.rows(), logits.cols(), 0);
}

void cross_entropy_forward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? cross_entropy_forward_cpu<double>(c) : cross_entropy_forward_cpu<float>(c);
  const Tensor &logits = c.in(0), &labels = c.in(1), &stats = c.node.saved[0];
  lse_tile_vk(c, stats, logits, labels, logits.rows(), logits.cols(), 0);
  lse_finish_vk(c, stats, labels, logits.rows(), logits.cols());
}

void cross_entropy_backward(OpContext& c) {
  if (!c.needs_grad(0)) return;
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? cross_entropy_backward_cpu<double>(c) : cross_entropy_backward_cpu<float>(c);
  const Tensor& logits = c.in(0);
  softmax_grad_vk(c, c.in_grad(0), logits, true, c.in(1), c.node.saved[0], logits.rows(), logits.cols(), 0,
                  logits.cols());
}

// --- linear_cross_entropy(x [T, C], w [V, C] frozen, labels [T], vocab_tile) → [1] ----------------------------
// Forward: per tile of rows [j0, j0 + n) of w, logits [T, n] = x · w[j0 : j0+n]ᵀ folded into the online lse.
// Backward: per tile, the logits again, then dlogits in place, then dx += dlogits · w[j0 : j0+n].

Shape linear_ce_shape(const Graph& g, const Node& n) {
  const Tensor &x = g.node(n.inputs[0]).value, &w = g.node(n.inputs[1]).value, &labels = g.node(n.inputs[2]).value;
  if (w.shape().size() != 2 || x.shape().size() != 2 || x.cols() != w.dim(1))
    throw GraphError("linear_cross_entropy: x " + shape_str(x.shape()) + " must be [T, C] and the weight " +
                     shape_str(w.shape()) + " [V, C] with the same C");
  check_labels_shape("linear_cross_entropy", labels, x.rows());
  return {1};
}

struct LinearCrossEntropyParams {
  int64_t vocab_tile;  // rows of w per tile
};
int64_t tile_rows(const OpContext& c) {
  return std::min(c.node.params_as<LinearCrossEntropyParams>().vocab_tile, c.in(1).dim(0));
}

// Whether the output product runs mixed (f16 inputs, f32 sums: LinearKernels::mixed_for) on this graph.
bool mixed_output(const OpContext& c) {
  return !c.be.is_cpu() && is_frozen_storage(c.in(1).dtype()) && c.be.linear().mixed_for(c.in(0).rows(), c.in(0).cols());
}

// saved[0]: stats [3T + 1]; saved[1]: the one logits tile [T, min(vocab_tile, V)], reused by every tile; on Vulkan,
// saved[2]: the scratch of a tile's products: x and each tile's d as f16 rows for the mixed products, or a Q4_0
// W's d split for the tensor-core dx.
void linear_ce_prepare(OpContext& c) {
  const int64_t Tn = c.in(0).rows(), C = c.in(0).cols(), tile = tile_rows(c);
  c.node.saved.push_back(c.scratch({3 * Tn + 1}, c.be.real(), Scratch::Saved));
  c.node.saved.push_back(c.scratch({Tn, tile}, c.be.real(), Scratch::Pass));
  size_t bytes = 0;
  if (mixed_output(c))  // a tile's forward and dx (LinearKernels::frozen_scratch_bytes of a [tile, C] matrix)
    bytes = c.be.linear().frozen_scratch_bytes(frozen_format(c.in(1).dtype()), Tn, tile, C);
  else if (!c.be.is_cpu() && is_frozen_storage(c.in(1).dtype()) &&
           format_traits(frozen_format(c.in(1).dtype())).gpu.coop_dx && c.node.requires_grad && c.needs_grad(0))
    bytes = c.be.linear().dx_scratch_bytes(frozen_format(c.in(1).dtype()), Tn, tile, C);  // LinearKernels::dx_rows_coop
  if (bytes > 0) c.node.saved.push_back(c.scratch({int64_t(std::max<size_t>(bytes, 4) / 4)}, DType::F32, Scratch::Pass));
}

// Rows [j0, j0 + n) of w as the bytes (frozen) or floats (f32) of a matrix [n, C] of their own.
std::span<const uint8_t> frozen_rows(const Tensor& w, int64_t j0, int64_t n) {
  const int64_t rb = frozen_row_bytes(w.dtype(), w.dim(1));
  return {w.data<uint8_t>() + j0 * rb, size_t(n * rb)};
}
std::span<const float> f32_rows(const Tensor& w, int64_t j0, int64_t n) {
  return {w.data<float>() + j0 * w.dim(1), size_t(n * w.dim(1))};
}

// logits[T, n] = x[T, C] · w[j0 : j0+n, :]ᵀ (a frozen w in the backend's precision)
template <class T>
void tile_logits_cpu(T* logits, const Tensor& x, const Tensor& w, int64_t j0, int64_t n, Precision precision) {
  const int64_t Tn = x.rows(), C = x.cols();
  if constexpr (std::is_same_v<T, float>) {
    const std::span<float> y(logits, size_t(Tn * n));
    const std::span<const float> xs(x.data<float>(), size_t(Tn * C));
    if (is_frozen_storage(w.dtype()))
      return cpu::frozen_gemm(frozen_format(w.dtype()), y, frozen_rows(w, j0, n), xs, Tn, n, C, precision);
    return cpu::gemm_nt(y, xs, f32_rows(w, j0, n), Tn, n, C, false);
  } else {
    std::vector<T> row(static_cast<size_t>(C));
    const T* px = x.data<T>();
    for (int64_t j = 0; j < n; ++j) {
      matrix_row(row.data(), w, j0 + j);
      for (int64_t t = 0; t < Tn; ++t) {
        T s = 0;
        for (int64_t i = 0; i < C; ++i) s += px[t * C + i] * row[size_t(i)];
        logits[t * n + j] = s;
      }
    }
  }
}

// dx[T, C] += d[T, n] · w[j0 : j0+n, :]
template <class T>
void tile_dx_cpu(T* dx, const T* d, const Tensor& w, int64_t Tn, int64_t j0, int64_t n) {
  const int64_t C = w.dim(1);
  if constexpr (std::is_same_v<T, float>) {
    const std::span<float> dxs(dx, size_t(Tn * C));
    const std::span<const float> ds(d, size_t(Tn * n));
    if (is_frozen_storage(w.dtype()))
      return cpu::frozen_dx(frozen_format(w.dtype()), dxs, frozen_rows(w, j0, n), ds, Tn, n, C, 0, n, true);
    cpu::gemm_nn(dxs, ds, f32_rows(w, j0, n), Tn, C, n, true);
  } else {
    std::vector<T> row(static_cast<size_t>(C));
    for (int64_t j = 0; j < n; ++j) {
      matrix_row(row.data(), w, j0 + j);
      for (int64_t t = 0; t < Tn; ++t)
        for (int64_t i = 0; i < C; ++i) dx[t * C + i] += d[t * n + j] * row[size_t(i)];
    }
  }
}

template <class T>
void linear_ce_forward_cpu(OpContext& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &labels = c.in(2);
  const int64_t Tn = x.rows(), V = w.dim(0), tile = tile_rows(c);
  check_labels("linear_cross_entropy", labels, V);
  T *st = c.node.saved[0].data<T>(), *logits = c.node.saved[1].data<T>();
  const int32_t* lab = labels.data<int32_t>();
  for (int64_t j0 = 0; j0 < V; j0 += tile) {
    const int64_t n = std::min(tile, V - j0);
    tile_logits_cpu(logits, x, w, j0, n, c.be.precision());
    lse_tile_cpu(st, logits, lab, Tn, n, j0, j0 == 0);
  }
  c.node.value.data<T>()[0] = lse_finish_cpu(st, lab, Tn);
}

template <class T>
void linear_ce_backward_cpu(OpContext& c) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const int64_t Tn = x.rows(), V = w.dim(0), tile = tile_rows(c);
  const T* st = c.node.saved[0].data<T>();
  if (st[3 * Tn] == 0) return;  // no counted token: the gradient is 0
  T* logits = c.node.saved[1].data<T>();
  const int32_t* lab = c.in(2).data<int32_t>();
  const T seed = c.node.grad.data<T>()[0];
  for (int64_t j0 = 0; j0 < V; j0 += tile) {
    const int64_t n = std::min(tile, V - j0);
    tile_logits_cpu(logits, x, w, j0, n, c.be.precision());
    softmax_grad_cpu(logits, logits, false, lab, st, seed, Tn, n, j0);
    tile_dx_cpu(c.in_grad(0).data<T>(), logits, w, Tn, j0, n);
  }
}

// Must match the push block of linear_ce_logits.comp / linear_ce_dx.comp (gemm_tiled.glsl's fields + row0,
// format, and k_slice, which stays 0: no split of K).
struct TileGemmPush {
  uint32_t M, N, k_begin, k_end, lda, ldb, accumulate, row0, format;
  uint32_t k_slice = 0;
};
void tile_gemm_vk(OpContext& c, const char* shader, const Tensor& out, const Tensor& a, const TileGemmPush& push) {
  const uint32_t tile = vk::gemm_tile_for(push.M, push.N);  // BM = BN of gemm_tiled.glsl
  const auto& p = c.be.pipeline(shader, 3, sizeof(push), {tile, tile});
  c.seq->dispatch(p, {&out.buffer(), &a.buffer(), &c.in(1).buffer()}, push,
                  {ceil_div_u32(push.N, tile), ceil_div_u32(push.M, tile), 1});
}

// logits[T, n] = x · w[j0 : j0+n]ᵀ (M = T, N = n, K = C): the format's tensor-core GEMM where it and the device
// have one (LinearKernels::gemm_rows_coop), else the tiled FP32 kernel.
void tile_logits_vk(OpContext& c, const Tensor& logits, int64_t j0, int64_t n) {
  const Tensor &x = c.in(0), &w = c.in(1);
  if (mixed_output(c))
    return c.be.linear().mixed_gemm(frozen_format(w.dtype()), *c.seq, logits.buffer(), w.buffer(), x.buffer(),
                                    c.node.saved[2].buffer(), x.rows(), n, x.cols(), j0);
  if (is_frozen_storage(w.dtype()) &&
      c.be.linear().gemm_rows_coop(frozen_format(w.dtype()), *c.seq, logits.buffer(), w.buffer(), x.buffer(), x.rows(),
                                   w.dim(0), j0, n, x.cols()))
    return;
  const uint32_t Tn = uint32_t(x.rows()), C = uint32_t(x.cols());
  tile_gemm_vk(c, ("linear_ce_logits_" + shader_suffix(w.dtype())).c_str(), logits, x,
               {Tn, uint32_t(n), 0, C, C, C, 0, uint32_t(j0), 0});
}

// dx[T, C] += d[T, n] · w[j0 : j0+n] (M = T, N = C, K = n): the format's tensor-core dx where it and the device
// have one, else the tiled FP32 kernel.
void tile_dx_vk(OpContext& c, const Tensor& d, int64_t j0, int64_t n) {
  const Tensor &x = c.in(0), &w = c.in(1);
  if (mixed_output(c))
    return c.be.linear().mixed_dx(frozen_format(w.dtype()), *c.seq, c.in_grad(0).buffer(), w.buffer(), d.buffer(),
                                  c.node.saved[2].buffer(), x.rows(), n, 0, x.cols(), j0, n, true);
  if (is_frozen_storage(w.dtype()) && c.node.saved.size() > 2 &&
      c.be.linear().dx_rows_coop(frozen_format(w.dtype()), *c.seq, c.in_grad(0).buffer(), w.buffer(), d.buffer(),
                                 c.node.saved[2].buffer(), x.rows(), w.dim(0), j0, n, x.cols()))
    return;
  const uint32_t Tn = uint32_t(x.rows()), C = uint32_t(x.cols());
  tile_gemm_vk(c, ("linear_ce_dx_" + shader_suffix(w.dtype())).c_str(), c.in_grad(0), d,
               {Tn, C, 0, uint32_t(n), uint32_t(n), C, 1, uint32_t(j0), 0});
}

void linear_ce_forward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? linear_ce_forward_cpu<double>(c) : linear_ce_forward_cpu<float>(c);
  const Tensor &labels = c.in(2), &stats = c.node.saved[0], &logits = c.node.saved[1];
  const int64_t Tn = c.in(0).rows(), V = c.in(1).dim(0), tile = tile_rows(c);
  for (int64_t j0 = 0; j0 < V; j0 += tile) {
    const int64_t n = std::min(tile, V - j0);
    tile_logits_vk(c, logits, j0, n);
    lse_tile_vk(c, stats, logits, labels, Tn, n, j0);
  }
  lse_finish_vk(c, stats, labels, Tn, V);
}

void linear_ce_backward(OpContext& c) {
  if (!c.needs_grad(0)) return;
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? linear_ce_backward_cpu<double>(c) : linear_ce_backward_cpu<float>(c);
  const Tensor &labels = c.in(2), &stats = c.node.saved[0], &logits = c.node.saved[1];
  const int64_t Tn = c.in(0).rows(), V = c.in(1).dim(0), tile = tile_rows(c);
  for (int64_t j0 = 0; j0 < V; j0 += tile) {
    const int64_t n = std::min(tile, V - j0);
    tile_logits_vk(c, logits, j0, n);
    softmax_grad_vk(c, logits, logits, false, labels, stats, Tn, n, j0, V);
    tile_dx_vk(c, logits, j0, n);
  }
}

const OpDef kEmbeddingOp{"embedding", embedding_shape, nullptr, embedding_forward, embedding_backward};
const OpDef kCrossEntropyOp{"cross_entropy", cross_entropy_shape, cross_entropy_prepare, cross_entropy_forward,
                            cross_entropy_backward};
const OpDef kLinearCrossEntropyOp{"linear_cross_entropy", linear_ce_shape, linear_ce_prepare, linear_ce_forward,
                                  linear_ce_backward};

// --- gradient-check cases ------------------------------------------------------------------------------------

void add_embedding_cases(std::vector<GradcheckCase>& out) {
  out.push_back({"embedding f32 table V=11 C=6, repeated ids", [](Graph& g, std::mt19937& r) {
                   Var table = random_param(g, r, {11, 6}, "table");
                   return embedding(table, ids_constant(g, {3, 0, 10, 3, 7, 3, 0}, "ids"));
                 }});
  // A Q4_0 table has no gradient: the row scale s is the parameter that reaches the loss through the lookup.
  out.push_back({"embedding q4_0 table V=9 C=64, times a parameter", [](Graph& g, std::mt19937& r) {
                   Var table = random_q4_0(g, r, 9, 64, "table");
                   Var s = random_param(g, r, {64}, "s");
                   return mul(embedding(table, ids_constant(g, {8, 1, 1, 4, 0}, "ids")), s);
                 }});
  out.push_back({"embedding q8_0 table V=9 C=64, times a parameter", [](Graph& g, std::mt19937& r) {
                   Var table = random_frozen(g, r, frozen_dtype(Format::Q8_0), 9, 64, "table");
                   Var s = random_param(g, r, {64}, "s");
                   return mul(embedding(table, ids_constant(g, {8, 1, 1, 4, 0}, "ids")), s);
                 }});
  out.push_back({"embedding q4_k table V=5 C=256, times a parameter", [](Graph& g, std::mt19937& r) {
                   Var table = random_frozen(g, r, frozen_dtype(Format::Q4_K), 5, 256, "table");
                   return mul(embedding(table, ids_constant(g, {4, 0, 2, 4}, "ids")),
                              random_param(g, r, {4, 256}, "s"));
                 }});
  out.push_back({"embedding q6_k table V=3 C=512, times a parameter", [](Graph& g, std::mt19937& r) {
                   Var table = random_frozen(g, r, frozen_dtype(Format::Q6_K), 3, 512, "table");
                   return mul(embedding(table, ids_constant(g, {2, 1, 2}, "ids")),
                              random_param(g, r, {3, 512}, "s"));
                 }});
  // An odd C: the GPU lookup reads halves one at a time, so any width works.
  out.push_back({"embedding f16 table V=7 C=13, times a parameter", [](Graph& g, std::mt19937& r) {
                   Var table = random_frozen(g, r, frozen_dtype(Format::F16), 7, 13, "table");
                   Var s = random_param(g, r, {13}, "s");
                   return mul(embedding(table, ids_constant(g, {6, 0, 3, 3}, "ids")), s);
                 }});
}

void add_linear_ce_cases(std::vector<GradcheckCase>& out) {
  out.push_back({"linear_cross_entropy q4_0 T=5 C=64 V=37 vocab_tile=10", [](Graph& g, std::mt19937& r) {
                   Var w = random_q4_0(g, r, 37, 64, "w");
                   Var x = random_param(g, r, {5, 64}, "x");
                   return linear_cross_entropy(x, w, ids_constant(g, {36, 5, -100, 5, 20}, "labels"), 10);
                 }});
  // On tensor cores where the device has them (T >= 32): the logits and dx of vocabulary windows that start off
  // a 32-row boundary (100, 200), the last one 21 rows.
  out.push_back({"linear_cross_entropy q4_0 T=40 C=96 V=221 vocab_tile=100 (tensor cores)", [](Graph& g, std::mt19937& r) {
                   Var w = random_q4_0(g, r, 221, 96, "w");
                   Var x = random_param(g, r, {40, 96}, "x");
                   std::vector<int32_t> labels;
                   for (int32_t t = 0; t < 40; ++t) labels.push_back(t % 7 == 3 ? -100 : (t * 37) % 221);
                   return linear_cross_entropy(x, w, ids_constant(g, labels, "labels"), 100);
                 }});
  out.push_back({"linear_cross_entropy q8_0 T=5 C=64 V=37 vocab_tile=10", [](Graph& g, std::mt19937& r) {
                   Var w = random_frozen(g, r, frozen_dtype(Format::Q8_0), 37, 64, "w");
                   Var x = random_param(g, r, {5, 64}, "x");
                   return linear_cross_entropy(x, w, ids_constant(g, {36, 5, -100, 5, 20}, "labels"), 10);
                 }});
  // K-quants: a vocab tile (10) that divides neither V nor the GEMM tile.
  out.push_back({"linear_cross_entropy q4_k T=5 C=256 V=37 vocab_tile=10", [](Graph& g, std::mt19937& r) {
                   Var w = random_frozen(g, r, frozen_dtype(Format::Q4_K), 37, 256, "w");
                   Var x = random_param(g, r, {5, 256}, "x");
                   return linear_cross_entropy(x, w, ids_constant(g, {36, 5, -100, 5, 20}, "labels"), 10);
                 }});
  // Mixed precision's output product (T >= 32): a Q4_K matrix in vocabulary tiles that end off a 32-row edge.
  out.push_back({"linear_cross_entropy q4_k T=33 C=256 V=75 vocab_tile=40", [](Graph& g, std::mt19937& r) {
                   Var w = random_frozen(g, r, frozen_dtype(Format::Q4_K), 75, 256, "w");
                   Var x = random_param(g, r, {33, 256}, "x");
                   std::vector<int32_t> labels;
                   for (int32_t t = 0; t < 33; ++t) labels.push_back(t % 5 == 1 ? -100 : (t * 7) % 75);
                   return linear_cross_entropy(x, w, ids_constant(g, labels, "labels"), 40);
                 }});
  out.push_back({"linear_cross_entropy q6_k T=3 C=512 V=21 vocab_tile=8", [](Graph& g, std::mt19937& r) {
                   Var w = random_frozen(g, r, frozen_dtype(Format::Q6_K), 21, 512, "w");
                   Var x = random_param(g, r, {3, 512}, "x");
                   return linear_cross_entropy(x, w, ids_constant(g, {20, 0, 7}, "labels"), 8);
                 }});
  out.push_back({"linear_cross_entropy f16 T=3 C=22 V=70 vocab_tile=65", [](Graph& g, std::mt19937& r) {
                   Var w = random_frozen(g, r, frozen_dtype(Format::F16), 70, 22, "w");
                   Var x = random_param(g, r, {3, 22}, "x");
                   return linear_cross_entropy(x, w, ids_constant(g, {69, 0, 64}, "labels"), 65);
                 }});
}

// The formats beyond those of the cases above, through the table: a lookup and a loss of rows of one or two blocks.
void add_other_format_cases(std::vector<GradcheckCase>& out) {
  for (const FormatTraits& f : format_table()) {
    const Format fm = f.format;
    if (fm == Format::Q4_0 || fm == Format::Q8_0 || fm == Format::Q4_K || fm == Format::Q6_K || fm == Format::F16)
      continue;
    const int64_t C = f.block_elems >= 256 ? 256 : 64;
    out.push_back({std::string("embedding ") + f.name + " table V=5 C=" + std::to_string(C) + ", times a parameter",
                   [fm, C](Graph& g, std::mt19937& r) {
                     Var table = random_frozen(g, r, frozen_dtype(fm), 5, C, "table");
                     return mul(embedding(table, ids_constant(g, {4, 0, 2, 4}, "ids")), random_param(g, r, {4, C}, "s"));
                   }});
    out.push_back({std::string("linear_cross_entropy ") + f.name + " T=5 C=" + std::to_string(2 * C) +
                       " V=37 vocab_tile=10",
                   [fm, C](Graph& g, std::mt19937& r) {
                     Var w = random_frozen(g, r, frozen_dtype(fm), 37, 2 * C, "w");
                     Var x = random_param(g, r, {5, 2 * C}, "x");
                     return linear_cross_entropy(x, w, ids_constant(g, {36, 5, -100, 5, 20}, "labels"), 10);
                   }});
  }
}

void add_cases(std::vector<GradcheckCase>& out) {
  add_embedding_cases(out);
  out.push_back({"cross_entropy T=6 V=13, one -100 label", [](Graph& g, std::mt19937& r) {
                   Var logits = random_param(g, r, {6, 13}, "logits", -3, 3);
                   return cross_entropy(logits, ids_constant(g, {4, -100, 12, 4, 0, 4}, "labels"));
                 }});
  add_linear_ce_cases(out);
  add_other_format_cases(out);
  out.push_back({"linear_cross_entropy f32 weight T=4 C=20 V=9 vocab_tile=4", [](Graph& g, std::mt19937& r) {
                   Var w = random_constant(g, r, {9, 20}, "w");
                   Var x = random_param(g, r, {4, 20}, "x");
                   return linear_cross_entropy(x, w, ids_constant(g, {8, 0, 3, 3}, "labels"), 4);
                 }});
}

const OpRegistration kRegistration({&kEmbeddingOp, &kCrossEntropyOp, &kLinearCrossEntropyOp}, add_cases);

}  // namespace

// A frozen table (any format of kernels/formats.h) is a constant; an f32 table may be a parameter (its rows get the
// scattered gradient).
Var embedding(Var table, Var ids) {
  const DType t = table.value().dtype();
  if (!is_frozen_storage(t) && t != table.g->backend().real())
    throw GraphError(std::string("embedding: table type ") + dtype_name(t) + " is not supported");
  return table.g->add(kEmbeddingOp, {table, ids});
}

Var cross_entropy(Var logits, Var labels) {
  if (!is_real(logits.value().dtype()))
    throw GraphError(std::string("cross_entropy: logits are ") + dtype_name(logits.value().dtype()) + ", not real");
  return logits.g->add(kCrossEntropyOp, {logits, labels});
}

Var linear_cross_entropy(Var x, Var w, Var labels, int64_t vocab_tile) {
  if (vocab_tile < 1)
    throw GraphError("linear_cross_entropy: vocab_tile must be at least 1, not " + std::to_string(vocab_tile));
  if (!is_real(x.value().dtype()))
    throw GraphError(std::string("linear_cross_entropy: x is ") + dtype_name(x.value().dtype()) + ", not real");
  const Node& wn = w.g->node(w.id);
  if (wn.requires_grad)
    throw GraphError("linear_cross_entropy: the weight " + (wn.name.empty() ? std::string("") : "'" + wn.name + "' ") +
                     "is trainable; the vocab-tiled loss takes a frozen output matrix (a format of kernels/formats.h or an "
                     "f32 constant)");
  const DType t = wn.value.dtype();
  if (!is_frozen_storage(t) && t != x.g->backend().real())
    throw GraphError(std::string("linear_cross_entropy: weight type ") + dtype_name(t) + " is not supported");
  if (is_frozen_storage(t) && !x.g->backend().is_cpu() &&
      wn.value.dim(1) % format_traits(frozen_format(t)).gpu_n_in_multiple != 0)
    throw GraphError(std::string("linear_cross_entropy: a ") + dtype_name(t) + " weight on Vulkan needs C a multiple "
                     "of " + std::to_string(format_traits(frozen_format(t)).gpu_n_in_multiple) + " (its kernels read "
                     "rows in whole units), not C = " + std::to_string(wn.value.dim(1)));
  return x.g->add(kLinearCrossEntropyOp, {x, w, labels}, LinearCrossEntropyParams{.vocab_tile = vocab_tile});
}

}  // namespace q4t::ag
