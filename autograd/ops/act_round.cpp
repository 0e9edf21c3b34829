// act_round_q8_0 / act_round_q8_k: activations rounded the way llama.cpp's CPU matmuls round them before a
// Q4_0/Q8_0 weight (GGML's Q8_0 activation blocks) or a Q4_K/Q6_K weight (Q8_K blocks). Used only to reproduce
// llama.cpp's logits exactly; training never uses them.
// The backward is the straight-through identity (dx += dy): the rounding is treated as exact.
#include <cmath>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"
#include "kernels/quant/f16.h"

namespace q4t::ag {

namespace {

struct ActRoundParams {
  int64_t block;  // values per rounding block: 32 (Q8_0) or 256 (Q8_K)
};

Shape act_round_shape(const Graph& g, const Node& n) {
  const Tensor& x = g.node(n.inputs[0]).value;
  const int64_t block = n.params_as<ActRoundParams>().block;
  if (x.cols() % block != 0)
    throw GraphError(std::string(n.op->name) + ": rows of " + std::to_string(x.cols()) + " values are not whole " +
                     std::to_string(block) + "-value blocks");
  return x.shape();
}

// d = amax/127, q = nearest-even(x/d), y = f16(d)·q, as GGML's x86 Q8_0 activation quantizer computes it.
template <class T>
void act_round_forward_cpu(OpContext& c) {
  const T* x = c.in(0).data<T>();
  T* y = c.node.value.data<T>();
  const int64_t n_blocks = c.in(0).numel() / 32;
  for (int64_t b = 0; b < n_blocks; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(float(x[b * 32 + i])));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const float dh = quant::f16_to_f32(quant::f32_to_f16(d));
    for (int i = 0; i < 32; ++i) y[b * 32 + i] = T(dh * std::nearbyint(float(x[b * 32 + i]) * id));
  }
}

// m = the value of largest |x| (the first on ties), s = -127/m, q = min(127, nearest-even(s·x)), y = (1/s)·q, as
// GGML's Q8_K activation quantizer computes it (the scale stays f32).
template <class T>
void act_round_k_forward_cpu(OpContext& c) {
  const T* x = c.in(0).data<T>();
  T* y = c.node.value.data<T>();
  const int64_t n_blocks = c.in(0).numel() / 256;
  for (int64_t b = 0; b < n_blocks; ++b) {
    float amax = 0, m = 0;
    for (int i = 0; i < 256; ++i) {
      const float v = float(x[b * 256 + i]);
      if (std::fabs(v) > amax) {
        amax = std::fabs(v);
        m = v;
      }
    }
    if (amax == 0.0f) {
      for (int i = 0; i < 256; ++i) y[b * 256 + i] = T(0);
      continue;
    }
    const float s = -127.0f / m, d = 1.0f / s;
    for (int i = 0; i < 256; ++i) y[b * 256 + i] = T(d * std::min(127.0f, std::nearbyint(s * float(x[b * 256 + i]))));
  }
}

template <class T>
void act_round_backward_cpu(OpContext& c) {
  const T* dy = c.node.grad.data<T>();
  T* dx = c.in_grad(0).data<T>();
  for (int64_t i = 0; i < c.node.value.numel(); ++i) dx[i] += dy[i];
}

struct RoundPush {
  uint32_t n_blocks;
};
struct CopyPush {
  uint32_t n, bn, op;
  float s;
};

void act_round_forward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? act_round_forward_cpu<double>(c) : act_round_forward_cpu<float>(c);
  RoundPush push{uint32_t(c.in(0).numel() / 32)};
  c.seq->dispatch(c.be.pipeline("act_round_q8_0", 2, sizeof(push)), {&c.node.value.buffer(), &c.in(0).buffer()}, push,
                  groups_for(push.n_blocks, 64));
}

void act_round_k_forward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? act_round_k_forward_cpu<double>(c) : act_round_k_forward_cpu<float>(c);
  RoundPush push{uint32_t(c.in(0).numel() / 256)};
  c.seq->dispatch(c.be.pipeline("act_round_q8_k", 2, sizeof(push)), {&c.node.value.buffer(), &c.in(0).buffer()}, push,
                  groups_for(push.n_blocks, 64));
}

void act_round_backward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? act_round_backward_cpu<double>(c) : act_round_backward_cpu<float>(c);
  CopyPush push{uint32_t(c.node.value.numel()), 1, 3, 1.0f};  // elementwise.comp op 3: y += s * a
  c.seq->dispatch(c.be.pipeline("elementwise", 3, sizeof(push)),
                  {&c.in_grad(0).buffer(), &c.node.grad.buffer(), &c.node.grad.buffer()}, push,
                  groups_for(push.n, 256));
}

const OpDef kActRoundOp{"act_round_q8_0", act_round_shape, nullptr, act_round_forward, act_round_backward};
const OpDef kActRoundKOp{"act_round_q8_k", act_round_shape, nullptr, act_round_k_forward, act_round_backward};

// The forward is piecewise constant, so finite differences see zero almost everywhere: the case checks the
// straight-through backward through a product whose other factor is smooth, and the f32 backends' forward.
void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back({"act_round_q8_0 3x64", [](Graph& g, std::mt19937& r) {
                   Var x = random_constant(g, r, {3, 64}, "x");
                   return mul(act_round_q8_0(x), random_param(g, r, {3, 64}, "w"));
                 }});
  out.push_back({"act_round_q8_k 3x512", [](Graph& g, std::mt19937& r) {
                   Var x = random_constant(g, r, {3, 512}, "x");
                   return mul(act_round_q8_k(x), random_param(g, r, {3, 512}, "w"));
                 }});
}

const OpRegistration kRegistration({&kActRoundOp, &kActRoundKOp}, add_cases);

}  // namespace

Var act_round_q8_0(Var x) {
  if (!is_real(x.value().dtype())) throw GraphError("act_round_q8_0: input is not a real tensor");
  return x.g->add(kActRoundOp, {x}, ActRoundParams{.block = 32});
}

Var act_round_q8_k(Var x) {
  if (!is_real(x.value().dtype())) throw GraphError("act_round_q8_k: input is not a real tensor");
  return x.g->add(kActRoundKOp, {x}, ActRoundParams{.block = 256});
}

}  // namespace q4t::ag
