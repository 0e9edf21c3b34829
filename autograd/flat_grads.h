// The parameters' gradients as one flat f32 array on the host, for summing across the processes of a
// data-parallel run. The array holds the gradients in the order they become final in the backward (the last
// layer's first), cut into buckets at parameter boundaries; every process cuts the same buckets.
//
// A step's exchange: arm() before the backward of its last micro-batch; then exchange() sums every bucket over
// the ranks with the function given and copies the sums back into the gradients. On Vulkan the armed backward (a
// sequence of its own: the micro-batches before it run as without data parallelism)
// copies each gradient into mapped host memory as soon as the backward is done with it and signals each bucket
// with an event, and the host sums the buckets while the GPU goes on with the earlier layers: only the last
// bucket's sum and the copy back remain after the backward. The CPU (and a step whose armed backward did not
// run) copies and sums everything after the backward.
#pragma once
#include <algorithm>
#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "autograd/graph.h"

namespace q4t::ag {

// Floats in buckets of mb megabytes (2^20 bytes), at least one; 0 for 0.
inline size_t bucket_floats(double mb) {
  return mb > 0 ? std::max<size_t>(1, size_t(mb * double(1 << 20) / sizeof(float))) : 0;
}

class FlatGrads : public Graph::GradSink {
 public:
  // Sums floats over the ranks in place (the same call on every rank, for the same bucket).
  using SumFn = std::function<void(std::span<float>)>;
  // params: the trainable parameters, all with gradients in the backward from out. bucket_floats 0: one bucket,
  // summed after the backward on Vulkan too.
  FlatGrads(Graph& g, Var out, const std::vector<Var>& params, SumFn sum, size_t bucket_floats);
  ~FlatGrads() override;
  FlatGrads(const FlatGrads&) = delete;
  FlatGrads& operator=(const FlatGrads&) = delete;

  void arm() { armed_ = true; }
  void exchange();

  size_t bucket_count() const { return buckets_.size(); }
  bool sums_during_backward() const { return g_.grad_sink() == this; }
  // Whether the last exchange summed every bucket while the backward ran.
  bool overlapped() const { return overlapped_; }

  // Graph::GradSink
  bool armed() const override { return armed_; }
  void record_begin() override;
  void record_ready(vk::Sequence& seq, std::span<const int> params) override;
  void before_submit() override;
  void while_running() override;

 private:
  struct Bucket {
    size_t begin = 0, end = 0;  // floats of the array
    size_t params = 0;          // how many parameters' gradients it holds
    size_t recorded = 0;        // of which the recording has copied so far
    VkEvent event = VK_NULL_HANDLE;
  };
  void gather();
  void scatter();
  void sum(const Bucket& b) { sum_(std::span<float>(host_ + b.begin, b.end - b.begin)); }

  Graph& g_;
  SumFn sum_;
  std::vector<int> ids_;             // the parameters' nodes, in the array's order
  std::vector<size_t> offset_;       // per node id: its gradient's first float in the array
  static constexpr size_t kNone = ~size_t(0);
  std::vector<size_t> bucket_of_;    // per node id (kNone: not a parameter given)
  std::vector<Bucket> buckets_;
  size_t count_ = 0;
  float* host_ = nullptr;
  std::vector<float> cpu_;            // the CPU's array
  vk::Device::HostBuffer vk_host_{};  // Vulkan: the mapped array
  bool armed_ = false, summed_ = false, overlapped_ = false;
};

}  // namespace q4t::ag
