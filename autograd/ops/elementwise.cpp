// add, mul, scale: elementwise, with b either a's shape or one row [C] broadcast over a's rows; reshape and
// slice_cols: copies.
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"

namespace q4t::ag {

namespace {

enum EwOp : uint32_t { kAdd = 0, kMul = 1, kScale = 2, kAccScale = 3, kAccMul = 4 };
struct EwPush {
  uint32_t n, bn, op;
  float s;
};
struct ColSumPush {
  uint32_t rows, cols, op;
};

// The nodes' parameters (Node::params).
struct ScaleParams {
  double factor;
};
struct ReshapeParams {
  Shape shape;  // 1 to 5 dims
};
struct SliceColsParams {
  int64_t begin, n;  // columns begin .. begin + n - 1
};

Shape binary_shape(const char* op, const Graph& g, const Node& n) {
  const Shape& a = g.node(n.inputs[0]).value.shape();
  const Shape& b = g.node(n.inputs[1]).value.shape();
  const bool row = b.size() == 1 && b[0] == (a.empty() ? 1 : a.back());
  if (b != a && !row)
    throw GraphError(std::string(op) + ": b " + shape_str(b) + " must equal a " + shape_str(a) +
                     " or be one row [" + std::to_string(a.empty() ? 1 : a.back()) + "]");
  return a;
}
Shape add_shape(const Graph& g, const Node& n) { return binary_shape("add", g, n); }
Shape mul_shape(const Graph& g, const Node& n) { return binary_shape("mul", g, n); }
Shape scale_shape(const Graph& g, const Node& n) { return g.node(n.inputs[0]).value.shape(); }
Shape reshape_shape(const Graph& g, const Node& n) {
  const Shape& a = g.node(n.inputs[0]).value.shape();
  const Shape& out = n.params_as<ReshapeParams>().shape;
  if (numel(out) != numel(a)) throw GraphError("reshape: cannot view " + shape_str(a) + " as " + shape_str(out));
  return out;
}

Shape slice_cols_shape(const Graph& g, const Node& n) {
  const Shape& a = g.node(n.inputs[0]).value.shape();
  const auto [begin, count] = n.params_as<SliceColsParams>();
  if (a.size() != 2 || begin < 0 || count < 1 || begin + count > a[1])
    throw GraphError("slice_cols: columns " + std::to_string(begin) + " .. " + std::to_string(begin + count - 1) +
                     " are not inside x " + shape_str(a));
  return {a[0], count};
}

// --- CPU ---------------------------------------------------------------------------------------------------

// factor: kScale's (unused by kAdd and kMul).
template <class T>
void ew_forward_cpu(OpContext& c, EwOp op, double factor) {
  const Tensor &a = c.in(0), &y = c.node.value;
  const int64_t n = a.numel();
  T* py = y.data<T>();
  const T* pa = a.data<T>();
  if (op == kScale) {
    const T s = T(factor);
    for (int64_t i = 0; i < n; ++i) py[i] = s * pa[i];
    return;
  }
  const Tensor& b = c.in(1);
  const T* pb = b.data<T>();
  const int64_t bn = b.numel();
  for (int64_t i = 0; i < n; ++i) py[i] = op == kAdd ? pa[i] + pb[i % bn] : pa[i] * pb[i % bn];
}

// g_b += Σ over rows of (dy or dy * other), or elementwise when b is not broadcast.
template <class T>
void ew_backward_cpu(OpContext& c, EwOp op, double factor) {
  const T* dy = c.node.grad.data<T>();
  const int64_t n = c.node.value.numel();
  if (op == kScale) {
    T* da = c.in_grad(0).data<T>();
    const T s = T(factor);
    for (int64_t i = 0; i < n; ++i) da[i] += s * dy[i];
    return;
  }
  const T* pa = c.in(0).data<T>();
  const T* pb = c.in(1).data<T>();
  const int64_t bn = c.in(1).numel();
  if (c.needs_grad(0)) {
    T* da = c.in_grad(0).data<T>();
    for (int64_t i = 0; i < n; ++i) da[i] += op == kAdd ? dy[i] : dy[i] * pb[i % bn];
  }
  if (c.needs_grad(1)) {
    T* db = c.in_grad(1).data<T>();
    for (int64_t i = 0; i < n; ++i) db[i % bn] += op == kAdd ? dy[i] : dy[i] * pa[i];
  }
}

// --- Vulkan ------------------------------------------------------------------------------------------------

void ew_dispatch(OpContext& c, const Tensor& y, const Tensor& a, const Tensor* b, EwOp op, float s) {
  const Tensor& bb = b ? *b : a;
  // Whole vec4s where both lengths allow (elementwise.comp's VEC4): 4 values per invocation.
  const int64_t w = y.numel() % 4 == 0 && bb.numel() % 4 == 0 ? 4 : 1;
  EwPush push{uint32_t(y.numel() / w), uint32_t(bb.numel() / w), op, s};
  const auto& p = c.be.pipeline("elementwise", 3, sizeof(push), {w == 4 ? 1u : 0u});
  c.seq->dispatch(p, {&y.buffer(), &a.buffer(), &bb.buffer()}, push, groups_for(y.numel() / w, 256));
}

void ew_forward_vk(OpContext& c, EwOp op, double factor) {
  ew_dispatch(c, c.node.value, c.in(0), op == kScale ? nullptr : &c.in(1), op, float(factor));
}

void ew_backward_vk(OpContext& c, EwOp op, double factor) {
  const Tensor& dy = c.node.grad;
  if (op == kScale) return ew_dispatch(c, c.in_grad(0), dy, nullptr, kAccScale, float(factor));
  if (c.needs_grad(0)) {
    if (op == kAdd) ew_dispatch(c, c.in_grad(0), dy, nullptr, kAccScale, 1.0f);
    else ew_dispatch(c, c.in_grad(0), dy, &c.in(1), kAccMul, 0.0f);
  }
  if (!c.needs_grad(1)) return;
  const bool broadcast = c.in(1).numel() != dy.numel();
  if (!broadcast) {
    if (op == kAdd) ew_dispatch(c, c.in_grad(1), dy, nullptr, kAccScale, 1.0f);
    else ew_dispatch(c, c.in_grad(1), dy, &c.in(0), kAccMul, 0.0f);
    return;
  }
  ColSumPush push{uint32_t(dy.rows()), uint32_t(dy.cols()), op == kAdd ? 0u : 1u};
  const auto& p = c.be.pipeline("col_sum", 3, sizeof(push));
  c.seq->dispatch(p, {&c.in_grad(1).buffer(), &dy.buffer(), &c.in(0).buffer()}, push,
                  {ceil_div_u32(dy.cols(), 64), 1, 1});
}

void ew_forward_with(OpContext& c, EwOp op, double factor) {
  if (!c.be.is_cpu()) return ew_forward_vk(c, op, factor);
  c.be.real() == DType::F64 ? ew_forward_cpu<double>(c, op, factor) : ew_forward_cpu<float>(c, op, factor);
}
void ew_backward_with(OpContext& c, EwOp op, double factor) {
  if (!c.be.is_cpu()) return ew_backward_vk(c, op, factor);
  c.be.real() == DType::F64 ? ew_backward_cpu<double>(c, op, factor) : ew_backward_cpu<float>(c, op, factor);
}
template <EwOp op>
void ew_forward(OpContext& c) {
  ew_forward_with(c, op, 0.0);
}
template <EwOp op>
void ew_backward(OpContext& c) {
  ew_backward_with(c, op, 0.0);
}
void scale_forward(OpContext& c) { ew_forward_with(c, kScale, c.node.params_as<ScaleParams>().factor); }
void scale_backward(OpContext& c) { ew_backward_with(c, kScale, c.node.params_as<ScaleParams>().factor); }
// reshape: a copy with another shape (forward y = 1 * x, backward dx += dy); values keep their row-major order.
void reshape_forward(OpContext& c) { ew_forward_with(c, kScale, 1.0); }
void reshape_backward(OpContext& c) { ew_backward_with(c, kScale, 1.0); }

void check_real(const char* op, Var v) {
  if (!is_real(v.value().dtype()))
    throw GraphError(std::string(op) + ": input is " + dtype_name(v.value().dtype()) + ", not a real tensor");
}

// y = x[:, begin:begin+n], dx[:, begin:begin+n] += dy: a copy each way (slice_cols.comp).
template <class T>
void slice_cols_cpu(const Tensor& out, const Tensor& in, int64_t begin, int64_t n, bool backward) {
  const int64_t rows = backward ? in.rows() : out.rows(), cols = backward ? out.cols() : in.cols();
  const T* x = in.data<T>();
  T* y = out.data<T>();
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < n; ++c) {
      if (backward) y[t * cols + begin + c] += x[t * n + c];
      else y[t * n + c] = x[t * cols + begin + c];
    }
}

void slice_cols_run(OpContext& c, const Tensor& out, const Tensor& in, bool backward) {
  const auto [begin, n] = c.node.params_as<SliceColsParams>();
  if (c.be.is_cpu()) {
    if (c.be.real() == DType::F64) return slice_cols_cpu<double>(out, in, begin, n, backward);
    return slice_cols_cpu<float>(out, in, begin, n, backward);
  }
  const Tensor& wide = backward ? out : in;
  const struct { uint32_t rows, cols, begin, n, accumulate; } push{uint32_t(wide.rows()), uint32_t(wide.cols()),
                                                                   uint32_t(begin), uint32_t(n), backward ? 1u : 0u};
  c.seq->dispatch(c.be.pipeline("slice_cols", 2, sizeof(push)), {&out.buffer(), &in.buffer()}, push,
                  groups_for(wide.rows() * n, 256));
}
void slice_cols_forward(OpContext& c) { slice_cols_run(c, c.node.value, c.in(0), false); }
void slice_cols_backward(OpContext& c) { slice_cols_run(c, c.in_grad(0), c.node.grad, true); }

const OpDef kAddOp{"add", add_shape, nullptr, ew_forward<kAdd>, ew_backward<kAdd>, 0u};  // no values
const OpDef kMulOp{"mul", mul_shape, nullptr, ew_forward<kMul>, ew_backward<kMul>, 0b11u};  // a, b
const OpDef kScaleOp{"scale", scale_shape, nullptr, scale_forward, scale_backward, 0u};
const OpDef kReshapeOp{"reshape", reshape_shape, nullptr, reshape_forward, reshape_backward, 0u};
const OpDef kSliceColsOp{"slice_cols", slice_cols_shape, nullptr, slice_cols_forward, slice_cols_backward, 0u};

void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back({"add", [](Graph& g, std::mt19937& r) {
                   return add(random_param(g, r, {5, 7}, "a"), random_param(g, r, {5, 7}, "b"));
                 }});
  out.push_back({"add (row broadcast)", [](Graph& g, std::mt19937& r) {
                   return add(random_param(g, r, {5, 7}, "a"), random_param(g, r, {7}, "b"));
                 }});
  // Lengths that are whole vec4s (the Vulkan kernels' 4-wide path), the others above and below.
  out.push_back({"add 6x10", [](Graph& g, std::mt19937& r) {
                   return add(random_param(g, r, {6, 10}, "a"), random_param(g, r, {6, 10}, "b"));
                 }});
  out.push_back({"add (row broadcast) 3x8", [](Graph& g, std::mt19937& r) {
                   return add(random_param(g, r, {3, 8}, "a"), random_param(g, r, {8}, "b"));
                 }});
  out.push_back({"mul", [](Graph& g, std::mt19937& r) {
                   return mul(random_param(g, r, {3, 65}, "a"), random_param(g, r, {3, 65}, "b"));
                 }});
  out.push_back({"mul (row broadcast)", [](Graph& g, std::mt19937& r) {
                   return mul(random_param(g, r, {17, 9}, "a"), random_param(g, r, {9}, "b"));
                 }});
  out.push_back({"scale", [](Graph& g, std::mt19937& r) { return scale(random_param(g, r, {4, 33}, "a"), -0.37); }});
  out.push_back({"reshape", [](Graph& g, std::mt19937& r) {
                   Var a = random_param(g, r, {4, 6}, "a");
                   return mul(reshape(a, {3, 8}), random_param(g, r, {8}, "b"));
                 }});
  // phi3's fused projections: q, k and v (or gate and up) as column ranges of one product, each used.
  out.push_back({"slice_cols (three ranges of one tensor)", [](Graph& g, std::mt19937& r) {
                   Var x = random_param(g, r, {5, 13}, "x");
                   Var q = slice_cols(x, 0, 6), k = slice_cols(x, 6, 4), v = slice_cols(x, 10, 3);
                   return add(mul(slice_cols(q, 1, 3), v), mul(slice_cols(k, 0, 3), slice_cols(x, 2, 3)));
                 }});
  out.push_back({"slice_cols (one column, last)", [](Graph& g, std::mt19937& r) {
                   return slice_cols(random_param(g, r, {7, 3}, "x"), 2, 1);
                 }});
  out.push_back({"add (same tensor twice)", [](Graph& g, std::mt19937& r) {
                   Var a = random_param(g, r, {3, 5}, "a");
                   return mul(a, add(a, a));
                 }});
}

const OpRegistration kRegistration({&kAddOp, &kMulOp, &kScaleOp, &kReshapeOp, &kSliceColsOp}, add_cases);

}  // namespace

Var add(Var a, Var b) {
  check_real("add", a), check_real("add", b);
  return a.g->add(kAddOp, {a, b});
}
Var mul(Var a, Var b) {
  check_real("mul", a), check_real("mul", b);
  return a.g->add(kMulOp, {a, b});
}
Var scale(Var a, double s) {
  check_real("scale", a);
  return a.g->add(kScaleOp, {a}, ScaleParams{.factor = s});
}

Var slice_cols(Var x, int64_t begin, int64_t n) {
  check_real("slice_cols", x);
  return x.g->add(kSliceColsOp, {x}, SliceColsParams{.begin = begin, .n = n});
}

Var reshape(Var a, const Shape& shape) {
  check_real("reshape", a);
  if (shape.empty() || shape.size() > 5) throw GraphError("reshape: 1 to 5 dimensions, not " + shape_str(shape));
  return a.g->add(kReshapeOp, {a}, ReshapeParams{.shape = shape});
}

}  // namespace q4t::ag
