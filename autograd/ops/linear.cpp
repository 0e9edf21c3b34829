// linear (frozen weight, dx only) and matmul_nt (both operands differentiable).
#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "kernels/cpu/linear.h"
#include "kernels/shapes.h"

namespace q4t::ag {

namespace {

// --- linear: y[T, n_out] = x[T, n_in] · Wᵀ, W frozen ---------------------------------------------------------

Shape linear_shape(const Graph& g, const Node& n) {
  const Tensor &x = g.node(n.inputs[0]).value, &w = g.node(n.inputs[1]).value;
  if (w.shape().size() != 2) throw GraphError("linear: weight must be a matrix [n_out, n_in], not " + shape_str(w.shape()));
  if (x.cols() != w.dim(1))
    throw GraphError("linear: x " + shape_str(x.shape()) + " has " + std::to_string(x.cols()) +
                     " columns, the weight " + shape_str(w.shape()) + " expects n_in = " + std::to_string(w.dim(1)));
  Shape out = x.shape();
  out.back() = w.dim(0);
  return out;
}

template <class T>
void linear_forward_generic(const Tensor& y, const Tensor& x, const Tensor& w) {
  const int64_t T_ = x.rows(), n_in = w.dim(1), n_out = w.dim(0);
  std::vector<T> row(size_t(w.dim(1)));
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for (int64_t j = 0; j < n_out; ++j) {
    matrix_row(row.data(), w, j);
    for (int64_t t = 0; t < T_; ++t) {
      T s = 0;
      for (int64_t i = 0; i < n_in; ++i) s += px[t * n_in + i] * row[size_t(i)];
      py[t * n_out + j] = s;
    }
  }
}

template <class T>
void linear_backward_generic(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const int64_t T_ = dy.rows(), n_in = w.dim(1), n_out = w.dim(0);
  std::vector<T> row(size_t(w.dim(1)));
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  for (int64_t j = 0; j < n_out; ++j) {
    matrix_row(row.data(), w, j);
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t i = 0; i < n_in; ++i) pdx[t * n_in + i] += pdy[t * n_out + j] * row[size_t(i)];
  }
}

std::span<const float> f32_span(const Tensor& t) { return {t.data<float>(), size_t(t.numel())}; }
std::span<float> f32_mut(const Tensor& t) { return {t.data<float>(), size_t(t.numel())}; }
std::span<const uint8_t> byte_span(const Tensor& t) { return {t.data<uint8_t>(), t.bytes()}; }

// y = x·Wᵀ and dx += dy·W for a frozen W; `scratch` (Vulkan, quantized W) as sized by frozen_scratch_bytes.
void frozen_forward(OpContext& c, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor* scratch) {
  const int64_t T_ = x.rows(), n_out = w.dim(0), n_in = w.dim(1);
  const bool frozen = is_frozen_storage(w.dtype());
  if (!c.be.is_cpu()) {
    if (frozen)
      return c.be.linear().gemm(frozen_format(w.dtype()), *c.seq, y.buffer(), w.buffer(), x.buffer(), T_, n_out,
                                n_in, &scratch->buffer());
    return c.be.linear().gemm_nt(*c.seq, y.buffer(), x.buffer(), w.buffer(), T_, n_out, n_in, false);
  }
  if (c.be.real() == DType::F64) return linear_forward_generic<double>(y, x, w);
  if (frozen)
    return cpu::frozen_gemm(frozen_format(w.dtype()), f32_mut(y), byte_span(w), f32_span(x), T_, n_out, n_in,
                            c.be.precision());
  cpu::gemm_nt(f32_mut(y), f32_span(x), f32_span(w), T_, n_out, n_in, false);
}

void frozen_backward(OpContext& c, const Tensor& dx, const Tensor& dy, const Tensor& w, const Tensor* scratch) {
  const int64_t T_ = dy.rows(), n_out = w.dim(0), n_in = w.dim(1);
  const bool frozen = is_frozen_storage(w.dtype());
  if (!c.be.is_cpu()) {
    if (frozen)
      return c.be.linear().dx(frozen_format(w.dtype()), *c.seq, dx.buffer(), w.buffer(), dy.buffer(),
                              &scratch->buffer(), T_, n_out, n_in, 0, n_out, true);
    return c.be.linear().gemm_nn(*c.seq, dx.buffer(), dy.buffer(), w.buffer(), T_, n_in, n_out, true);
  }
  if (c.be.real() == DType::F64) return linear_backward_generic<double>(dx, dy, w);
  if (frozen)
    return cpu::frozen_dx(frozen_format(w.dtype()), f32_mut(dx), byte_span(w), f32_span(dy), T_, n_out, n_in, 0,
                          n_out, true);
  cpu::gemm_nn(f32_mut(dx), f32_span(dy), f32_span(w), T_, n_in, n_out, true);
}

const Tensor* first_saved(const OpContext& c) { return c.node.saved.empty() ? nullptr : &c.node.saved.front(); }

void linear_forward(OpContext& c) { frozen_forward(c, c.node.value, c.in(0), c.in(1), first_saved(c)); }

void linear_backward(OpContext& c) {
  if (c.needs_grad(0)) frozen_backward(c, c.in_grad(0), c.node.grad, c.in(1), first_saved(c));
}

// The Vulkan products of a frozen weight need scratch: the row-chunk partial sums of the one-token dx, the slices
// of a product split over K, the split or f16 activations of the tensor-core and mixed paths
// (LinearKernels::frozen_scratch_bytes). One scratch serves both passes.
size_t frozen_scratch_bytes(OpContext& c, DType t, int64_t T_, int64_t n_out, int64_t n_in) {
  if (c.be.is_cpu() || !is_frozen_storage(t)) return 0;
  return std::max<size_t>(c.be.linear().frozen_scratch_bytes(frozen_format(t), T_, n_out, n_in), 4);
}

void linear_prepare(OpContext& c) {
  if (c.be.is_cpu() || !is_frozen_storage(c.in(1).dtype())) return;
  const size_t bytes = frozen_scratch_bytes(c, c.in(1).dtype(), c.in(0).rows(), c.in(1).dim(0), c.in(1).dim(1));
  c.node.saved.push_back(c.scratch({int64_t(bytes / 4)}, DType::F32, Scratch::Pass));
}

// --- matmul_nt: y[M, N] = a[M, K] · b[N, K]ᵀ ---------------------------------------------------------------

Shape matmul_shape(const Graph& g, const Node& n) {
  const Tensor &a = g.node(n.inputs[0]).value, &b = g.node(n.inputs[1]).value;
  if (b.shape().size() != 2 || a.cols() != b.cols())
    throw GraphError("matmul_nt: a " + shape_str(a.shape()) + " and b " + shape_str(b.shape()) +
                     " must share their last dimension, with b a matrix");
  Shape out = a.shape();
  out.back() = b.dim(0);
  return out;
}

// The f32 products of matmul_nt and of the LoRA term, on the graph's backend: C[M, N] (+)= alpha·op(A)·op(B) with
// NT: A[M, K]·B[N, K]ᵀ, NN: A[M, K]·B[K, N], TN: A[K, M]ᵀ·B[K, N]. On Vulkan `scratch` (or null) takes the
// slices of a product split over K (LinearKernels::gemm_split_scratch_bytes).
enum class Prod { NT, NN, TN };

template <class T>
void product_generic(Prod op, T* C, const T* A, const T* B, int64_t M, int64_t N, int64_t K, bool acc, T alpha) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      T s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += (op == Prod::TN ? A[k * M + m] : A[m * K + k]) * (op == Prod::NT ? B[n * K + k] : B[k * N + n]);
      C[m * N + n] = (acc ? C[m * N + n] : T(0)) + alpha * s;
    }
}

void product(OpContext& c, Prod op, const Tensor& C, const Tensor& A, const Tensor& B, int64_t M, int64_t N,
             int64_t K, bool acc, double alpha, const Tensor* scratch) {
  if (!c.be.is_cpu()) {
    auto& k = c.be.linear();
    const vk::Buffer* sb = scratch ? &scratch->buffer() : nullptr;
    const auto fn = op == Prod::NT ? &vk::LinearKernels::gemm_nt
                    : op == Prod::NN ? &vk::LinearKernels::gemm_nn : &vk::LinearKernels::gemm_tn;
    return (k.*fn)(*c.seq, C.buffer(), A.buffer(), B.buffer(), M, N, K, acc, sb, float(alpha));
  }
  if (c.be.real() == DType::F64)
    return product_generic<double>(op, C.data<double>(), A.data<double>(), B.data<double>(), M, N, K, acc, alpha);
  const auto fn = op == Prod::NT ? cpu::gemm_nt : op == Prod::NN ? cpu::gemm_nn : cpu::gemm_tn;
  fn(f32_mut(C), f32_span(A), f32_span(B), M, N, K, acc, float(alpha));
}

// The split-K scratch of products {M, N, K} (LoRA's skinny sides) on Vulkan: the products run one after
// another, so they share one, sized for the largest.
size_t split_scratch_bytes(const std::vector<std::array<int64_t, 3>>& products) {
  size_t bytes = 0;
  for (const auto& [M, N, K] : products) bytes = std::max(bytes, vk::LinearKernels::gemm_split_scratch_bytes(M, N, K));
  return bytes;
}

void matmul_prepare(OpContext& c) {
  if (c.be.is_cpu()) return;
  const int64_t M = c.in(0).rows(), N = c.in(1).dim(0), K = c.in(0).cols();
  std::vector<std::array<int64_t, 3>> products{{M, N, K}};
  if (c.node.requires_grad && c.needs_grad(0)) products.push_back({M, K, N});  // da = dy·b
  if (c.node.requires_grad && c.needs_grad(1)) products.push_back({N, K, M});  // db = dyᵀ·a
  const size_t bytes = split_scratch_bytes(products);
  if (bytes > 0) c.node.saved.push_back(c.scratch({int64_t(bytes / 4)}, DType::F32, Scratch::Pass));
}

void matmul_forward(OpContext& c) {
  const Tensor &a = c.in(0), &b = c.in(1);
  product(c, Prod::NT, c.node.value, a, b, a.rows(), b.dim(0), a.cols(), false, 1, first_saved(c));
}

void matmul_backward(OpContext& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &dy = c.node.grad;
  const int64_t M = a.rows(), N = b.dim(0), K = a.cols();
  if (c.needs_grad(0)) product(c, Prod::NN, c.in_grad(0), dy, b, M, K, N, true, 1, first_saved(c));  // da += dy·b
  if (c.needs_grad(1)) product(c, Prod::TN, c.in_grad(1), dy, a, N, K, M, true, 1, first_saved(c));  // db += dyᵀ·a
}

// --- lora_linear: y[T, n_out] = x·Wᵀ + scale·(xa·Aᵀ)·Bᵀ, W frozen ------------------------------------------
// Inputs: 0 x (the frozen product's), 1 W [n_out, n_in], 2 A [r, n_in], 3 B [n_out, r], 4 xa (the adapter's:
// x itself, or x after dropout while the frozen product reads x rounded as llama.cpp does). Parameters: LoraParams.
// One node for what linear, two matmul_nt, scale and add would do: the adapter's term is added into y in place,
// and the backward gives no gradient to either term on its own. Saved: hs = scale·xa·Aᵀ [T, r] (for dB = dyᵀ·hs);
// dh [T, r] (the backward's scale·dy·B); on Vulkan a pass scratch per product (LoraScratch, below).
struct LoraParams {
  double scale;
};
struct LoraDims {
  int64_t T, n_out, n_in, r;
};
LoraDims lora_dims(const Tensor& x, const Tensor& w, const Tensor& a) { return {x.rows(), w.dim(0), w.dim(1), a.dim(0)}; }

Shape lora_shape(const Graph& g, const Node& n) {
  const Shape out = linear_shape(g, n);
  const Tensor &x = g.node(n.inputs[0]).value, &w = g.node(n.inputs[1]).value;
  const Tensor &a = g.node(n.inputs[2]).value, &b = g.node(n.inputs[3]).value, &xa = g.node(n.inputs[4]).value;
  const int64_t n_out = w.dim(0), n_in = w.dim(1);
  if (a.shape().size() != 2 || a.dim(1) != n_in || b.shape().size() != 2 || b.dim(0) != n_out ||
      b.dim(1) != a.dim(0))
    throw GraphError("lora_linear: A " + shape_str(a.shape()) + " and B " + shape_str(b.shape()) +
                     " do not fit the weight " + shape_str(w.shape()) + " (want A [r, n_in], B [n_out, r])");
  if (xa.shape() != x.shape())
    throw GraphError("lora_linear: the adapter's input " + shape_str(xa.shape()) + " differs from x " +
                     shape_str(x.shape()));
  return out;
}

// Saved beyond hs and dh (Vulkan): a pass scratch for the frozen product, then one per adapter product that
// splits over K (LinearKernels::gemm_split_scratch_bytes), in the order of LoraScratch. Products with scratch
// of their own do not wait for each other's (Sequence orders commands by the bytes they share).
enum LoraScratch { kFrozenScratch, kHsScratch, kYScratch, kDbScratch, kDhScratch, kDaScratch, kDxaScratch, kLoraScratches };

// The adapter's products on Vulkan: the rank-side kernels (LinearKernels::lora_*) up to their largest rank, else the
// tiled f32 GEMMs.
bool lora_kernels(const OpContext& c, int64_t r) { return !c.be.is_cpu() && r <= vk::LinearKernels::kLoraMaxRank; }

void lora_prepare(OpContext& c) {
  const auto [T_, n_out, n_in, r] = lora_dims(c.in(0), c.in(1), c.in(2));
  const bool grads = c.node.requires_grad && (c.needs_grad(2) || c.needs_grad(4));
  c.node.saved.push_back(c.scratch({T_, r}, c.be.real(), Scratch::Saved));
  c.node.saved.push_back(c.scratch({grads ? T_ : 1, r}, c.be.real(), Scratch::Pass));
  if (c.be.is_cpu()) return;
  const bool db = c.node.requires_grad && c.needs_grad(3);
  // Per LoraScratch: the product (M, N, K) it serves, or none (M = 0).
  const std::array<std::array<int64_t, 3>, kLoraScratches> products{{{0, 0, 0},
                                                                      {T_, r, n_in},
                                                                      {T_, n_out, r},
                                                                      {db ? n_out : 0, r, T_},
                                                                      {grads ? T_ : 0, r, n_out},
                                                                      {grads ? r : 0, n_in, T_},
                                                                      {grads ? T_ : 0, n_in, r}}};
  const bool rank_kernels = lora_kernels(c, r);
  for (int k = 0; k < kLoraScratches; ++k) {
    const auto [M, N, K] = products[size_t(k)];
    size_t bytes = 0;
    if (k == kFrozenScratch) bytes = frozen_scratch_bytes(c, c.in(1).dtype(), T_, n_out, n_in);
    else if (M > 0 && !rank_kernels) bytes = vk::LinearKernels::gemm_split_scratch_bytes(M, N, K);
    else if (M > 0 && k == kHsScratch) bytes = vk::LinearKernels::lora_rows_scratch_bytes(T_, n_in, r);
    else if (M > 0 && k == kDhScratch) bytes = vk::LinearKernels::lora_rows_scratch_bytes(T_, n_out, r);
    else if (M > 0 && k == kDbScratch) bytes = vk::LinearKernels::lora_cols_scratch_bytes(T_, n_out, r);
    else if (M > 0 && k == kDaScratch) bytes = vk::LinearKernels::lora_cols_scratch_bytes(T_, n_in, r);
    c.node.saved.push_back(c.scratch({int64_t(std::max<size_t>(bytes, 4) / 4)}, DType::F32, Scratch::Pass));
  }
}

const Tensor* lora_scratch(const OpContext& c, LoraScratch k) {
  return c.node.saved.size() > 2 ? &c.node.saved[2 + size_t(k)] : nullptr;
}

void lora_forward(OpContext& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &a = c.in(2), &b = c.in(3), &xa = c.in(4), &y = c.node.value;
  const Tensor& hs = c.node.saved[0];
  const auto [T_, n_out, n_in, r] = lora_dims(x, w, a);
  const double scale = c.node.params_as<LoraParams>().scale;
  if (lora_kernels(c, r)) {
    auto& k = c.be.linear();
    k.lora_rows(*c.seq, hs.buffer(), xa.buffer(), a.buffer(), T_, n_in, n_in, r, false, false, float(scale),
                &lora_scratch(c, kHsScratch)->buffer());  // hs = s·xa·Aᵀ
    frozen_forward(c, y, x, w, lora_scratch(c, kFrozenScratch));
    k.lora_wide(*c.seq, y.buffer(), hs.buffer(), b.buffer(), T_, n_out, r, false, true, 1.0f);  // y += hs·Bᵀ
    return;
  }
  // hs first: it does not wait for y, and y += hs·Bᵀ waits for both.
  product(c, Prod::NT, hs, xa, a, T_, r, n_in, false, scale, lora_scratch(c, kHsScratch));  // hs = scale·xa·Aᵀ
  // A format with a tensor-core GEMM adds hs·Bᵀ in its own pass, without reading and writing y again.
  if (!c.be.is_cpu() && is_frozen_storage(w.dtype()) &&
      c.be.linear().gemm_lora(frozen_format(w.dtype()), *c.seq, y.buffer(), w.buffer(), x.buffer(), T_, n_out, n_in,
                              &lora_scratch(c, kFrozenScratch)->buffer(), hs.buffer(), b.buffer(), r))
    return;
  frozen_forward(c, y, x, w, lora_scratch(c, kFrozenScratch));
  product(c, Prod::NT, y, hs, b, T_, n_out, r, true, 1, lora_scratch(c, kYScratch));  // y += hs·Bᵀ
}

void lora_backward(OpContext& c) {
  const Tensor &w = c.in(1), &a = c.in(2), &b = c.in(3), &xa = c.in(4), &dy = c.node.grad;
  const Tensor &hs = c.node.saved[0], &dh = c.node.saved[1];
  const auto [T_, n_out, n_in, r] = lora_dims(c.in(0), w, a);
  const bool adapter_input = c.needs_grad(2) || c.needs_grad(4);
  const double scale = c.node.params_as<LoraParams>().scale;
  if (lora_kernels(c, r)) {
    auto& k = c.be.linear();
    if (adapter_input)  // dh = s·dy·B
      k.lora_rows(*c.seq, dh.buffer(), dy.buffer(), b.buffer(), T_, n_out, n_out, r, true, false, float(scale),
                  &lora_scratch(c, kDhScratch)->buffer());
    if (c.needs_grad(0)) frozen_backward(c, c.in_grad(0), dy, w, lora_scratch(c, kFrozenScratch));
    if (c.needs_grad(3))  // dB += dyᵀ·hs
      k.lora_cols(*c.seq, c.in_grad(3).buffer(), dy.buffer(), hs.buffer(), T_, n_out, n_out, r, false, true, 1.0f,
                  &lora_scratch(c, kDbScratch)->buffer());
    if (c.needs_grad(2))  // dA += dhᵀ·xa
      k.lora_cols(*c.seq, c.in_grad(2).buffer(), xa.buffer(), dh.buffer(), T_, n_in, n_in, r, true, true, 1.0f,
                  &lora_scratch(c, kDaScratch)->buffer());
    if (c.needs_grad(4))  // dxa += dh·A
      k.lora_wide(*c.seq, c.in_grad(4).buffer(), dh.buffer(), a.buffer(), T_, n_in, r, true, true, 1.0f);
    return;
  }
  if (adapter_input)  // dh = scale·dy·B
    product(c, Prod::NN, dh, dy, b, T_, r, n_out, false, scale, lora_scratch(c, kDhScratch));
  // Where the frozen product and the adapter read one input (no dropout, no rounding), a format with a
  // tensor-core dx adds dh·A into its dx in the same pass.
  const bool fused_dx = !c.be.is_cpu() && is_frozen_storage(w.dtype()) && c.node.inputs[0] == c.node.inputs[4] &&
                        c.needs_grad(0) && adapter_input &&
                        c.be.linear().dx_lora(frozen_format(w.dtype()), *c.seq, c.in_grad(0).buffer(), w.buffer(),
                                              dy.buffer(), &lora_scratch(c, kFrozenScratch)->buffer(), T_, n_out,
                                              n_in, dh.buffer(), a.buffer(), r);
  if (c.needs_grad(0) && !fused_dx) frozen_backward(c, c.in_grad(0), dy, w, lora_scratch(c, kFrozenScratch));
  if (c.needs_grad(3))  // dB += dyᵀ·hs
    product(c, Prod::TN, c.in_grad(3), dy, hs, n_out, r, T_, true, 1, lora_scratch(c, kDbScratch));
  if (!adapter_input) return;
  if (c.needs_grad(2))  // dA += dhᵀ·xa
    product(c, Prod::TN, c.in_grad(2), dh, xa, r, n_in, T_, true, 1, lora_scratch(c, kDaScratch));
  if (c.needs_grad(4) && !fused_dx)  // dxa += dh·A
    product(c, Prod::NN, c.in_grad(4), dh, a, T_, n_in, r, true, 1, lora_scratch(c, kDxaScratch));
}

const OpDef kLinearOp{"linear", linear_shape, linear_prepare, linear_forward, linear_backward, 1u << 1};  // dx = dy·W: W only
const OpDef kMatmulOp{"matmul_nt", matmul_shape, matmul_prepare, matmul_forward, matmul_backward, 0b11u};  // a, b
// The backward reads W, A, B and xa (and hs, saved), not x.
const OpDef kLoraOp{"lora_linear", lora_shape, lora_prepare, lora_forward, lora_backward, 0b11110u};

// x is the parameter: the frozen weight itself never has a gradient.
GradcheckCase linear_case(DType t, int64_t T, int64_t n_out, int64_t n_in) {
  return {std::string("linear ") + dtype_name(t) + " T=" + std::to_string(T) + " " + std::to_string(n_out) + "x" +
              std::to_string(n_in),
          [=](Graph& g, std::mt19937& r) {
            Var w = random_frozen(g, r, t, n_out, n_in, "w");
            return linear(random_param(g, r, {T, n_in}, "x"), w);
          }};
}

// x, A and B are parameters (W frozen); with two_inputs the adapter reads its own input xa (as after dropout),
// else x.
GradcheckCase lora_case(DType t, int64_t T, int64_t n_out, int64_t n_in, int64_t rank, bool two_inputs) {
  return {std::string("lora_linear ") + dtype_name(t) + " T=" + std::to_string(T) + " " + std::to_string(n_out) +
              "x" + std::to_string(n_in) + " r=" + std::to_string(rank) + (two_inputs ? " (own input)" : ""),
          [=](Graph& g, std::mt19937& r) {
            Var w = t == DType::F32 ? random_constant(g, r, {n_out, n_in}, "w") : random_frozen(g, r, t, n_out, n_in, "w");
            Var x = random_param(g, r, {T, n_in}, "x");
            Var xa = two_inputs ? random_param(g, r, {T, n_in}, "xa") : Var{};
            Var a = random_param(g, r, {rank, n_in}, "a", -0.5, 0.5), b = random_param(g, r, {n_out, rank}, "b", -0.5, 0.5);
            return lora_linear(x, w, a, b, 0.75, xa);
          }};
}

void add_cases(std::vector<GradcheckCase>& out) {
  // Every format of the table, on awkward shapes: rows of 1 and 2 whole blocks (F16 takes any even n_in on
  // Vulkan: 46 is neither a multiple of 4 nor of the GEMM tile), odd row counts.
  for (const FormatTraits& f : format_table()) {
    const int64_t unit = std::max(f.block_elems, f.gpu_n_in_multiple);
    const int64_t n1 = unit >= 256 ? 256 : unit >= 32 ? 64 : 20, n2 = unit >= 256 ? 512 : unit >= 32 ? 96 : 46;
    out.push_back(linear_case(frozen_dtype(f.format), 1, 7, n1));
    out.push_back(linear_case(frozen_dtype(f.format), 17, 63, n2));
  }
  out.push_back(linear_case(frozen_dtype(Format::Q4_0), 3, 65, 32));
  out.push_back({"linear f32 weight", [](Graph& g, std::mt19937& r) {
                   Var w = random_constant(g, r, {9, 20}, "w");
                   return linear(random_param(g, r, {3, 20}, "x"), w);
                 }});
  out.push_back({"matmul_nt", [](Graph& g, std::mt19937& r) {
                   return matmul_nt(random_param(g, r, {5, 19}, "a"), random_param(g, r, {7, 19}, "b"));
                 }});
  // Vulkan splits K of products with few output tiles: the forward here (K = 300 in 2 slices) ...
  out.push_back({"matmul_nt 40x300 16x300 (forward split over K)", [](Graph& g, std::mt19937& r) {
                   return matmul_nt(random_param(g, r, {40, 300}, "a"), random_param(g, r, {16, 300}, "b"));
                 }});
  // ... and both backward products here (da = dy·b and db = dyᵀ·a, each summing over 300).
  out.push_back({"matmul_nt 300x16 300x16 (backward split over K)", [](Graph& g, std::mt19937& r) {
                   return matmul_nt(random_param(g, r, {300, 16}, "a"), random_param(g, r, {300, 16}, "b"));
                 }});
  out.push_back(lora_case(frozen_dtype(Format::Q4_0), 1, 7, 64, 3, false));
  out.push_back(lora_case(frozen_dtype(Format::Q4_0), 17, 65, 96, 4, true));
  out.push_back(lora_case(frozen_dtype(Format::Q4_K), 3, 9, 256, 2, true));
  out.push_back(lora_case(frozen_dtype(Format::F16), 5, 33, 46, 5, false));
  out.push_back(lora_case(DType::F32, 3, 9, 20, 2, true));
  // On Vulkan the adapter's products split over K here: hs = xa·Aᵀ, dA = dhᵀ·xa, dB = dyᵀ·hs and
  // dh = dy·B over n_out (each sum over 256). On tensor cores the forward's hs·Bᵀ (rank 2, taken as 16) is added
  // by the frozen GEMM itself (LinearKernels::gemm_lora), and the backward's dh·A by the frozen dx (x is the
  // adapter's input too: LinearKernels::dx_lora).
  out.push_back(lora_case(frozen_dtype(Format::Q4_0), 256, 256, 256, 2, false));
  // Mixed precision runs the products of 32 tokens or more (gradcheck --precision mixed): every format, the K and
  // the output tiles cut by the shapes, an adapter reading its own input.
  for (const FormatTraits& f : format_table()) {
    const int64_t unit = std::max(f.block_elems, f.gpu_n_in_multiple);
    out.push_back(linear_case(frozen_dtype(f.format), 40, 70, unit >= 256 ? 512 : 96));
  }
  out.push_back(lora_case(frozen_dtype(Format::Q4_K), 40, 70, 256, 8, true));
  out.push_back(lora_case(frozen_dtype(Format::Q8_0), 64, 96, 64, 16, false));
}

const OpRegistration kRegistration({&kLinearOp, &kMatmulOp, &kLoraOp}, add_cases);

}  // namespace

namespace {
void check_frozen_weight(const char* op, Var x, Var w) {
  const Node& wn = w.g->node(w.id);
  if (wn.requires_grad)
    throw GraphError(std::string(op) + ": the weight " + (wn.name.empty() ? std::string("") : "'" + wn.name + "' ") +
                     "is trainable; " + op + " takes frozen weights (use matmul_nt for a trainable matrix)");
  const DType t = w.value().dtype();
  if (!is_frozen_storage(t) && t != x.g->backend().real())
    throw GraphError(std::string(op) + ": weight type " + dtype_name(t) +
                     " is not supported (a format of kernels/formats.h, or the graph's real type)");
  if (is_frozen_storage(t) && !x.g->backend().is_cpu() &&
      w.value().dim(1) % format_traits(frozen_format(t)).gpu_n_in_multiple != 0)
    throw GraphError(std::string(op) + ": a " + dtype_name(t) + " weight on Vulkan needs n_in a multiple of " +
                     std::to_string(format_traits(frozen_format(t)).gpu_n_in_multiple) + " (its kernels read rows " +
                     "in whole units), not n_in = " + std::to_string(w.value().dim(1)));
}
}  // namespace

Var linear(Var x, Var w) {
  check_frozen_weight("linear", x, w);
  return x.g->add(kLinearOp, {x, w});
}

Var matmul_nt(Var a, Var b) { return a.g->add(kMatmulOp, {a, b}); }

Var lora_linear(Var x, Var w, Var a, Var b, double scale, Var xa) {
  check_frozen_weight("lora_linear", x, w);
  return x.g->add(kLoraOp, {x, w, a, b, xa.g ? xa : x}, LoraParams{.scale = scale});
}

}  // namespace q4t::ag
