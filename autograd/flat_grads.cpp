#include "autograd/flat_grads.h"

#include <cstring>
#include <stdexcept>

namespace q4t::ag {

namespace {

// Device writes of earlier submits (shaders, copies) before this command buffer's copies, and its copies before
// what reads their bytes next (the host, shaders, copies).
void full_barrier(VkCommandBuffer cb) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                       VK_PIPELINE_STAGE_ALL_COMMANDS_BIT | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0,
                       nullptr);
}

}  // namespace

FlatGrads::FlatGrads(Graph& g, const std::vector<Var>& params, size_t extra) : g_(g), params_(params), extra_(extra) {
  for (const Var& p : params_) {
    const Tensor& grad = g_.grad(p);
    if (grad.dtype() != DType::F32 && grad.dtype() != DType::F64)
      throw GraphError("FlatGrads: the gradient of '" + g_.node(p.id).name + "' is not real");
    offsets_.push_back(count_);
    count_ += size_t(grad.numel());
  }
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    cpu_.assign(count_ + extra_, 0.0f);
    host_ = cpu_.data();
    return;
  }
  vk_host_ = be.device().make_host_buffer(std::max<size_t>(4, (count_ + extra_) * sizeof(float)), /*cached=*/true);
  host_ = static_cast<float*>(vk_host_.ptr);
  std::memset(host_, 0, (count_ + extra_) * sizeof(float));
}

FlatGrads::~FlatGrads() {
  if (vk_host_.buffer != VK_NULL_HANDLE) g_.backend().device().free_host_buffer(vk_host_);
}

void FlatGrads::gather() {
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& t = g_.grad(params_[i]);
      float* out = host_ + offsets_[i];
      if (t.dtype() == DType::F32) std::memcpy(out, t.data<float>(), size_t(t.numel()) * sizeof(float));
      else
        for (int64_t k = 0; k < t.numel(); ++k) out[k] = float(t.data<double>()[k]);
    }
    return;
  }
  be.device().run_once([&](VkCommandBuffer cb) {
    full_barrier(cb);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& t = g_.grad(params_[i]);
      const VkBufferCopy c{0, offsets_[i] * sizeof(float), size_t(t.numel()) * sizeof(float)};
      vkCmdCopyBuffer(cb, t.buffer().handle(), vk_host_.buffer, 1, &c);
    }
    full_barrier(cb);
  });
}

void FlatGrads::scatter() {
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& t = g_.grad(params_[i]);
      const float* in = host_ + offsets_[i];
      if (t.dtype() == DType::F32) std::memcpy(t.data<float>(), in, size_t(t.numel()) * sizeof(float));
      else
        for (int64_t k = 0; k < t.numel(); ++k) t.data<double>()[k] = in[k];
    }
    return;
  }
  be.device().run_once([&](VkCommandBuffer cb) {
    full_barrier(cb);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& t = g_.grad(params_[i]);
      const VkBufferCopy c{offsets_[i] * sizeof(float), 0, size_t(t.numel()) * sizeof(float)};
      vkCmdCopyBuffer(cb, vk_host_.buffer, t.buffer().handle(), 1, &c);
    }
    full_barrier(cb);
  });
}

}  // namespace q4t::ag
