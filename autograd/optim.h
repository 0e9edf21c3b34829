// AdamW over the parameters of a graph, and clipping of their gradients by global norm.
//
// The update is torch.optim.AdamW's (decoupled weight decay, bias-corrected moments), per parameter value:
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;  p -= lr (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
// The moments m, v live beside each parameter on the graph's backend, with its shape (f32 on Vulkan, the
// backend's real type on the CPU). On Vulkan the step, the norm and the clip are recorded command sequences
// (adamw_step.comp, grad_norm_*.comp) recorded once; the step-dependent scalars (lr, 1 - lr*wd and the two bias
// corrections) sit in a 16-byte device buffer rewritten before each submit, since a recorded sequence's push
// constants are frozen. Parameters and moments never visit the host during a step.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/graph.h"

namespace q4t::ag {

struct AdamWConfig {
  double lr = 1e-3;  // the base rate; step() takes the scheduled rate of each step
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

class AdamW {
 public:
  // Optimizes every parameter of g (g.params() at construction, in that order); g must outlive the optimizer.
  // Throws std::invalid_argument naming the field for a config outside lr >= 0, 0 <= beta < 1, eps >= 0, wd >= 0.
  AdamW(Graph& g, const AdamWConfig& cfg);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update of every parameter from its current gradient, at rate lr (t counts up by one first).
  void step(double lr);
  // sqrt(Σ over all parameter gradients of g²). CPU: accumulated in double; Vulkan: in f32, in a fixed order.
  double grad_norm();
  // Scales every gradient by max_norm / norm when norm > max_norm; returns the norm before clipping.
  double clip(double max_norm);

  const AdamWConfig& config() const { return cfg_; }
  size_t size() const { return params_.size(); }
  const std::vector<Var>& params() const { return params_; }

  // Checkpoint state: one vector per parameter (in params() order, row-major), and the step count t. Exact on the
  // f32 backends (CPU and Vulkan); on the f64 CPU check backend the moments round to float.
  std::vector<std::vector<float>> moments_m() const;
  std::vector<std::vector<float>> moments_v() const;
  int64_t t() const { return t_; }
  // Restores moments and t as exported; throws std::invalid_argument when the counts or sizes do not match.
  void load_state(const std::vector<std::vector<float>>& m, const std::vector<std::vector<float>>& v, int64_t t);

 private:
  struct VkState;
  std::vector<std::vector<float>> export_moments(const std::vector<Tensor>& ts) const;
  void record_norm(vk::Sequence& seq);

  Graph& g_;
  AdamWConfig cfg_;
  std::vector<Var> params_;
  std::vector<Tensor> m_, v_;  // per parameter, its shape
  int64_t t_ = 0;
  std::unique_ptr<VkState> vk_;  // Vulkan only
};

}  // namespace q4t::ag
