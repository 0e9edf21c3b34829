// act_round_q8_0 / act_round_q8_k: activations rounded the way llama.cpp's CPU matmuls round them before a
// Q4_0/Q8_0 weight (GGML's Q8_0 activation blocks) or a Q4_K/Q6_K weight (Q8_K blocks). Used only to reproduce
// llama.cpp's logits exactly; training never uses them.
// The backward is the straight-through identity (dx += dy): the rounding is treated as exact.
#include <cmath>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"
#include "kernels/quant/act_round.h"

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

// The rules of kernels/quant/act_round.h, block by block; y = d·q.
template <class T>
void act_round_forward_cpu(OpContext& c) {
  const T* x = c.in(0).data<T>();
  T* y = c.node.value.data<T>();
  int8_t q[32];
  for (int64_t b = 0; b < c.in(0).numel() / 32; ++b) {
    const float d = quant::round_q8_0_block(x + b * 32, q);
    for (int i = 0; i < 32; ++i) y[b * 32 + i] = T(d * float(q[i]));
  }
}

template <class T>
void act_round_k_forward_cpu(OpContext& c) {
  const T* x = c.in(0).data<T>();
  T* y = c.node.value.data<T>();
  int8_t q[256];
  for (int64_t b = 0; b < c.in(0).numel() / 256; ++b) {
    const float d = quant::round_q8_k_block(x + b * 256, q);
    for (int i = 0; i < 256; ++i) y[b * 256 + i] = T(d * float(q[i]));
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
