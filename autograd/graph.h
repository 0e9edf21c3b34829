// The graph (tape). Building a node records op + inputs + params and allocates its output; no math happens
// at build time. forward() runs the nodes in creation order (a topological order by construction: a node
// can only name earlier nodes); backward(out, seed) zeroes the gradients and walks the ancestors of `out` in
// reverse, each op adding (+=) into its inputs' gradients, so a tensor used twice sums both contributions.
// On Vulkan each pass is recorded into a command sequence once and submitted on every later call.
//
// Memory planning (training graphs): after defer_memory(), op outputs, their gradients and the ops' scratch
// get no memory of their own while the graph is built; plan_memory(loss) then fixes the schedule of the
// forward and the backward passes and places those tensors in one arena, tensors that are never live at the
// same step sharing bytes. A gradient is live from the first backward step that adds into it to its node's
// own backward; a value from its forward to the last step that reads it. With recomputation, checkpoint()
// splits the graph into segments (a decoder's layers): only the checkpoints' values (and those marked with
// keep()) are kept from the forward to the backward, and each segment's other values are computed again just
// before the segment's backward.
//
// Parameters are marked explicitly and must be real (f32/f64). Gradients flow only into real tensors:
// a quantized tensor can never be a parameter, never requires a gradient, and asking for its gradient fails.
#pragma once
#include <any>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

#include "autograd/backend.h"
#include "autograd/tensor.h"
#include "kernels/vulkan/sequence.h"

namespace q4t::ag {

class Graph;
struct Node;

// What an op's scratch tensor holds (see OpContext::scratch).
enum class Scratch : uint8_t {
  Saved,  // written by the forward, read by the backward
  Pass,   // used within one run of the forward or of the backward only
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
  // A tensor for node.saved (from prepare): its own memory, or in a memory-planned graph a place in the arena
  // for the steps `use` says it is needed.
  Tensor scratch(const Shape& shape, DType dtype, Scratch use) const;
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
  // Which values the backward reads: bit k for input k, kReadsOutput for the op's own output. The memory plan
  // keeps only those (and what recomputing them needs) until the backward; the default is all of them.
  uint32_t backward_reads = ~0u;
};
constexpr uint32_t kReadsOutput = 1u << 31;

struct Node {
  const OpDef* op = nullptr;  // null for leaves (constants and parameters)
  std::vector<int> inputs;
  // The op's parameters: one struct of named fields per op, defined beside the op (RopeParams,
  // DropoutParams, ...) and stored by its builder; empty for leaves and for ops that take none.
  std::any params;
  Tensor value, grad;
  std::vector<Tensor> saved;  // op-owned tensors kept from forward to backward
  bool requires_grad = false, is_param = false;
  std::string name;

  // params as the op's struct P. Reading another op's struct is a bug in the op's code: GraphError naming the op.
  template <class P>
  const P& params_as() const {
    if (const P* p = std::any_cast<P>(&params)) return *p;
    throw GraphError(std::string(op ? op->name : "leaf") + ": its code reads parameters of type " + typeid(P).name() +
                     ", but the node holds " + (params.has_value() ? params.type().name() : "none"));
  }
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
  // params is the op's parameter struct (see Node::params), or empty.
  Var add(const OpDef& def, std::vector<Var> inputs, std::any params = {}, const std::string& name = "");

  // Memory planning (see the top of this file). defer_memory() comes before the first op node;
  // plan_memory(out, recompute) after the last one and before the first pass. A planned graph runs backward
  // from `out` only, each backward right after a forward, and after a pass only `out`'s value and the
  // parameters' gradients are defined (the other values and gradients share memory).
  void defer_memory();
  void checkpoint(Var v);
  // With recomputation, v's value (an op output) is kept from the forward like a checkpoint's instead of being
  // computed again, without ending a segment: for ops whose forward costs much more than their output's memory.
  void keep(Var v);
  // The forward runs a planned backward repeats (0 without recomputation).
  int64_t recomputed_steps() const;
  // before_place, when given, sees the arena's size before it is allocated (and may throw to refuse it).
  void plan_memory(Var out, bool recompute, const std::function<void(size_t bytes)>& before_place = {});
  bool memory_planned() const { return planned_; }
  // Bytes of the arena (0 before planning).
  size_t planned_bytes() const { return planned_bytes_; }

  void forward();
  // Backpropagates from `out` with dL/d(out) = seed (must match out's shape); defaults to 1 for a scalar.
  enum class Accumulate { None, Params };
  void backward(Var out);
  void backward(Var out, const Tensor& seed, Accumulate acc = Accumulate::None);
  // Zeroes every parameter's gradient (before a run of backward(..., Accumulate::Params)).
  void zero_param_grads();

  // Vulkan: GPU time per op name, summed over every pass run since profiling was switched on, from a timestamp
  // after each op of the recorded passes (switching re-records them); forward_ns includes the recomputation in
  // the backward pass. Off by default; the CPU records nothing.
  struct OpTime {
    double forward_ns = 0, backward_ns = 0;
  };
  // timing (vk::Sequence::Timing): Off, the op times alone; Commands, also every dispatch and transfer timed alone
  // (the passes run slower, each command after the one before it), summed per pipeline name in kernel_times();
  // Levels, no op times (the ops' commands are ordered into levels as without profiling), each level of the
  // recorded passes timed, summed per level name (its kernels) in kernel_times().
  void set_profiling(bool on, vk::Sequence::Timing timing = vk::Sequence::Timing::Off);
  const std::map<std::string, OpTime>& op_times() const { return op_times_; }
  struct KernelTime {
    double ns = 0;
    int64_t runs = 0;
  };
  const std::map<std::string, KernelTime>& kernel_times() const { return kernel_times_; }
  void clear_op_times() { op_times_.clear(), kernel_times_.clear(); }

  // Data parallel on Vulkan: what takes the parameters' gradients as they become final during a backward, to send
  // them on while the backward goes on (ag::FlatGrads).
  class GradSink {
   public:
    virtual ~GradSink() = default;
    // Whether the next backward is one the sink takes part in (others run as without a sink; each kind is
    // recorded once).
    virtual bool armed() const = 0;
    virtual void record_begin() = 0;  // an armed backward is being recorded
    // While an armed backward is recorded: these parameters' gradients get no more adds after the steps recorded
    // so far (once per parameter; those no step adds into come at the end).
    virtual void record_ready(vk::Sequence& seq, std::span<const int> params) = 0;
    virtual void before_submit() = 0;  // each armed backward, before its submit
    virtual void while_running() = 0;  // each armed backward, between its submit and the wait for it
  };
  void set_grad_sink(GradSink* sink);  // nullptr: none. Records the armed backward again at its next run.
  GradSink* grad_sink() const { return sink_; }
  // The parameters' node ids in the order their gradients become final in the backward from out.
  std::vector<int> params_by_readiness(Var out) const;

  const Node& node(int id) const { return nodes_.at(size_t(id)); }
  Node& node(int id) { return nodes_.at(size_t(id)); }
  int size() const { return int(nodes_.size()); }
  // dL/d(v) after backward(); throws GraphError for tensors that have no gradient (quantized, constants).
  const Tensor& grad(Var v) const;
  std::vector<Var> params();
  // OpContext::scratch.
  Tensor scratch(const Node& n, const Shape& shape, DType dtype, Scratch use);

 private:
  // One op run of a pass: node id's forward (also when recomputed in the backward pass) or backward, after
  // zero-filling the gradients of zero_grads (nodes whose gradient this step is the first to add into).
  enum class StepKind : uint8_t { Forward, Recompute, Backward };
  struct Step {
    int id = -1;
    StepKind kind = StepKind::Forward;
    std::vector<int> zero_grads;
  };
  // A tensor that a memory plan places: node's value, gradient, or a scratch of its op.
  struct Planned {
    int node = -1;
    enum Kind : uint8_t { Value, Grad, Saved, Pass } kind = Value;
    Tensor t;
  };

  void run_pass(bool backward, int out, const Tensor* seed, bool keep_param_grads = false);
  void run_recorded(vk::Sequence& seq, GradSink* sink);
  void reset_backward_recordings();
  std::vector<int> ancestors(int out) const;
  std::vector<Step> backward_steps(int out, bool recompute) const;
  // Per step of a backward, the parameters whose gradients no later step adds into; one more entry for those
  // that no step adds into.
  std::vector<std::vector<int>> params_final_after(const std::vector<Step>& steps) const;
  void mark_for_plan(std::vector<int>& ids, Var v, const char* what);
  int id_of(const Node& n) const { return int(&n - nodes_.data()); }

  Backend& be_;
  std::vector<Node> nodes_;
  // Vulkan: recorded passes, valid while the graph, the output and the seed stay the same.
  struct Recorded {
    int nodes = -1, out = -1;
    bool operator==(const Recorded&) const = default;
  };
  // backward: [keep_param_grads + 2 · (a gradient sink is armed)]
  static constexpr int kBackwardKinds = 4;
  std::unique_ptr<vk::Sequence> fwd_seq_, bwd_seq_[kBackwardKinds];
  Recorded fwd_recorded_, bwd_recorded_[kBackwardKinds];
  // Profiling: the node run between the timestamp of the mark before and its own (the first mark: the start).
  bool profiling_ = false;
  vk::Sequence::Timing timing_ = vk::Sequence::Timing::Off;
  GradSink* sink_ = nullptr;
  struct Mark {
    int id = -1;
    bool forward = true;
    uint32_t slot = 0;
  };
  std::vector<Mark> fwd_marks_, bwd_marks_[kBackwardKinds];
  std::map<std::string, OpTime> op_times_;
  std::map<std::string, KernelTime> kernel_times_;
  Tensor ones_;  // the default seed of a scalar output
  Tensor seed_;  // Vulkan: the seed is copied here, so the recorded pass never points at a caller's buffer
  // Memory planning.
  bool deferred_ = false, planned_ = false, fresh_forward_ = false;
  int plan_out_ = -1;
  std::vector<int> checkpoints_;  // ascending
  std::vector<int> kept_;         // keep(): ascending
  std::vector<Planned> planned_tensors_;
  std::vector<Step> plan_bwd_;
  size_t planned_bytes_ = 0;
};

}  // namespace q4t::ag
