// The graph (tape). Building a node records op + inputs + params and allocates its output; no math happens
// at build time. forward() runs the nodes in creation order (a topological order by construction: a node
// can only name earlier nodes); backward(out, seed) zeroes the gradients and walks the ancestors of `out` in
// reverse, each op adding (+=) into its inputs' gradients, so a tensor used twice sums both contributions.
// On Vulkan each pass is recorded into a command sequence once and submitted on every later call.
//
// Parameters are marked explicitly and must be real (f32/f64). Gradients flow only into real tensors:
// a quantized tensor can never be a parameter, never requires a gradient, and asking for its gradient fails.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/backend.h"
#include "autograd/tensor.h"
#include "kernels/vulkan/sequence.h"

namespace q4t::ag {

class Graph;
struct Node;

// Small scalar parameters of a node: the meaning of each slot is the op's (documented in its builder).
struct OpParams {
  std::array<int64_t, 6> i{};
  std::array<double, 4> f{};
};

// What an op's forward/backward sees: the backend, the node, and (on Vulkan) the sequence to record into.
struct OpContext {
  Backend& be;
  Graph& graph;
  Node& node;
  vk::Sequence* seq;  // null on the CPU
  const Tensor& in(int k) const;       // value of input k
  const Tensor& in_grad(int k) const;  // gradient of input k (undefined tensor when it needs none)
  bool needs_grad(int k) const;
};

// One op = one place: shape rule, forward and backward for the CPU (float and double) and for Vulkan.
struct OpDef {
  const char* name;
  // Validates the inputs and returns the output shape; throws GraphError with a clear message.
  Shape (*shape)(const Graph& g, const Node& n);
  // Allocates per-node tensors the backward needs (saved statistics, scratch); may be null.
  void (*prepare)(OpContext& c);
  void (*forward)(OpContext& c);
  // Adds into in_grad(k) for each input k with needs_grad(k); node.grad holds dL/d(output). May be null for
  // ops with no differentiable input.
  void (*backward)(OpContext& c);
};

struct Node {
  const OpDef* op = nullptr;  // null for leaves (constants and parameters)
  std::vector<int> inputs;
  OpParams params;
  Tensor value, grad;
  std::vector<Tensor> saved;  // op-owned tensors kept from forward to backward
  bool requires_grad = false, is_param = false;
  std::string name;
};

// A handle to a node of a graph.
struct Var {
  Graph* g = nullptr;
  int id = -1;
  const Tensor& value() const;
  const Shape& shape() const { return value().shape(); }
};

class Graph {
 public:
  explicit Graph(Backend& be) : be_(be) {}
  Backend& backend() const { return be_; }

  // Leaves. A constant never gets a gradient; a parameter always does and must be real.
  Var constant(Tensor t, const std::string& name = "");
  Var param(Tensor t, const std::string& name);
  // Marks an existing leaf trainable (same rules as param()).
  void set_trainable(Var v);

  // Records a node of op `def` (used by the op builders in autograd/ops.h).
  Var add(const OpDef& def, std::vector<Var> inputs, OpParams params = {}, const std::string& name = "");

  void forward();
  // Backpropagates from `out` with dL/d(out) = seed (must match out's shape); defaults to 1 for a scalar.
  enum class Accumulate { None, Params };
  void backward(Var out);
  void backward(Var out, const Tensor& seed, Accumulate acc = Accumulate::None);
  // Zeroes every parameter's gradient (before a run of backward(..., Accumulate::Params)).
  void zero_param_grads();

  // Vulkan: GPU time per op name, summed over every pass run since profiling was switched on, from a timestamp
  // after each op of the recorded passes (switching re-records them). Off by default; the CPU records nothing.
  struct OpTime {
    double forward_ns = 0, backward_ns = 0;
  };
  void set_profiling(bool on);
  const std::map<std::string, OpTime>& op_times() const { return op_times_; }
  void clear_op_times() { op_times_.clear(); }

  const Node& node(int id) const { return nodes_.at(size_t(id)); }
  Node& node(int id) { return nodes_.at(size_t(id)); }
  int size() const { return int(nodes_.size()); }
  // dL/d(v) after backward(); throws GraphError for tensors that have no gradient (quantized, constants).
  const Tensor& grad(Var v) const;
  std::vector<Var> params();

 private:
  void run_pass(bool backward, int out, const Tensor* seed, bool keep_param_grads = false);
  std::vector<int> ancestors(int out) const;

  Backend& be_;
  std::vector<Node> nodes_;
  // Vulkan: recorded passes, valid while the graph, the output and the seed stay the same.
  struct Recorded {
    int nodes = -1, out = -1;
    bool operator==(const Recorded&) const = default;
  };
  std::unique_ptr<vk::Sequence> fwd_seq_, bwd_seq_[2];  // backward: [keep_param_grads]
  Recorded fwd_recorded_, bwd_recorded_[2];
  // Profiling: the node run between timestamps k and k + 1 of each recorded pass.
  bool profiling_ = false;
  std::vector<int> fwd_marks_, bwd_marks_[2];
  std::map<std::string, OpTime> op_times_;
  Tensor ones_;  // the default seed of a scalar output
  Tensor seed_;  // Vulkan: the seed is copied here, so the recorded pass never points at a caller's buffer
};

}  // namespace q4t::ag
