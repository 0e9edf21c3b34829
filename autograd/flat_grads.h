// The parameters' gradients as one flat f32 array on the host, for summing across the processes of a
// data-parallel run: gather() copies every gradient into it (in the order of the parameters given, row-major),
// scatter() copies it back. On Vulkan both are one submit of buffer copies into or out of one mapped host buffer.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "autograd/graph.h"

namespace q4t::ag {

class FlatGrads {
 public:
  // extra: floats after the gradients that the caller fills and reads (a loss to sum along, say).
  FlatGrads(Graph& g, const std::vector<Var>& params, size_t extra = 0);
  ~FlatGrads();
  FlatGrads(const FlatGrads&) = delete;
  FlatGrads& operator=(const FlatGrads&) = delete;

  // The gradients, then the extra floats.
  std::span<float> values() { return {host_, count_ + extra_}; }
  std::span<float> extra() { return {host_ + count_, extra_}; }
  size_t gradient_count() const { return count_; }

  void gather();
  void scatter();

 private:
  Graph& g_;
  std::vector<Var> params_;
  std::vector<size_t> offsets_;  // of each parameter's gradient, in floats
  size_t count_ = 0, extra_ = 0;
  float* host_ = nullptr;
  std::vector<float> cpu_;             // the CPU's array
  vk::Device::HostBuffer vk_host_{};  // Vulkan: the mapped array
};

}  // namespace q4t::ag
