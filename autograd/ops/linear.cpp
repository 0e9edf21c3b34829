// linear (frozen weight, dx only) and matmul_nt (both operands differentiable).
#include <algorithm>
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

// The kernels of one frozen weight storage, on the CPU (f32) and on Vulkan.
struct FrozenKernels {
  decltype(&cpu::q4_0_gemm) cpu_gemm;
  decltype(&cpu::q4_0_dx) cpu_dx;
  decltype(&vk::LinearKernels::q4_0_gemm) vk_gemm;
  decltype(&vk::LinearKernels::q4_0_dx) vk_dx;
  decltype(&vk::LinearKernels::q4_0_dx_scratch_bytes) vk_dx_scratch_bytes;
};

// Null for a real (f32 or f64) weight.
const FrozenKernels* frozen_kernels(DType t) {
  using K = vk::LinearKernels;
  static const FrozenKernels q4_0{cpu::q4_0_gemm, cpu::q4_0_dx, &K::q4_0_gemm, &K::q4_0_dx,
                                  K::q4_0_dx_scratch_bytes};
  static const FrozenKernels q8_0{cpu::q8_0_gemm, cpu::q8_0_dx, &K::q8_0_gemm, &K::q8_0_dx,
                                  K::q8_0_dx_scratch_bytes};
  static const FrozenKernels f16{cpu::f16_gemm, cpu::f16_dx, &K::f16_gemm, &K::f16_dx, K::f16_dx_scratch_bytes};
  static const FrozenKernels q4_k{cpu::q4_k_gemm, cpu::q4_k_dx, &K::q4_k_gemm, &K::q4_k_dx,
                                  K::q4_k_dx_scratch_bytes};
  static const FrozenKernels q6_k{cpu::q6_k_gemm, cpu::q6_k_dx, &K::q6_k_gemm, &K::q6_k_dx,
                                  K::q6_k_dx_scratch_bytes};
  switch (t) {
    case DType::Q4_0: return &q4_0;
    case DType::Q8_0: return &q8_0;
    case DType::F16: return &f16;
    case DType::Q4_K: return &q4_k;
    case DType::Q6_K: return &q6_k;
    default: return nullptr;
  }
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

void linear_forward(OpContext& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &y = c.node.value;
  const int64_t T_ = x.rows(), n_out = w.dim(0), n_in = w.dim(1);
  const FrozenKernels* k = frozen_kernels(w.dtype());
  if (!c.be.is_cpu()) {
    if (k) {
      const Tensor& scratch = c.node.saved.at(0);
      return (c.be.linear().*k->vk_gemm)(*c.seq, y.buffer(), w.buffer(), x.buffer(), T_, n_out, n_in,
                                         &scratch.buffer());
    }
    return c.be.linear().gemm_nt(*c.seq, y.buffer(), x.buffer(), w.buffer(), T_, n_out, n_in, false);
  }
  if (c.be.real() == DType::F64) return linear_forward_generic<double>(y, x, w);
  if (k) return k->cpu_gemm(f32_mut(y), byte_span(w), f32_span(x), T_, n_out, n_in);
  cpu::gemm_nt(f32_mut(y), f32_span(x), f32_span(w), T_, n_out, n_in, false);
}

void linear_backward(OpContext& c) {
  if (!c.needs_grad(0)) return;
  const Tensor &w = c.in(1), &dx = c.in_grad(0), &dy = c.node.grad;
  const int64_t T_ = dy.rows(), n_out = w.dim(0), n_in = w.dim(1);
  const FrozenKernels* k = frozen_kernels(w.dtype());
  if (!c.be.is_cpu()) {
    if (k) {
      const Tensor& scratch = c.node.saved.at(0);
      return (c.be.linear().*k->vk_dx)(*c.seq, dx.buffer(), w.buffer(), dy.buffer(), &scratch.buffer(), T_, n_out,
                                        n_in, 0, n_out, true);
    }
    return c.be.linear().gemm_nn(*c.seq, dx.buffer(), dy.buffer(), w.buffer(), T_, n_in, n_out, true);
  }
  if (c.be.real() == DType::F64) return linear_backward_generic<double>(dx, dy, w);
  if (k) return k->cpu_dx(f32_mut(dx), byte_span(w), f32_span(dy), T_, n_out, n_in, 0, n_out, true);
  cpu::gemm_nn(f32_mut(dx), f32_span(dy), f32_span(w), T_, n_in, n_out, true);
}

// The Vulkan dx of a frozen weight needs scratch for its row-chunk partial sums (one token) or for the slices of a
// small product split over many rows (several tokens; see LinearKernels::dx_gemm); the forward, for the slices of
// a product of few output tiles split over K (LinearKernels::gemm_scratch_bytes). For a Q4_0 W on the tensor
// cores, X and dY split once as well (forward_scratch_bytes, q4_0_dx_device_scratch_bytes). One scratch serves
// both passes.
void linear_prepare(OpContext& c) {
  const FrozenKernels* k = frozen_kernels(c.in(1).dtype());
  if (c.be.is_cpu() || !k) return;
  const int64_t T_ = c.in(0).rows(), n_out = c.in(1).dim(0), n_in = c.in(1).dim(1);
  const bool q4_0 = c.in(1).dtype() == DType::Q4_0;  // the tensor-core GEMMs' split activations
  const size_t fwd = q4_0 ? c.be.linear().forward_scratch_bytes(T_, n_out, n_in)
                          : vk::LinearKernels::gemm_scratch_bytes(T_, n_out, n_in);
  const size_t bwd = q4_0 ? c.be.linear().q4_0_dx_device_scratch_bytes(T_, n_out, n_in)
                          : k->vk_dx_scratch_bytes(T_, n_out, n_in);
  const size_t bytes = std::max(bwd, fwd);
  c.node.saved.push_back(c.scratch({int64_t(std::max<size_t>(bytes, 4) / 4)}, DType::F32, Scratch::Pass));
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

template <class T>
void matmul_forward_cpu(const Tensor& y, const Tensor& a, const Tensor& b) {
  const int64_t M = a.rows(), N = b.dim(0), K = a.cols();
  const T *pa = a.data<T>(), *pb = b.data<T>();
  T* py = y.data<T>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      T s = 0;
      for (int64_t k = 0; k < K; ++k) s += pa[m * K + k] * pb[n * K + k];
      py[m * N + n] = s;
    }
}

template <class T>
void matmul_backward_cpu(OpContext& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &dy = c.node.grad;
  const int64_t M = a.rows(), N = b.dim(0), K = a.cols();
  const T *pa = a.data<T>(), *pb = b.data<T>(), *pdy = dy.data<T>();
  if (c.needs_grad(0)) {  // da[M, K] += dy[M, N] · b[N, K]
    T* da = c.in_grad(0).data<T>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) da[m * K + k] += pdy[m * N + n] * pb[n * K + k];
  }
  if (c.needs_grad(1)) {  // db[N, K] += dyᵀ[N, M] · a[M, K]
    T* db = c.in_grad(1).data<T>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) db[n * K + k] += pdy[m * N + n] * pa[m * K + k];
  }
}

// Vulkan: one scratch for the split-K passes of the forward and backward products (LoRA's skinny sides), sized
// for the largest; the products run one after another, so they share it.
void matmul_prepare(OpContext& c) {
  if (c.be.is_cpu()) return;
  const int64_t M = c.in(0).rows(), N = c.in(1).dim(0), K = c.in(0).cols();
  size_t bytes = vk::LinearKernels::gemm_split_scratch_bytes(M, N, K);
  if (c.node.requires_grad) {
    if (c.needs_grad(0)) bytes = std::max(bytes, vk::LinearKernels::gemm_split_scratch_bytes(M, K, N));
    if (c.needs_grad(1)) bytes = std::max(bytes, vk::LinearKernels::gemm_split_scratch_bytes(N, K, M));
  }
  if (bytes > 0) c.node.saved.push_back(c.scratch({int64_t(bytes / 4)}, DType::F32, Scratch::Pass));
}

const vk::Buffer* split_scratch(const OpContext& c) {
  return c.node.saved.empty() ? nullptr : &c.node.saved.front().buffer();
}

void matmul_forward(OpContext& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &y = c.node.value;
  const int64_t M = a.rows(), N = b.dim(0), K = a.cols();
  if (!c.be.is_cpu())
    return c.be.linear().gemm_nt(*c.seq, y.buffer(), a.buffer(), b.buffer(), M, N, K, false, split_scratch(c));
  if (c.be.real() == DType::F64) return matmul_forward_cpu<double>(y, a, b);
  cpu::gemm_nt(f32_mut(y), f32_span(a), f32_span(b), M, N, K, false);
}

void matmul_backward(OpContext& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &dy = c.node.grad;
  const int64_t M = a.rows(), N = b.dim(0), K = a.cols();
  if (!c.be.is_cpu()) {
    if (c.needs_grad(0))
      c.be.linear().gemm_nn(*c.seq, c.in_grad(0).buffer(), dy.buffer(), b.buffer(), M, K, N, true, split_scratch(c));
    if (c.needs_grad(1))
      c.be.linear().gemm_tn(*c.seq, c.in_grad(1).buffer(), dy.buffer(), a.buffer(), N, K, M, true, split_scratch(c));
    return;
  }
  if (c.be.real() == DType::F64) return matmul_backward_cpu<double>(c);
  if (c.needs_grad(0)) cpu::gemm_nn(f32_mut(c.in_grad(0)), f32_span(dy), f32_span(b), M, K, N, true);
  if (c.needs_grad(1)) cpu::gemm_tn(f32_mut(c.in_grad(1)), f32_span(dy), f32_span(a), N, K, M, true);
}

const OpDef kLinearOp{"linear", linear_shape, linear_prepare, linear_forward, linear_backward, 1u << 1};  // dx = dy·W: W only
const OpDef kMatmulOp{"matmul_nt", matmul_shape, matmul_prepare, matmul_forward, matmul_backward, 0b11u};  // a, b

// x is the parameter: the frozen weight itself never has a gradient.
GradcheckCase linear_case(DType t, int64_t T, int64_t n_out, int64_t n_in) {
  return {std::string("linear ") + dtype_name(t) + " T=" + std::to_string(T) + " " + std::to_string(n_out) + "x" +
              std::to_string(n_in),
          [=](Graph& g, std::mt19937& r) {
            Var w = random_frozen(g, r, t, n_out, n_in, "w");
            return linear(random_param(g, r, {T, n_in}, "x"), w);
          }};
}

void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back(linear_case(DType::Q4_0, 1, 7, 64));
  out.push_back(linear_case(DType::Q4_0, 3, 65, 32));
  out.push_back(linear_case(DType::Q4_0, 17, 63, 96));
  out.push_back(linear_case(DType::Q8_0, 1, 7, 64));
  out.push_back(linear_case(DType::Q8_0, 17, 63, 96));
  out.push_back(linear_case(DType::Q4_K, 1, 7, 256));
  out.push_back(linear_case(DType::Q4_K, 17, 65, 512));
  out.push_back(linear_case(DType::Q6_K, 1, 5, 256));
  out.push_back(linear_case(DType::Q6_K, 3, 63, 512));
  // F16 takes any even n_in on Vulkan: 46 is neither a multiple of 4 nor of the GEMM tile.
  out.push_back(linear_case(DType::F16, 1, 9, 20));
  out.push_back(linear_case(DType::F16, 5, 33, 46));
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
}

const OpRegistration kRegistration({&kLinearOp, &kMatmulOp}, add_cases);

}  // namespace

Var linear(Var x, Var w) {
  const Node& wn = w.g->node(w.id);
  if (wn.requires_grad)
    throw GraphError("linear: the weight " + (wn.name.empty() ? std::string("") : "'" + wn.name + "' ") +
                     "is trainable; linear takes frozen weights (use matmul_nt for a trainable matrix)");
  const DType t = w.value().dtype();
  if (!frozen_kernels(t) && t != x.g->backend().real())
    throw GraphError(std::string("linear: weight type ") + dtype_name(t) +
                     " is not supported (q4_0, q8_0, q4_k, q6_k, f16, or the graph's real type)");
  if (t == DType::F16 && !x.g->backend().is_cpu() && w.value().dim(1) % 2 != 0)
    throw GraphError("linear: an f16 weight on Vulkan needs an even n_in (its kernels read halves in pairs), not "
                     "n_in = " + std::to_string(w.value().dim(1)));
  return x.g->add(kLinearOp, {x, w});
}

Var matmul_nt(Var a, Var b) { return a.g->add(kMatmulOp, {a, b}); }

}  // namespace q4t::ag
