// act_round_q8_0: activations rounded the way llama.cpp's CPU matmuls round them before a Q4_0/Q8_0 weight
// (GGML's Q8_0 activation blocks). Used only to reproduce llama.cpp's logits exactly; training never uses it.
// The backward is the straight-through identity (dx += dy): the rounding is treated as exact.
#include <cmath>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"
#include "kernels/quant/f16.h"

namespace q4t::ag {

namespace {

Shape act_round_shape(const Graph& g, const Node& n) {
  const Tensor& x = g.node(n.inputs[0]).value;
  if (x.cols() % 32 != 0)
    throw GraphError("act_round_q8_0: rows of " + std::to_string(x.cols()) + " values are not whole 32-value blocks");
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

void act_round_backward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? act_round_backward_cpu<double>(c) : act_round_backward_cpu<float>(c);
  CopyPush push{uint32_t(c.node.value.numel()), 1, 3, 1.0f};  // elementwise.comp op 3: y += s * a
  c.seq->dispatch(c.be.pipeline("elementwise", 3, sizeof(push)),
                  {&c.in_grad(0).buffer(), &c.node.grad.buffer(), &c.node.grad.buffer()}, push,
                  groups_for(push.n, 256));
}

const OpDef kActRoundOp{"act_round_q8_0", act_round_shape, nullptr, act_round_forward, act_round_backward};

// The forward is piecewise constant, so finite differences see zero almost everywhere: the case checks the
// straight-through backward through a product whose other factor is smooth, and the f32 backends' forward.
void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back({"act_round_q8_0 3x64", [](Graph& g, std::mt19937& r) {
                   Var x = random_constant(g, r, {3, 64}, "x");
                   return mul(act_round_q8_0(x), random_param(g, r, {3, 64}, "w"));
                 }});
}

const OpRegistration kRegistration({&kActRoundOp}, add_cases);

}  // namespace

Var act_round_q8_0(Var x) {
  if (!is_real(x.value().dtype())) throw GraphError("act_round_q8_0: input is not a real tensor");
  return x.g->add(kActRoundOp, {x});
}

}  // namespace q4t::ag
