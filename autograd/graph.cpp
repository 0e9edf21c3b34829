#include "autograd/graph.h"

#include <algorithm>
#include <cstring>

#include "autograd/memory_plan.h"

namespace q4t::ag {

const Tensor& OpContext::in(int k) const { return graph.node(node.inputs.at(size_t(k))).value; }
const Tensor& OpContext::in_grad(int k) const { return graph.node(node.inputs.at(size_t(k))).grad; }
bool OpContext::needs_grad(int k) const { return graph.node(node.inputs.at(size_t(k))).requires_grad; }
Tensor OpContext::scratch(const Shape& shape, DType dtype, Scratch use) const {
  return graph.scratch(node, shape, dtype, use);
}

const Tensor& Var::value() const { return g->node(id).value; }

namespace {
// Steps a pass scratch stays live after its node's (plan_memory). H100, tinyllama-1.1b with --grad-checkpoint,
// ms/step and peak at batch 4: 0 steps 247.3 (2.53 GiB), 2 244.7 (2.56), 4 244.2 (2.63), 8 244.2 (2.69);
// llama-7b batch 1: 348.9 (5.79), 343.4 (5.82), 341.7 (5.86), 341.5 (5.90).
constexpr int64_t kPassSlack = 2;
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

Var Graph::add(const OpDef& def, std::vector<Var> inputs, std::any params, const std::string& name) {
  Node n;
  n.op = &def;
  n.params = std::move(params);
  n.name = name;
  for (const Var& v : inputs) {
    if (v.g != this || v.id < 0 || v.id >= size()) throw GraphError(std::string(def.name) + ": input from another graph");
    n.inputs.push_back(v.id);
    n.requires_grad = n.requires_grad || node(v.id).requires_grad;
  }
  if (planned_) throw GraphError(std::string(def.name) + ": the graph's memory is planned; it takes no more op nodes");
  const Shape shape = def.shape(*this, n);
  const int id = size();
  if (deferred_) {
    n.value = be_.unplaced(shape, be_.real());
    planned_tensors_.push_back({id, Planned::Value, n.value});
    if (n.requires_grad) {
      n.grad = be_.unplaced(shape, be_.real());
      planned_tensors_.push_back({id, Planned::Grad, n.grad});
    }
  } else {
    n.value = be_.empty(shape, be_.real());
    if (n.requires_grad) n.grad = be_.empty(shape, be_.real());
  }
  nodes_.push_back(std::move(n));
  if (def.prepare) {
    OpContext c{be_, *this, nodes_.back(), nullptr};
    def.prepare(c);
  }
  return {this, id};
}

Tensor Graph::scratch(const Node& n, const Shape& shape, DType dtype, Scratch use) {
  if (!deferred_) return be_.empty(shape, dtype);
  if (planned_) throw std::logic_error("Graph::scratch after plan_memory");
  Tensor t = be_.unplaced(shape, dtype);
  planned_tensors_.push_back({id_of(n), use == Scratch::Saved ? Planned::Saved : Planned::Pass, t});
  return t;
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

void Graph::forward() {
  if (deferred_ && !planned_) throw GraphError("forward: the graph defers its memory; call plan_memory first");
  run_pass(false, -1, nullptr);
  fresh_forward_ = true;
}

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
  if (deferred_) {
    if (!planned_) throw GraphError("backward: the graph defers its memory; call plan_memory first");
    if (out.id != plan_out_)
      throw GraphError("backward from " + label(n, out.id) + ": the memory plan is for backward from " +
                       label(node(plan_out_), plan_out_));
    if (!fresh_forward_)
      throw GraphError("backward: a memory-planned graph needs a forward before each backward");
  }
  run_pass(true, out.id, &seed, acc == Accumulate::Params);
  fresh_forward_ = false;
}

void Graph::defer_memory() {
  for (const Node& n : nodes_)
    if (n.op) throw GraphError("defer_memory: the graph already has op nodes with memory of their own");
  deferred_ = true;
}

// checkpoint() and keep(): v, an op output of this graph not yet planned, joins the ascending list `ids`.
void Graph::mark_for_plan(std::vector<int>& ids, Var v, const char* what) {
  const std::string op = what;
  if (v.g != this || v.id < 0 || v.id >= size()) throw GraphError(op + ": the node belongs to another graph");
  if (!node(v.id).op) throw GraphError(op + ": " + label(node(v.id), v.id) + " is a leaf, not an op output");
  if (planned_) throw GraphError(op + ": the graph's memory is already planned");
  const auto it = std::lower_bound(ids.begin(), ids.end(), v.id);
  if (it == ids.end() || *it != v.id) ids.insert(it, v.id);
}

void Graph::checkpoint(Var v) { mark_for_plan(checkpoints_, v, "checkpoint"); }
void Graph::keep(Var v) { mark_for_plan(kept_, v, "keep"); }

namespace {
bool backward_reads_input(const OpDef& op, size_t k) { return k < 31 ? (op.backward_reads >> k) & 1u : true; }
}  // namespace

int64_t Graph::recomputed_steps() const {
  return std::count_if(plan_bwd_.begin(), plan_bwd_.end(),
                       [](const Step& s) { return s.kind == StepKind::Recompute; });
}

// The backward pass: the ancestors of out in reverse creation order. With recompute, each segment (the nodes
// after one checkpoint up to the next) starts by running again the forward of its nodes whose values are not
// kept (op outputs other than the checkpoints, those marked with keep() and out, read only inside their segment,
// outside the last segment, whose forward ran just before) and that some backward reads (OpDef::backward_reads),
// or that computing those reads. Each step zero-fills the gradients it is the first to add into.
std::vector<Graph::Step> Graph::backward_steps(int out, bool recompute) const {
  const int N = size();
  auto seg = [&](int id) {
    return int(std::lower_bound(checkpoints_.begin(), checkpoints_.end(), id) - checkpoints_.begin());
  };
  const int last_seg = int(checkpoints_.size());
  std::vector<char> again(size_t(N), 0);
  if (recompute) {
    for (int id = 0; id < N; ++id)
      again[size_t(id)] = nodes_[size_t(id)].op && id != out && seg(id) < last_seg &&
                          !std::binary_search(checkpoints_.begin(), checkpoints_.end(), id) &&
                          !std::binary_search(kept_.begin(), kept_.end(), id);
    for (int j = 0; j < N; ++j)
      for (int in : nodes_[size_t(j)].inputs)
        if (seg(in) != seg(j)) again[size_t(in)] = 0;
    // Only values that some backward reads are computed again, with what computing them reads in turn.
    std::vector<char> needed(size_t(N), 0);
    for (int id : ancestors(out)) {
      const Node& n = nodes_[size_t(id)];
      if (!n.op || !n.op->backward) continue;
      if (n.op->backward_reads & kReadsOutput) needed[size_t(id)] = 1;
      for (size_t k = 0; k < n.inputs.size(); ++k)
        if (backward_reads_input(*n.op, k)) needed[size_t(n.inputs[k])] = 1;
    }
    for (int id = N - 1; id >= 0; --id) {
      again[size_t(id)] = again[size_t(id)] && needed[size_t(id)];
      if (again[size_t(id)])
        for (int in : nodes_[size_t(id)].inputs) needed[size_t(in)] = 1;
    }
  }
  std::vector<Step> steps;
  int current = -1;
  for (int id : ancestors(out)) {
    if (!nodes_[size_t(id)].op) continue;
    const int s = seg(id);
    if (s != current) {
      current = s;
      const int lo = s == 0 ? 0 : checkpoints_[size_t(s - 1)] + 1, hi = s == last_seg ? N : checkpoints_[size_t(s)];
      for (int r = lo; r < hi; ++r)
        if (again[size_t(r)]) steps.push_back({r, StepKind::Recompute, {}});
    }
    steps.push_back({id, StepKind::Backward, {}});
  }
  std::vector<char> written(size_t(N), 0);
  written[size_t(out)] = 1;  // the seed
  for (Step& st : steps) {
    if (st.kind != StepKind::Backward) continue;
    const Node& n = nodes_[size_t(st.id)];
    if (!written[size_t(st.id)]) {  // nothing added into it: its backward reads zeros
      written[size_t(st.id)] = 1;
      st.zero_grads.push_back(st.id);
    }
    if (!n.op->backward) continue;
    for (int in : n.inputs) {
      const Node& m = nodes_[size_t(in)];
      if (!m.requires_grad || m.is_param || written[size_t(in)]) continue;
      written[size_t(in)] = 1;
      st.zero_grads.push_back(in);
    }
  }
  return steps;
}

void Graph::plan_memory(Var out, bool recompute, const std::function<void(size_t bytes)>& before_place) {
  if (!deferred_) throw GraphError("plan_memory: call defer_memory before building the graph");
  if (planned_) throw GraphError("plan_memory: the graph's memory is already planned");
  if (out.g != this || out.id < 0 || out.id >= size()) throw GraphError("plan_memory: the output belongs to another graph");
  const int N = size();
  std::vector<Step> fwd;
  for (int id = 0; id < N; ++id)
    if (nodes_[size_t(id)].op) fwd.push_back({id, StepKind::Forward, {}});
  plan_bwd_ = node(out.id).requires_grad ? backward_steps(out.id, recompute) : std::vector<Step>{};

  // Steps: the forward's, then the seed copy, then the backward's; `end` stands for after the last pass.
  struct Event {
    int64_t t;
    bool fresh;  // a write that does not read what was there
  };
  std::vector<std::vector<Event>> value_ev(static_cast<size_t>(N)), grad_ev(static_cast<size_t>(N));
  std::vector<std::vector<int64_t>> fwd_runs(static_cast<size_t>(N)), bwd_runs(static_cast<size_t>(N));
  const int64_t seed_t = int64_t(fwd.size()), end_t = seed_t + 1 + int64_t(plan_bwd_.size());
  auto visit = [&](const Step& st, int64_t t) {
    const Node& n = nodes_[size_t(st.id)];
    if (st.kind != StepKind::Backward) {
      value_ev[size_t(st.id)].push_back({t, true});
      for (int in : n.inputs) value_ev[size_t(in)].push_back({t, false});
      fwd_runs[size_t(st.id)].push_back(t);
      return;
    }
    // A backward reads the values its op says it does (OpDef::backward_reads) and adds into its inputs'
    // gradients.
    if (n.op->backward_reads & kReadsOutput) value_ev[size_t(st.id)].push_back({t, false});
    grad_ev[size_t(st.id)].push_back({t, false});
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int in = n.inputs[k];
      if (backward_reads_input(*n.op, k)) value_ev[size_t(in)].push_back({t, false});
      if (n.op->backward && nodes_[size_t(in)].requires_grad) grad_ev[size_t(in)].push_back({t, false});
    }
    bwd_runs[size_t(st.id)].push_back(t);
  };
  for (size_t k = 0; k < fwd.size(); ++k) visit(fwd[k], int64_t(k));
  for (size_t k = 0; k < plan_bwd_.size(); ++k) visit(plan_bwd_[k], seed_t + 1 + int64_t(k));
  grad_ev[size_t(out.id)].push_back({seed_t, false});
  value_ev[size_t(out.id)].push_back({end_t, false});

  // Live intervals: each fresh write opens one, which lasts to the last access before the next fresh write.
  auto intervals = [](std::vector<Event> ev) {
    std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.t < b.t; });
    std::vector<LiveInterval> live;
    for (const Event& e : ev) {
      if (e.fresh || live.empty())
        live.push_back({e.t, e.t});
      else
        live.back().last = std::max(live.back().last, e.t);
    }
    return live;
  };
  std::vector<PlanItem> items;
  size_t align = 1;
  for (const Planned& p : planned_tensors_) {
    PlanItem it;
    it.bytes = be_.is_cpu() ? p.t.bytes() : size_t(p.t.buffer().requirements().size);
    align = std::max(align, be_.placement_alignment(p.t));
    const size_t id = size_t(p.node);
    switch (p.kind) {
      case Planned::Value: it.live = intervals(value_ev[id]); break;
      case Planned::Grad: it.live = intervals(grad_ev[id]); break;  // one interval: every write adds
      case Planned::Saved: {
        std::vector<Event> ev;
        for (int64_t t : fwd_runs[id]) ev.push_back({t, true});
        for (int64_t t : bwd_runs[id]) ev.push_back({t, false});
        it.live = intervals(ev);
        break;
      }
      case Planned::Pass: {
        // Live for kPassSlack steps past its node's: the scratch of nearby nodes then never shares bytes, so
        // their commands need not wait for each other (vk::Sequence orders commands by the bytes they share).
        std::vector<LiveInterval> runs;
        for (const auto* r : {&fwd_runs[id], &bwd_runs[id]})
          for (int64_t t : *r) runs.push_back({t, t + kPassSlack});
        std::sort(runs.begin(), runs.end(), [](auto& a, auto& b) { return a.first < b.first; });
        for (const LiveInterval& l : runs) {
          if (!it.live.empty() && l.first <= it.live.back().last)
            it.live.back().last = std::max(it.live.back().last, l.last);
          else
            it.live.push_back(l);
        }
        break;
      }
    }
    items.push_back(std::move(it));
  }
  const Placement placement = place_items(items, align);
  if (before_place) before_place(placement.bytes);
  std::vector<std::pair<Tensor, size_t>> at;
  for (size_t k = 0; k < planned_tensors_.size(); ++k) at.emplace_back(planned_tensors_[k].t, placement.offset[k]);
  be_.place(at, placement.bytes);
  planned_tensors_.clear();
  planned_bytes_ = placement.bytes;
  plan_out_ = out.id;
  planned_ = true;
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
  std::vector<Step> local;
  const std::vector<Step>* steps = &local;
  if (!backward) {
    for (int id = 0; id < size(); ++id)
      if (nodes_[size_t(id)].op) local.push_back({id, StepKind::Forward, {}});
  } else if (planned_) {
    steps = &plan_bwd_;
  } else {
    local = backward_steps(out, false);
  }
  auto zero = [&](const Tensor& t, vk::Sequence* seq) {
    if (seq)
      seq->fill_zero(t.buffer());
    else
      std::memset(t.data<std::byte>(), 0, t.bytes());
  };
  // The backward starts from zero gradients (a planned graph zeroes its planned ones step by step) and the seed.
  auto begin_backward = [&](vk::Sequence* seq) {
    if (seq) seq->begin_independent();  // every gradient has its own buffer
    for (Node& n : nodes_) {
      const bool kept = keep_param_grads && n.is_param;
      if (n.requires_grad && !kept && (n.is_param || !planned_)) zero(n.grad, seq);
    }
    if (seq) seq->end_independent();
    if (seq)
      seq->copy(nodes_[size_t(out)].grad.buffer(), seed_.buffer(), seed_.bytes());
    else
      std::memcpy(nodes_[size_t(out)].grad.data<std::byte>(), seed->data<std::byte>(), seed->bytes());
  };
  auto run_step = [&](const Step& st, vk::Sequence* seq) {
    if (planned_)
      for (int z : st.zero_grads) zero(nodes_[size_t(z)].grad, seq);
    Node& n = nodes_[size_t(st.id)];
    OpContext c{be_, *this, n, seq};
    if (st.kind != StepKind::Backward)
      n.op->forward(c);
    else if (n.op->backward)
      n.op->backward(c);
  };

  if (be_.is_cpu()) {
    if (backward) begin_backward(nullptr);
    for (const Step& st : *steps) run_step(st, nullptr);
    return;
  }

  // Vulkan: record once per (graph, output), submit every call.
  if (backward) {
    if (!seed_.defined() || seed_.shape() != seed->shape()) {
      seed_ = be_.empty(seed->shape(), seed->dtype());
      reset_backward_recordings();
    }
    be_.device().run_once([&](VkCommandBuffer cb) {
      VkBufferCopy region{0, 0, seed->bytes()};
      vkCmdCopyBuffer(cb, seed->buffer().handle(), seed_.buffer().handle(), 1, &region);
    });
  }
  GradSink* sink = backward && sink_ && sink_->armed() ? sink_ : nullptr;
  const int kind = int(keep_param_grads) + (sink ? 2 : 0);
  std::unique_ptr<vk::Sequence>& seq = backward ? bwd_seq_[kind] : fwd_seq_;
  std::vector<Mark>& marks = backward ? bwd_marks_[kind] : fwd_marks_;
  const Recorded want{size(), out};
  Recorded& have = backward ? bwd_recorded_[kind] : fwd_recorded_;
  if (!seq || !(have == want)) {
    marks.clear();
    constexpr uint32_t kCommandTimestamps = 1u << 18;  // room for every command (or level) of a pass
    const bool marks_on = profiling_ && timing_ != vk::Sequence::Timing::Levels;
    seq = std::make_unique<vk::Sequence>(
        be_.device(), profiling_ ? uint32_t(steps->size() + 1) +
                                       (timing_ != vk::Sequence::Timing::Off ? kCommandTimestamps : 0u) : 0u);
    seq->set_timing(timing_);
    seq->begin();
    if (backward) begin_backward(seq.get());
    if (marks_on) marks.push_back({-1, false, seq->timestamp()});  // where the first op's time starts
    if (sink) sink->record_begin();
    const std::vector<std::vector<int>> ready = sink ? params_final_after(*steps) : std::vector<std::vector<int>>{};
    for (size_t i = 0; i < steps->size(); ++i) {
      const Step& st = (*steps)[i];
      run_step(st, seq.get());
      if (sink && !ready[i].empty()) sink->record_ready(*seq, ready[i]);
      if (marks_on) marks.push_back({st.id, st.kind != StepKind::Backward, seq->timestamp()});
    }
    if (sink) sink->record_ready(*seq, ready.back());
    seq->end();
    have = want;
  }
  run_recorded(*seq, sink);
  for (size_t k = 1; k < marks.size(); ++k) {
    OpTime& t = op_times_[nodes_[size_t(marks[k].id)].op->name];
    (marks[k].forward ? t.forward_ns : t.backward_ns) += seq->elapsed_ns(marks[k - 1].slot, marks[k].slot);
  }
  if (timing_ != vk::Sequence::Timing::Off)
    for (const auto& [name, ns] : seq->command_times()) {
      KernelTime& t = kernel_times_[name];
      t.ns += ns, ++t.runs;
    }
}

void Graph::set_profiling(bool on, vk::Sequence::Timing timing) {
  if (on && !be_.is_cpu() && !be_.device().timestamps_supported())
    throw GraphError("profiling: " + be_.device().name() + " has no timestamp queries");
  profiling_ = on;
  timing_ = on ? timing : vk::Sequence::Timing::Off;
  op_times_.clear();
  kernel_times_.clear();
  fwd_seq_.reset();
  fwd_recorded_ = {};
  reset_backward_recordings();
}

// An armed gradient sink works between the submit and the wait.
void Graph::run_recorded(vk::Sequence& seq, GradSink* sink) {
  if (!sink) return seq.run();
  sink->before_submit();
  seq.submit();
  try {
    sink->while_running();
  } catch (...) {
    seq.wait();
    throw;
  }
  seq.wait();
}

void Graph::reset_backward_recordings() {
  for (int k = 0; k < kBackwardKinds; ++k) bwd_seq_[k].reset(), bwd_recorded_[k] = {};
}

void Graph::set_grad_sink(GradSink* sink) {
  sink_ = sink;
  reset_backward_recordings();
}

// A backward step adds into the gradients of its node's inputs; a parameter's gradient is final after the last
// step that has the parameter as an input.
std::vector<std::vector<int>> Graph::params_final_after(const std::vector<Step>& steps) const {
  std::vector<int> last(nodes_.size(), -1);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Node& n = nodes_[size_t(steps[i].id)];
    if (steps[i].kind != StepKind::Backward || !n.op || !n.op->backward) continue;
    for (int in : n.inputs)
      if (nodes_[size_t(in)].is_param) last[size_t(in)] = int(i);
  }
  std::vector<std::vector<int>> out(steps.size() + 1);
  for (int id = 0; id < size(); ++id)
    if (nodes_[size_t(id)].is_param) out[last[size_t(id)] < 0 ? steps.size() : size_t(last[size_t(id)])].push_back(id);
  return out;
}

std::vector<int> Graph::params_by_readiness(Var out) const {
  if (out.g != this) throw GraphError("params_by_readiness: the output belongs to another graph");
  if (planned_ && out.id != plan_out_)
    throw GraphError("params_by_readiness: the memory plan is for the backward from " + label(node(plan_out_), plan_out_));
  const std::vector<std::vector<int>> ready = params_final_after(planned_ ? plan_bwd_ : backward_steps(out.id, false));
  std::vector<int> order;
  for (const std::vector<int>& r : ready) order.insert(order.end(), r.begin(), r.end());
  return order;
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
