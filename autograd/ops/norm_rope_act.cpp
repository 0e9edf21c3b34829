// rms_norm, rope, silu, swiglu, geglu, softcap and dropout: the row-wise and elementwise ops of a transformer block.
// Shapes: x [T, C] with T rows (tokens) of C channels; rope's x is [T, H*D] (H heads of head dim D).
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"

namespace q4t::ag {

namespace {

void check_real(const char* op, Var v) {
  if (!is_real(v.value().dtype()))
    throw GraphError(std::string(op) + ": input is " + dtype_name(v.value().dtype()) + ", not a real tensor");
}

// --- rms_norm: y[t, c] = x[t, c] * rstd[t] * w[c], rstd[t] = 1 / sqrt(mean_c x[t, c]² + eps) --------------
// saved[0] = rstd [T], written by the forward for the backward; on Vulkan with a trainable w, saved[1] = the dw
// scratch below.

struct RmsNormParams {
  double eps;
};
struct RmsNormPush {
  uint32_t rows, cols;
  float eps;
};
struct DwPush {
  uint32_t rows, cols, chunk_rows;
};

Shape rms_norm_shape(const Graph& g, const Node& n) {
  const Tensor &x = g.node(n.inputs[0]).value, &w = g.node(n.inputs[1]).value;
  if (w.shape() != Shape{x.cols()})
    throw GraphError("rms_norm: weight " + shape_str(w.shape()) + " must be one row [" + std::to_string(x.cols()) +
                     "] matching x " + shape_str(x.shape()));
  return x.shape();
}

// Vulkan sums dw in two passes: per-chunk column sums of kDwChunkRows rows into saved[1] [chunks, C], then the
// chunks in order (deterministic, parallel over chunks, and every loop short).
constexpr int64_t kDwChunkRows = 128;

void rms_norm_prepare(OpContext& c) {
  const int64_t rows = c.in(0).rows(), chunks = (rows + kDwChunkRows - 1) / kDwChunkRows;
  c.node.saved.push_back(c.scratch({rows}, c.be.real(), Scratch::Saved));
  if (c.be.is_cpu() || !c.needs_grad(1)) return;
  if (chunks > 65535)
    throw GraphError("rms_norm: " + std::to_string(rows) + " rows are too many for one Vulkan dispatch");
  c.node.saved.push_back(c.scratch({chunks, c.in(0).cols()}, DType::F32, Scratch::Pass));
}

template <class T>
void rms_norm_forward_cpu(OpContext& c) {
  const Tensor& x = c.in(0);
  const int64_t rows = x.rows(), C = x.cols();
  const T eps = T(c.node.params_as<RmsNormParams>().eps);
  const T *px = x.data<T>(), *pw = c.in(1).data<T>();
  T *py = c.node.value.data<T>(), *rstd = c.node.saved[0].data<T>();
  for (int64_t t = 0; t < rows; ++t) {
    const T* xr = px + t * C;
    T ss = 0;
    for (int64_t i = 0; i < C; ++i) ss += xr[i] * xr[i];
    const T r = T(1) / std::sqrt(ss / T(C) + eps);
    rstd[t] = r;
    for (int64_t i = 0; i < C; ++i) py[t * C + i] = xr[i] * r * pw[i];
  }
}

// With r = rstd[t] and y_c = x_c r w_c, and dr/dx_c = -r³ x_c / C:
//   dx_c += r w_c dy_c - x_c r³/C Σ_j dy_j w_j x_j,   dw_c += Σ_t dy[t, c] x[t, c] r[t].
template <class T>
void rms_norm_backward_cpu(OpContext& c) {
  const Tensor& x = c.in(0);
  const int64_t rows = x.rows(), C = x.cols();
  const T *px = x.data<T>(), *pw = c.in(1).data<T>(), *dy = c.node.grad.data<T>();
  const T* rstd = c.node.saved[0].data<T>();
  for (int64_t t = 0; t < rows; ++t) {
    const T *xr = px + t * C, *dyr = dy + t * C, r = rstd[t];
    if (c.needs_grad(0)) {
      T dot = 0;
      for (int64_t i = 0; i < C; ++i) dot += dyr[i] * pw[i] * xr[i];
      const T k = r * r * r * dot / T(C);
      T* dx = c.in_grad(0).data<T>() + t * C;
      for (int64_t i = 0; i < C; ++i) dx[i] += r * pw[i] * dyr[i] - k * xr[i];
    }
    if (c.needs_grad(1)) {
      T* dw = c.in_grad(1).data<T>();
      for (int64_t i = 0; i < C; ++i) dw[i] += dyr[i] * xr[i] * r;
    }
  }
}

// One workgroup per row for the forward and dx (a row reduction each); dw is a column sum in two passes.
void rms_norm_forward_vk(OpContext& c) {
  const Tensor& x = c.in(0);
  const RmsNormPush push{uint32_t(x.rows()), uint32_t(x.cols()), float(c.node.params_as<RmsNormParams>().eps)};
  const auto& p = c.be.pipeline("rms_norm_forward", 4, sizeof(push));
  c.seq->dispatch(p, {&c.node.value.buffer(), &c.node.saved[0].buffer(), &x.buffer(), &c.in(1).buffer()}, push,
                  groups_for(x.rows(), 1));
}

void rms_norm_backward_vk(OpContext& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &dy = c.node.grad, &rstd = c.node.saved[0];
  const RmsNormPush push{uint32_t(x.rows()), uint32_t(x.cols()), float(c.node.params_as<RmsNormParams>().eps)};
  if (c.needs_grad(0)) {
    const auto& p = c.be.pipeline("rms_norm_backward_dx", 5, sizeof(push));
    c.seq->dispatch(p, {&c.in_grad(0).buffer(), &dy.buffer(), &x.buffer(), &w.buffer(), &rstd.buffer()}, push,
                    groups_for(x.rows(), 1));
  }
  if (!c.needs_grad(1)) return;
  if (c.node.saved.size() < 2)
    throw GraphError("rms_norm: the weight was made trainable after the norm was built; mark it first");
  const Tensor& partial = c.node.saved[1];
  const DwPush dw{uint32_t(x.rows()), uint32_t(x.cols()), uint32_t(kDwChunkRows)};
  c.seq->dispatch(c.be.pipeline("rms_norm_dw_partial", 4, sizeof(dw)),
                  {&partial.buffer(), &dy.buffer(), &x.buffer(), &rstd.buffer()}, dw,
                  {ceil_div_u32(x.cols(), 64), uint32_t(partial.dim(0)), 1});
  c.seq->dispatch(c.be.pipeline("rms_norm_dw_reduce", 2, sizeof(dw)), {&c.in_grad(1).buffer(), &partial.buffer()}, dw,
                  {ceil_div_u32(x.cols(), 64), 1, 1});
}

void rms_norm_forward(OpContext& c) {
  if (!c.be.is_cpu()) return rms_norm_forward_vk(c);
  c.be.real() == DType::F64 ? rms_norm_forward_cpu<double>(c) : rms_norm_forward_cpu<float>(c);
}
void rms_norm_backward(OpContext& c) {
  if (!c.be.is_cpu()) return rms_norm_backward_vk(c);
  c.be.real() == DType::F64 ? rms_norm_backward_cpu<double>(c) : rms_norm_backward_cpu<float>(c);
}

// --- rope: rotate pairs of each head of x [T, H*D] by theta_i = pos * freq[i], cos and sin times mscale ------
// Inputs: x, freqs [R/2] (a constant), and for rope_at start [1] i32. Token t sits at pos = pos_offset + t, or
// start[0] + t. Partial rotary (R < D): the first R dims of each head rotate (norm: pairs (2i, 2i+1), neox:
// (i, i + R/2)), the other D − R pass through.

struct RopeParams {
  int64_t n_head, head_dim;  // H, D
  RopeMode mode;
  int64_t pos_offset;  // rope: the position of token 0 (rope_at: 0, the position is start[0])
  double mscale;       // cos and sin are multiplied by it
};
struct RopePush {
  uint32_t n_pairs, n_head, head_dim, mode, pos_offset, has_start, n_rot;
  float mscale, sin_sign;
  uint32_t accumulate;
};

bool rope_has_start(const Node& n) { return n.inputs.size() == 3; }

Shape rope_shape(const Graph& g, const Node& n) {
  const char* op = rope_has_start(n) ? "rope_at" : "rope";
  const Tensor& x = g.node(n.inputs[0]).value;
  const Tensor& freqs = g.node(n.inputs[1]).value;
  const RopeParams& params = n.params_as<RopeParams>();
  const int64_t H = params.n_head, D = params.head_dim;
  const std::string dims = "n_head " + std::to_string(H) + ", head_dim " + std::to_string(D);
  if (!is_real(x.dtype())) throw GraphError(std::string(op) + ": x is " + dtype_name(x.dtype()) + ", not real");
  if (H <= 0 || D <= 0 || D % 2 != 0)
    throw GraphError(std::string(op) + ": " + dims + ": both must be positive and head_dim even (it rotates pairs)");
  if (x.shape().size() != 2 || x.cols() != H * D)
    throw GraphError(std::string(op) + ": x " + shape_str(x.shape()) + " must be [T, n_head * head_dim] = [T, " +
                     std::to_string(H * D) + "] for " + dims);
  if (!is_real(freqs.dtype()) || freqs.shape().size() != 1 || freqs.shape()[0] < 1 || freqs.shape()[0] > D / 2)
    throw GraphError(std::string(op) + ": freqs " + shape_str(freqs.shape()) + " must be real [rotated dims / 2], "
                     "at most [head_dim / 2] = [" + std::to_string(D / 2) + "]");
  if (params.pos_offset < 0)
    throw GraphError(std::string(op) + ": pos_offset " + std::to_string(params.pos_offset) + " must be non-negative");
  if (rope_has_start(n)) {
    const Tensor& start = g.node(n.inputs[2]).value;
    if (start.dtype() != DType::I32 || start.shape() != Shape{1})
      throw GraphError("rope_at: start must be an i32 tensor [1] (the position of the first new token), not " +
                       std::string(dtype_name(start.dtype())) + " " + shape_str(start.shape()));
  }
  return x.shape();
}

// out = mscale R(sign * theta) in, or out += it. The forward is sign +1; the backward is sign -1 with
// accumulate: the transpose of a scaled rotation is the same scale times its inverse. theta, sin and cos are
// computed in double for both T.
template <class T>
void rope_cpu(const Tensor& out, const Tensor& in, const Tensor& freqs, int64_t first_pos, const RopeParams& p,
              double sign, bool accumulate) {
  const int64_t H = p.n_head, D = p.head_dim, R = 2 * freqs.numel(), rows = in.rows();
  const bool norm = p.mode == RopeMode::Norm;
  const T* x = in.data<T>();
  const T* f = freqs.data<T>();
  T* y = out.data<T>();
  for (int64_t t = 0; t < rows; ++t) {
    const double pos = double(first_pos + t);
    for (int64_t i = 0; i < R / 2; ++i) {
      const double theta = pos * double(f[i]);
      const T cs = T(p.mscale * std::cos(theta)), sn = T(p.mscale * sign * std::sin(theta));
      for (int64_t h = 0; h < H; ++h) {
        const int64_t ia = (t * H + h) * D + (norm ? 2 * i : i), ib = ia + (norm ? 1 : R / 2);
        const T a = x[ia], b = x[ib];
        const T ya = a * cs - b * sn, yb = a * sn + b * cs;
        y[ia] = accumulate ? y[ia] + ya : ya;
        y[ib] = accumulate ? y[ib] + yb : yb;
      }
    }
    for (int64_t h = 0; h < H; ++h)  // the dims past the rotated ones pass through
      for (int64_t d = R; d < D; ++d) {
        const int64_t k = (t * H + h) * D + d;
        y[k] = accumulate ? y[k] + x[k] : x[k];
      }
  }
}

void rope_run(OpContext& c, const Tensor& out, const Tensor& in, double sign, bool accumulate) {
  const RopeParams& p = c.node.params_as<RopeParams>();
  const bool has_start = rope_has_start(c.node);
  if (c.be.is_cpu()) {
    int64_t first = p.pos_offset;
    if (has_start) {
      first = c.in(2).data<int32_t>()[0];
      if (first < 0)
        throw std::out_of_range("rope_at: tokens at positions " + std::to_string(first) + " .. " +
                                std::to_string(first + in.rows() - 1) + " (a position must be non-negative)");
    }
    if (c.be.real() == DType::F64) return rope_cpu<double>(out, in, c.in(1), first, p, sign, accumulate);
    return rope_cpu<float>(out, in, c.in(1), first, p, sign, accumulate);
  }
  const RopePush push{uint32_t(in.numel() / 2), uint32_t(p.n_head), uint32_t(p.head_dim), uint32_t(p.mode),
                      uint32_t(p.pos_offset), has_start ? 1u : 0u, uint32_t(2 * c.in(1).numel()), float(p.mscale),
                      float(sign), accumulate ? 1u : 0u};
  const auto& pl = c.be.pipeline("rope_rotate", 4, sizeof(push));
  const vk::Buffer& start = has_start ? c.in(2).buffer() : c.in(1).buffer();  // unread without a start
  c.seq->dispatch(pl, {&out.buffer(), &in.buffer(), &c.in(1).buffer(), &start}, push, groups_for(in.numel() / 2, 256));
}

void rope_forward(OpContext& c) { rope_run(c, c.node.value, c.in(0), 1.0, false); }
void rope_backward(OpContext& c) {
  if (c.needs_grad(0)) rope_run(c, c.in_grad(0), c.node.grad, -1.0, true);
}

// --- activations f and their gated forms f(gate) * up: silu and swiglu, gelu (tanh) and geglu, softcap --------
// silu(x) = x s with s = sigmoid(x), silu' = s (1 + x (1 - s)).
// gelu(x) = x (1 + t) / 2 with t = tanh(k (x + 0.044715 x³)), k = sqrt(2/π) (the tanh approximation gemma uses);
// gelu' = (1 + t) / 2 + x (1 − t²) k (1 + 3·0.044715 x²) / 2.
// softcap(x) = cap·tanh(x / cap) (SoftcapParams), softcap' = 1 − tanh²(x / cap).

enum Activation : uint32_t { kSilu = 0, kGelu = 1, kSoftcap = 2 };
enum ActStep : uint32_t { kActForward = 0, kGatedForward = 1, kActBackward = 2, kGatedDGate = 3, kGatedDUp = 4 };
struct SoftcapParams {
  double cap;
};
struct ActPush {
  uint32_t n, step, act;
  float cap;
};

Shape act_shape(const Graph& g, const Node& n) { return g.node(n.inputs[0]).value.shape(); }
Shape gated_shape(const Graph& g, const Node& n) {
  const Shape &gate = g.node(n.inputs[0]).value.shape(), &up = g.node(n.inputs[1]).value.shape();
  if (gate != up)
    throw GraphError(std::string(n.op->name) + ": gate " + shape_str(gate) + " and up " + shape_str(up) +
                     " must have one shape");
  return gate;
}

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/π)
constexpr double kGeluC = 0.044715;

template <class T>
T act_value(Activation act, T x, double cap) {
  switch (act) {
    case kSilu: return x / (T(1) + std::exp(-x));
    case kGelu: return T(0.5) * x * (T(1) + std::tanh(T(kGeluK) * (x + T(kGeluC) * x * x * x)));
    case kSoftcap: return T(cap) * std::tanh(x / T(cap));
  }
  return x;
}
template <class T>
T act_grad(Activation act, T x, double cap) {
  switch (act) {
    case kSilu: {
      const T s = T(1) / (T(1) + std::exp(-x));
      return s * (T(1) + x * (T(1) - s));
    }
    case kGelu: {
      const T t = std::tanh(T(kGeluK) * (x + T(kGeluC) * x * x * x));
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(kGeluK) * (T(1) + T(3 * kGeluC) * x * x);
    }
    case kSoftcap: {
      const T t = std::tanh(x / T(cap));
      return T(1) - t * t;
    }
  }
  return T(1);
}

// One loop for every step: a = x or gate, b = up, dy = the output gradient (unused inputs may be null).
template <class T>
void act_cpu(Activation act, double cap, ActStep step, const Tensor& out, const Tensor& a, const Tensor* b,
             const Tensor* dy) {
  const int64_t n = a.numel();
  const T *pa = a.data<T>(), *pb = b ? b->data<T>() : nullptr, *pdy = dy ? dy->data<T>() : nullptr;
  T* o = out.data<T>();
  for (int64_t i = 0; i < n; ++i) {
    switch (step) {
      case kActForward: o[i] = act_value(act, pa[i], cap); break;
      case kGatedForward: o[i] = act_value(act, pa[i], cap) * pb[i]; break;
      case kActBackward: o[i] += pdy[i] * act_grad(act, pa[i], cap); break;
      case kGatedDGate: o[i] += pdy[i] * act_grad(act, pa[i], cap) * pb[i]; break;
      case kGatedDUp: o[i] += pdy[i] * act_value(act, pa[i], cap); break;
    }
  }
}

// Vulkan binds 4 buffers (out, a, b, dy); an unused slot is bound to a.
void act_run(OpContext& c, Activation act, ActStep step, const Tensor& out, const Tensor& a, const Tensor* b,
             const Tensor* dy) {
  const double cap = act == kSoftcap ? c.node.params_as<SoftcapParams>().cap : 0.0;  // 0: unused
  if (c.be.is_cpu()) {
    if (c.be.real() == DType::F64) return act_cpu<double>(act, cap, step, out, a, b, dy);
    return act_cpu<float>(act, cap, step, out, a, b, dy);
  }
  const int64_t w = a.numel() % 4 == 0 ? 4 : 1;  // whole vec4s (activation.comp's VEC4) where the length allows
  const ActPush push{uint32_t(a.numel() / w), step, act, float(cap)};
  const auto& p = c.be.pipeline("activation", 4, sizeof(push), {w == 4 ? 1u : 0u});
  c.seq->dispatch(p, {&out.buffer(), &a.buffer(), &(b ? *b : a).buffer(), &(dy ? *dy : a).buffer()}, push,
                  groups_for(a.numel() / w, 256));
}

template <Activation A>
void act_forward(OpContext& c) {
  act_run(c, A, kActForward, c.node.value, c.in(0), nullptr, nullptr);
}
template <Activation A>
void act_backward(OpContext& c) {
  act_run(c, A, kActBackward, c.in_grad(0), c.in(0), nullptr, &c.node.grad);
}
template <Activation A>
void gated_forward(OpContext& c) {
  act_run(c, A, kGatedForward, c.node.value, c.in(0), &c.in(1), nullptr);
}
template <Activation A>
void gated_backward(OpContext& c) {
  if (c.needs_grad(0)) act_run(c, A, kGatedDGate, c.in_grad(0), c.in(0), &c.in(1), &c.node.grad);
  if (c.needs_grad(1)) act_run(c, A, kGatedDUp, c.in_grad(1), c.in(0), nullptr, &c.node.grad);
}

// --- dropout: y = x * mask / (1 - p), the mask drawn from (seed, element index) ------------------------------
// Parameters: DropoutParams; input 1, when present, is the salt. The mask is recomputed in the backward, never
// stored. Element i is kept iff u_i >= p, u_i = (hash(i) >> 8) / 2^24 in [0, 1); the comparison
// is done on integers against ceil(p * 2^24), so the CPU and the GPU draw the same mask bit for bit. A salt (i32
// [2], read when the op runs) re-keys the hash: k1' = pcg(k1 ^ salt[0]), k2' = pcg(k2 ^ salt[1]); a trainer
// rewrites it before each micro-batch, so a graph recorded once still draws a new mask every step.

// PCG output permutation of a 32-bit value (Jarzynski & Olano, "Hash Functions for GPU Rendering", 2020);
// dropout_apply.comp computes the same function.
uint32_t pcg_hash(uint32_t v) {
  const uint32_t state = v * 747796405u + 2891336453u;
  const uint32_t word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

struct DropoutParams {
  double p;  // the probability of dropping an element
  uint64_t seed;
};

// The per-graph constants of the mask: two 32-bit keys mixed from both halves of the seed, the integer
// threshold, and the inverted-dropout scale. hash(i) = pcg(pcg(i + k1) ^ k2).
struct DropoutMask {
  uint32_t k1, k2, threshold;
  double scale;
  explicit DropoutMask(const DropoutParams& d) {
    k1 = pcg_hash(uint32_t(d.seed));
    k2 = pcg_hash(uint32_t(d.seed >> 32) ^ k1);
    threshold = uint32_t(std::ceil(d.p * 16777216.0));
    scale = 1.0 / (1.0 - d.p);
  }
  void salt(const int32_t* s) { k1 = pcg_hash(k1 ^ uint32_t(s[0])), k2 = pcg_hash(k2 ^ uint32_t(s[1])); }
  bool keep(uint32_t i) const { return (pcg_hash(pcg_hash(i + k1) ^ k2) >> 8u) >= threshold; }
};

struct DropoutPush {
  uint32_t n, threshold, k1, k2;
  float scale;
  uint32_t accumulate, salted;
};

Shape dropout_shape(const Graph& g, const Node& n) {
  const Tensor& x = g.node(n.inputs[0]).value;
  if (n.inputs.size() > 1) {
    const Tensor& s = g.node(n.inputs[1]).value;
    if (s.dtype() != DType::I32 || s.numel() != 2)
      throw GraphError("dropout: the salt must be an i32 tensor of 2 values, not " + std::string(dtype_name(s.dtype())) +
                       " " + shape_str(s.shape()));
  }
  if (x.numel() > int64_t(std::numeric_limits<uint32_t>::max()))
    throw GraphError("dropout: x " + shape_str(x.shape()) + " has more elements than a 32-bit mask index reaches");
  return x.shape();
}

// out = in * mask * scale, or out += it (the backward, with in = dy).
template <class T>
void dropout_cpu(const Tensor& out, const Tensor& in, const DropoutMask& m, bool accumulate) {
  const T* x = in.data<T>();
  T* y = out.data<T>();
  const T scale = T(m.scale);
  for (int64_t i = 0; i < in.numel(); ++i) {
    const T v = m.keep(uint32_t(i)) ? x[i] * scale : T(0);
    y[i] = accumulate ? y[i] + v : v;
  }
}

void dropout_run(OpContext& c, const Tensor& out, const Tensor& in, bool accumulate) {
  DropoutMask m(c.node.params_as<DropoutParams>());
  const bool salted = c.node.inputs.size() > 1;
  if (c.be.is_cpu()) {
    if (salted) m.salt(c.in(1).data<int32_t>());
    if (c.be.real() == DType::F64) return dropout_cpu<double>(out, in, m, accumulate);
    return dropout_cpu<float>(out, in, m, accumulate);
  }
  // Unsalted, the input is bound as the (unread) salt buffer too.
  const DropoutPush push{uint32_t(in.numel()), m.threshold, m.k1,          m.k2, float(m.scale),
                         accumulate ? 1u : 0u, salted ? 1u : 0u};
  const auto& p = c.be.pipeline("dropout_apply", 3, sizeof(push));
  const vk::Buffer& salt = salted ? c.in(1).buffer() : in.buffer();
  c.seq->dispatch(p, {&out.buffer(), &in.buffer(), &salt}, push, groups_for(in.numel(), 256));
}

void dropout_forward(OpContext& c) { dropout_run(c, c.node.value, c.in(0), false); }
void dropout_backward(OpContext& c) { dropout_run(c, c.in_grad(0), c.node.grad, true); }

const OpDef kRmsNormOp{"rms_norm", rms_norm_shape, rms_norm_prepare, rms_norm_forward, rms_norm_backward, 0b11u};
// The backward rotates dy back: it reads the frequencies and the start, no values.
const OpDef kRopeOp{"rope", rope_shape, nullptr, rope_forward, rope_backward, 0b110u};
const OpDef kSiluOp{"silu", act_shape, nullptr, act_forward<kSilu>, act_backward<kSilu>, 0b1u};
const OpDef kSwigluOp{"swiglu", gated_shape, nullptr, gated_forward<kSilu>, gated_backward<kSilu>, 0b11u};
const OpDef kGegluOp{"geglu", gated_shape, nullptr, gated_forward<kGelu>, gated_backward<kGelu>, 0b11u};
const OpDef kSoftcapOp{"softcap", act_shape, nullptr, act_forward<kSoftcap>, act_backward<kSoftcap>, 0b1u};
const OpDef kDropoutOp{"dropout", dropout_shape, nullptr, dropout_forward, dropout_backward};

// --- gradient-check cases ------------------------------------------------------------------------------------

GradcheckCase rms_norm_case(int64_t T, int64_t C, bool train_weight) {
  return {"rms_norm T=" + std::to_string(T) + " C=" + std::to_string(C) + (train_weight ? "" : " (frozen weight)"),
          [=](Graph& g, std::mt19937& r) {
            Var x = random_param(g, r, {T, C}, "x");
            Var w = train_weight ? random_param(g, r, {C}, "w") : random_constant(g, r, {C}, "w");
            return rms_norm(x, w, 1e-5);
          }};
}

const char* mode_name(RopeMode mode) { return mode == RopeMode::Norm ? "norm" : "neox"; }

GradcheckCase rope_case(RopeMode mode, int64_t H, int64_t D, int64_t T, int64_t pos_offset) {
  return {std::string("rope ") + mode_name(mode) + " H=" + std::to_string(H) + " D=" + std::to_string(D) + " T=" +
              std::to_string(T) + " pos_offset=" + std::to_string(pos_offset),
          [=](Graph& g, std::mt19937& r) {
            return rope(random_param(g, r, {T, H * D}, "x"), H, D, mode, 10000.0, pos_offset);
          }};
}

// Scaled RoPE: a table unlike any base's (per-pair factors, a YaRN-like blend) and mscale != 1.
GradcheckCase scaled_rope_case(RopeMode mode, int64_t H, int64_t D, int64_t T, int64_t pos, bool at) {
  return {std::string(at ? "rope_at " : "rope ") + mode_name(mode) + " scaled H=" + std::to_string(H) + " D=" +
              std::to_string(D) + " T=" + std::to_string(T) + " pos=" + std::to_string(pos),
          [=](Graph& g, std::mt19937& r) {
            RopeFreqs f = RopeFreqs::plain(D, 500000.0);
            for (size_t i = 0; i < f.freq.size(); ++i) f.freq[i] /= 1.0 + 0.75 * double(i % 3);
            f.mscale = 1.1386;
            Var x = random_param(g, r, {T, H * D}, "x");
            if (at) return rope_at(x, ids_constant(g, {int32_t(pos)}, "start"), H, D, mode, f);
            return rope(x, H, D, mode, f, pos);
          }};
}

// Partial rotary (phi-4-mini): the first R of D dims rotate, the rest pass through.
GradcheckCase partial_rope_case(RopeMode mode, int64_t H, int64_t D, int64_t T, int64_t pos, int64_t R) {
  return {std::string("rope ") + mode_name(mode) + " partial R=" + std::to_string(R) + " H=" + std::to_string(H) +
              " D=" + std::to_string(D) + " T=" + std::to_string(T) + " pos=" + std::to_string(pos),
          [=](Graph& g, std::mt19937& r) {
            return rope(random_param(g, r, {T, H * D}, "x"), H, D, mode, RopeFreqs::plain(R, 10000.0), pos);
          }};
}

GradcheckCase rope_at_case(RopeMode mode, int64_t H, int64_t D, int64_t T, int32_t start) {
  return {std::string("rope_at ") + mode_name(mode) + " H=" + std::to_string(H) + " D=" + std::to_string(D) +
              " T=" + std::to_string(T) + " start=" + std::to_string(start),
          [=](Graph& g, std::mt19937& r) {
            Var x = random_param(g, r, {T, H * D}, "x");
            return rope_at(x, ids_constant(g, {start}, "start"), H, D, mode, 10000.0);
          }};
}

GradcheckCase dropout_case(int64_t T, int64_t C, double p, const char* p_text, bool salted = false) {
  return {"dropout p=" + std::string(p_text) + " " + std::to_string(T) + "x" + std::to_string(C) +
              (salted ? " salted" : ""),
          [=](Graph& g, std::mt19937& r) {
            Var x = random_param(g, r, {T, C}, "x");
            const uint64_t seed = 0x9e3779b97f4a7c15ull;  // both seed halves non-zero
            return salted ? dropout(x, p, seed, ids_constant(g, {-123456789, 987654321}, "salt"))
                          : dropout(x, p, seed);
          }};
}

void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back(rms_norm_case(5, 7, true));
  out.push_back(rms_norm_case(3, 33, true));
  out.push_back(rms_norm_case(2, 300, true));  // more columns than the 256 invocations of a workgroup
  out.push_back(rms_norm_case(4, 33, false));
  for (RopeMode mode : {RopeMode::Norm, RopeMode::Neox})
    for (int64_t pos : {0, 7}) out.push_back(rope_case(mode, 3, 8, 5, pos));
  out.push_back(rope_case(RopeMode::Neox, 2, 64, 3, 100));
  out.push_back(scaled_rope_case(RopeMode::Norm, 2, 8, 4, 3, false));
  out.push_back(scaled_rope_case(RopeMode::Neox, 3, 12, 3, 11, false));
  out.push_back(scaled_rope_case(RopeMode::Neox, 2, 8, 2, 5, true));
  out.push_back(partial_rope_case(RopeMode::Neox, 3, 16, 4, 9, 12));
  out.push_back(partial_rope_case(RopeMode::Norm, 2, 12, 3, 2, 8));
  out.push_back(rope_at_case(RopeMode::Norm, 3, 8, 5, 7));
  out.push_back(rope_at_case(RopeMode::Neox, 3, 8, 5, 0));
  out.push_back(rope_at_case(RopeMode::Neox, 2, 64, 1, 100));
  // x in [-4, 4] reaches both saturated ends of the sigmoid.
  out.push_back({"silu 5x33", [](Graph& g, std::mt19937& r) { return silu(random_param(g, r, {5, 33}, "x", -4, 4)); }});
  out.push_back({"geglu 5x7", [](Graph& g, std::mt19937& r) {
                   Var gate = random_param(g, r, {5, 7}, "gate", -4, 4);
                   return geglu(gate, random_param(g, r, {5, 7}, "up"));
                 }});
  // x in [-12, 12] with cap 5 reaches the flat ends of the tanh.
  out.push_back({"softcap 4x9 cap 5", [](Graph& g, std::mt19937& r) {
                   return softcap(random_param(g, r, {4, 9}, "x", -12, 12), 5.0);
                 }});
  out.push_back({"swiglu 5x7", [](Graph& g, std::mt19937& r) {
                   Var gate = random_param(g, r, {5, 7}, "gate", -4, 4);
                   return swiglu(gate, random_param(g, r, {5, 7}, "up"));
                 }});
  out.push_back({"swiglu 4x12", [](Graph& g, std::mt19937& r) {  // whole vec4s (the Vulkan kernel's 4-wide path)
                   Var gate = random_param(g, r, {4, 12}, "gate", -4, 4);
                   return swiglu(gate, random_param(g, r, {4, 12}, "up"));
                 }});
  out.push_back(dropout_case(5, 33, 0.3, "0.3"));
  out.push_back(dropout_case(7, 129, 0.3, "0.3"));
  out.push_back(dropout_case(3, 7, 0.0, "0 (identity)"));
  out.push_back(dropout_case(7, 129, 0.3, "0.3", true));
}

const OpRegistration kRegistration({&kRmsNormOp, &kRopeOp, &kSiluOp, &kSwigluOp, &kGegluOp, &kSoftcapOp, &kDropoutOp},
                                   add_cases);

}  // namespace

Var rms_norm(Var x, Var w, double eps) {
  check_real("rms_norm", x), check_real("rms_norm", w);
  if (!(eps >= 0)) throw GraphError("rms_norm: eps " + std::to_string(eps) + " must be non-negative");
  return x.g->add(kRmsNormOp, {x, w}, RmsNormParams{.eps = eps});
}

RopeFreqs RopeFreqs::plain(int64_t head_dim, double base) {
  RopeFreqs f;
  f.freq.resize(size_t(std::max<int64_t>(head_dim / 2, 0)));
  for (size_t i = 0; i < f.freq.size(); ++i) f.freq[i] = std::pow(base, -2.0 * double(i) / double(head_dim));
  return f;
}

namespace {
Var rope_node(const char* op, Var x, Var start, int64_t n_head, int64_t head_dim, RopeMode mode, const RopeFreqs& f,
              int64_t pos_offset) {
  check_real(op, x);
  if (mode != RopeMode::Norm && mode != RopeMode::Neox)
    throw GraphError(std::string(op) + ": unknown mode " + std::to_string(int64_t(mode)));
  if (!(f.mscale > 0) || !std::isfinite(f.mscale))
    throw GraphError(std::string(op) + ": mscale " + std::to_string(f.mscale) + " must be positive");
  for (double v : f.freq)
    if (!std::isfinite(v)) throw GraphError(std::string(op) + ": the frequencies must be finite");
  const RopeParams p{
      .n_head = n_head, .head_dim = head_dim, .mode = mode, .pos_offset = pos_offset, .mscale = f.mscale};
  Var freqs = x.g->constant(x.g->backend().from_host(std::span<const double>(f.freq), {int64_t(f.freq.size())}),
                            std::string(op) + ".freqs");
  if (!start.g) return x.g->add(kRopeOp, {x, freqs}, p);
  return x.g->add(kRopeOp, {x, freqs, start}, p);
}
}  // namespace

Var rope(Var x, int64_t n_head, int64_t head_dim, RopeMode mode, const RopeFreqs& f, int64_t pos_offset) {
  return rope_node("rope", x, {}, n_head, head_dim, mode, f, pos_offset);
}
Var rope(Var x, int64_t n_head, int64_t head_dim, RopeMode mode, double freq_base, int64_t pos_offset) {
  if (!(freq_base > 0)) throw GraphError("rope: freq_base " + std::to_string(freq_base) + " must be positive");
  return rope(x, n_head, head_dim, mode, RopeFreqs::plain(head_dim, freq_base), pos_offset);
}
Var rope_at(Var x, Var start, int64_t n_head, int64_t head_dim, RopeMode mode, const RopeFreqs& f) {
  return rope_node("rope_at", x, start, n_head, head_dim, mode, f, 0);
}
Var rope_at(Var x, Var start, int64_t n_head, int64_t head_dim, RopeMode mode, double freq_base) {
  if (!(freq_base > 0)) throw GraphError("rope_at: freq_base " + std::to_string(freq_base) + " must be positive");
  return rope_at(x, start, n_head, head_dim, mode, RopeFreqs::plain(head_dim, freq_base));
}

Var silu(Var x) {
  check_real("silu", x);
  return x.g->add(kSiluOp, {x});
}

Var swiglu(Var gate, Var up) {
  check_real("swiglu", gate), check_real("swiglu", up);
  return gate.g->add(kSwigluOp, {gate, up});
}

Var geglu(Var gate, Var up) {
  check_real("geglu", gate), check_real("geglu", up);
  return gate.g->add(kGegluOp, {gate, up});
}

Var softcap(Var x, double cap) {
  check_real("softcap", x);
  if (!(cap > 0) || !std::isfinite(cap)) throw GraphError("softcap: cap " + std::to_string(cap) + " must be positive");
  return x.g->add(kSoftcapOp, {x}, SoftcapParams{.cap = cap});
}

Var dropout(Var x, double p, uint64_t seed, Var salt) {
  check_real("dropout", x);
  if (!(p >= 0 && p < 1)) throw GraphError("dropout: p = " + std::to_string(p) + " must lie in [0, 1)");
  const DropoutParams params{.p = p, .seed = seed};
  if (!salt.g) return x.g->add(kDropoutOp, {x}, params);
  if (salt.g != x.g) throw GraphError("dropout: the salt belongs to another graph");
  return x.g->add(kDropoutOp, {x, salt}, params);
}

}  // namespace q4t::ag
