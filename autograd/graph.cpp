#include "autograd/graph.h"

#include <algorithm>
#include <cstring>

namespace q4t::ag {

const Tensor& OpContext::in(int k) const { return graph.node(node.inputs.at(size_t(k))).value; }
const Tensor& OpContext::in_grad(int k) const { return graph.node(node.inputs.at(size_t(k))).grad; }
bool OpContext::needs_grad(int k) const { return graph.node(node.inputs.at(size_t(k))).requires_grad; }

const Tensor& Var::value() const { return g->node(id).value; }

namespace {
std::string label(const Node& n, int id) {
  return n.name.empty() ? (n.op ? std::string(n.op->name) : "leaf") + " #" + std::to_string(id) : "'" + n.name + "'";
}
}  // namespace

Var Graph::constant(Tensor t, const std::string& name) {
  if (!t.defined()) throw GraphError("constant " + name + ": undefined tensor");
  Node n;
  n.value = std::move(t);
  n.name = name;
  nodes_.push_back(std::move(n));
  return {this, size() - 1};
}

Var Graph::param(Tensor t, const std::string& name) {
  Var v = constant(std::move(t), name);
  set_trainable(v);
  return v;
}

void Graph::set_trainable(Var v) {
  Node& n = node(v.id);
  if (n.op) throw GraphError("only leaves can be trainable; " + label(n, v.id) + " is the output of " + n.op->name);
  if (!is_real(n.value.dtype()))
    throw GraphError("cannot make " + label(n, v.id) + " trainable: it is " + dtype_name(n.value.dtype()) +
                     (is_frozen_storage(n.value.dtype()) ? ", and frozen weights (quantized or f16) never train"
                                                           " (only f32 tensors do)"
                                                         : ", not a real tensor"));
  n.requires_grad = n.is_param = true;
  n.grad = be_.zeros(n.value.shape(), be_.real());
}

Var Graph::add(const OpDef& def, std::vector<Var> inputs, OpParams params, const std::string& name) {
  Node n;
  n.op = &def;
  n.params = params;
  n.name = name;
  for (const Var& v : inputs) {
    if (v.g != this || v.id < 0 || v.id >= size()) throw GraphError(std::string(def.name) + ": input from another graph");
    n.inputs.push_back(v.id);
    n.requires_grad = n.requires_grad || node(v.id).requires_grad;
  }
  const Shape shape = def.shape(*this, n);
  n.value = be_.empty(shape, be_.real());
  if (n.requires_grad) n.grad = be_.empty(shape, be_.real());
  nodes_.push_back(std::move(n));
  if (def.prepare) {
    OpContext c{be_, *this, nodes_.back(), nullptr};
    def.prepare(c);
  }
  return {this, size() - 1};
}

std::vector<int> Graph::ancestors(int out) const {
  std::vector<char> seen(nodes_.size(), 0);
  std::vector<int> stack{out}, order;
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    if (seen[size_t(id)] || !nodes_[size_t(id)].requires_grad) continue;
    seen[size_t(id)] = 1;
    order.push_back(id);
    for (int in : nodes_[size_t(id)].inputs) stack.push_back(in);
  }
  std::sort(order.rbegin(), order.rend());  // reverse creation order = reverse topological order
  return order;
}

void Graph::forward() { run_pass(false, -1, nullptr); }

void Graph::backward(Var out) {
  const Node& n = node(out.id);
  if (n.value.numel() != 1)
    throw GraphError("backward from " + label(n, out.id) + " of shape " + shape_str(n.value.shape()) +
                     " needs an explicit seed gradient (only a scalar defaults to 1)");
  if (!ones_.defined()) ones_ = be_.from_host(std::vector<float>{1.0f}, {1});
  backward(out, ones_.view(n.value.shape()));
}

void Graph::backward(Var out, const Tensor& seed, Accumulate acc) {
  if (out.g != this) throw GraphError("backward: the output belongs to another graph");
  const Node& n = node(out.id);
  if (!n.requires_grad)
    throw GraphError("backward from " + label(n, out.id) + ": no parameter reaches it, nothing to differentiate");
  if (seed.shape() != n.value.shape() || seed.dtype() != n.value.dtype())
    throw GraphError("backward: seed " + shape_str(seed.shape()) + " does not match the output " +
                     shape_str(n.value.shape()));
  run_pass(true, out.id, &seed, acc == Accumulate::Params);
}

void Graph::zero_param_grads() {
  if (be_.is_cpu()) {
    for (Node& n : nodes_)
      if (n.is_param) std::memset(n.grad.data<std::byte>(), 0, n.grad.bytes());
    return;
  }
  be_.device().run_once([&](VkCommandBuffer cb) {
    for (Node& n : nodes_)
      if (n.is_param) vkCmdFillBuffer(cb, n.grad.buffer().handle(), 0, VK_WHOLE_SIZE, 0);
  });
}

void Graph::run_pass(bool backward, int out, const Tensor* seed, bool keep_param_grads) {
  auto run_op = [&](int id, vk::Sequence* seq) {
    Node& n = nodes_[size_t(id)];
    if (!n.op) return;
    OpContext c{be_, *this, n, seq};
    if (!backward)
      n.op->forward(c);
    else if (n.op->backward)
      n.op->backward(c);
  };
  const std::vector<int> order = backward ? ancestors(out) : std::vector<int>{};

  if (be_.is_cpu()) {
    if (!backward) {
      for (int id = 0; id < size(); ++id) run_op(id, nullptr);
      return;
    }
    for (Node& n : nodes_)
      if (n.requires_grad && !(keep_param_grads && n.is_param)) std::memset(n.grad.data<std::byte>(), 0, n.grad.bytes());
    std::memcpy(nodes_[size_t(out)].grad.data<std::byte>(), seed->data<std::byte>(), seed->bytes());
    for (int id : order) run_op(id, nullptr);
    return;
  }

  // Vulkan: record once per (graph, output), submit every call.
  if (backward) {
    if (!seed_.defined() || seed_.shape() != seed->shape()) {
      seed_ = be_.empty(seed->shape(), seed->dtype());
      bwd_seq_[0].reset(), bwd_seq_[1].reset();
    }
    be_.device().run_once([&](VkCommandBuffer cb) {
      VkBufferCopy region{0, 0, seed->bytes()};
      vkCmdCopyBuffer(cb, seed->buffer().handle(), seed_.buffer().handle(), 1, &region);
    });
  }
  std::unique_ptr<vk::Sequence>& seq = backward ? bwd_seq_[keep_param_grads] : fwd_seq_;
  std::vector<int>& marks = backward ? bwd_marks_[keep_param_grads] : fwd_marks_;
  const Recorded want{size(), out};
  Recorded& have = backward ? bwd_recorded_[keep_param_grads] : fwd_recorded_;
  if (!seq || !(have == want)) {
    std::vector<int> ids = order;  // forward: every node in creation order
    if (!backward)
      for (int id = 0; id < size(); ++id) ids.push_back(id);
    marks.clear();
    seq = std::make_unique<vk::Sequence>(be_.device(), profiling_ ? uint32_t(ids.size() + 1) : 0);
    seq->begin();
    if (backward) {
      for (Node& n : nodes_)
        if (n.requires_grad && !(keep_param_grads && n.is_param)) seq->fill_zero(n.grad.buffer());
      seq->copy(nodes_[size_t(out)].grad.buffer(), seed_.buffer(), seed_.bytes());
    }
    if (profiling_) seq->timestamp();
    for (int id : ids) {
      run_op(id, seq.get());
      if (profiling_) {
        seq->timestamp();
        marks.push_back(id);
      }
    }
    seq->end();
    have = want;
  }
  seq->run();
  for (size_t k = 0; k < marks.size(); ++k) {
    const Node& n = nodes_[size_t(marks[k])];
    if (!n.op) continue;
    OpTime& t = op_times_[n.op->name];
    (backward ? t.backward_ns : t.forward_ns) += seq->elapsed_ns(uint32_t(k), uint32_t(k + 1));
  }
}

void Graph::set_profiling(bool on) {
  if (on && !be_.is_cpu() && !be_.device().timestamps_supported())
    throw GraphError("profiling: " + be_.device().name() + " has no timestamp queries");
  profiling_ = on;
  op_times_.clear();
  fwd_seq_.reset(), bwd_seq_[0].reset(), bwd_seq_[1].reset();
  fwd_recorded_ = {}, bwd_recorded_[0] = {}, bwd_recorded_[1] = {};
}

const Tensor& Graph::grad(Var v) const {
  const Node& n = node(v.id);
  if (is_frozen_storage(n.value.dtype()))
    throw GraphError(label(n, v.id) + (is_quantized(n.value.dtype()) ? " is quantized (" : " is frozen storage (") +
                     dtype_name(n.value.dtype()) + "): frozen weights have no gradient");
  if (!n.requires_grad)
    throw GraphError(label(n, v.id) + " has no gradient: it is a constant or depends on no parameter");
  return n.grad;
}

std::vector<Var> Graph::params() {
  std::vector<Var> out;
  for (int id = 0; id < size(); ++id)
    if (nodes_[size_t(id)].is_param) out.push_back({this, id});
  return out;
}

}  // namespace q4t::ag
