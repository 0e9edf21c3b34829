#include "autograd/flat_grads.h"

#include <cstring>
#include <thread>
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

FlatGrads::FlatGrads(Graph& g, Var out, const std::vector<Var>& params, SumFn sum, size_t bucket_floats)
    : g_(g), sum_(std::move(sum)) {
  std::vector<char> wanted(size_t(g.size()), 0);
  for (const Var& p : params) {
    const Tensor& grad = g_.grad(p);
    if (grad.dtype() != DType::F32 && grad.dtype() != DType::F64)
      throw GraphError("FlatGrads: the gradient of '" + g_.node(p.id).name + "' is not real");
    wanted[size_t(p.id)] = 1;
  }
  offset_.assign(size_t(g.size()), 0);
  bucket_of_.assign(size_t(g.size()), kNone);
  for (int id : g.params_by_readiness(out)) {
    if (!wanted[size_t(id)]) continue;
    if (buckets_.empty() || (bucket_floats > 0 && buckets_.back().end - buckets_.back().begin >= bucket_floats))
      buckets_.push_back({count_, count_});
    offset_[size_t(id)] = count_;
    bucket_of_[size_t(id)] = buckets_.size() - 1;
    ids_.push_back(id);
    count_ += size_t(g_.node(id).grad.numel());
    buckets_.back().end = count_;
    ++buckets_.back().params;
  }
  if (ids_.size() != params.size()) throw GraphError("FlatGrads: a parameter is not one of the graph's");
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    cpu_.assign(std::max<size_t>(count_, 1), 0.0f);
    host_ = cpu_.data();
    return;
  }
  vk::Device& dev = be.device();
  vk_host_ = dev.make_host_buffer(std::max<size_t>(4, count_ * sizeof(float)), /*cached=*/true);
  host_ = static_cast<float*>(vk_host_.ptr);
  std::memset(host_, 0, count_ * sizeof(float));
  if (bucket_floats == 0) return;
  for (Bucket& b : buckets_) {
    VkEventCreateInfo ei{VK_STRUCTURE_TYPE_EVENT_CREATE_INFO};
    vk::check(vkCreateEvent(dev.handle(), &ei, nullptr, &b.event), "vkCreateEvent");
  }
  g_.set_grad_sink(this);
}

FlatGrads::~FlatGrads() {
  if (g_.backend().is_cpu()) return;
  if (g_.grad_sink() == this) g_.set_grad_sink(nullptr);
  for (Bucket& b : buckets_)
    if (b.event != VK_NULL_HANDLE) vkDestroyEvent(g_.backend().device().handle(), b.event, nullptr);
  if (vk_host_.buffer != VK_NULL_HANDLE) g_.backend().device().free_host_buffer(vk_host_);
}

void FlatGrads::exchange() {
  armed_ = false;
  overlapped_ = summed_;
  if (!summed_) {
    gather();
    for (const Bucket& b : buckets_) sum(b);
  }
  summed_ = false;
  scatter();
}

void FlatGrads::record_begin() {
  for (Bucket& b : buckets_) b.recorded = 0;
}

void FlatGrads::record_ready(vk::Sequence& seq, std::span<const int> params) {
  for (int id : params) {
    if (bucket_of_[size_t(id)] == kNone) continue;
    const Tensor& t = g_.node(id).grad;
    seq.copy_to_host(vk_host_, offset_[size_t(id)] * sizeof(float), t.buffer(), size_t(t.numel()) * sizeof(float));
    Bucket& b = buckets_[bucket_of_[size_t(id)]];
    if (++b.recorded == b.params) seq.signal_host(b.event, vk_host_, b.begin * sizeof(float), b.end * sizeof(float));
  }
}

void FlatGrads::before_submit() {
  for (const Bucket& b : buckets_) vk::check(vkResetEvent(g_.backend().device().handle(), b.event), "vkResetEvent");
}

// The armed backward: each bucket summed once the GPU has copied it out.
void FlatGrads::while_running() {
  armed_ = false;
  VkDevice dev = g_.backend().device().handle();
  for (const Bucket& b : buckets_) {
    for (;;) {
      const VkResult r = vkGetEventStatus(dev, b.event);
      if (r == VK_EVENT_SET) break;
      if (r != VK_EVENT_RESET) vk::check(r, "vkGetEventStatus");
      std::this_thread::yield();
    }
    sum(b);
  }
  summed_ = true;
}

void FlatGrads::gather() {
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    for (int id : ids_) {
      const Tensor& t = g_.node(id).grad;
      float* out = host_ + offset_[size_t(id)];
      if (t.dtype() == DType::F32) std::memcpy(out, t.data<float>(), size_t(t.numel()) * sizeof(float));
      else
        for (int64_t k = 0; k < t.numel(); ++k) out[k] = float(t.data<double>()[k]);
    }
    return;
  }
  be.device().run_once([&](VkCommandBuffer cb) {
    full_barrier(cb);
    for (int id : ids_) {
      const Tensor& t = g_.node(id).grad;
      const VkBufferCopy c{0, offset_[size_t(id)] * sizeof(float), size_t(t.numel()) * sizeof(float)};
      vkCmdCopyBuffer(cb, t.buffer().handle(), vk_host_.buffer, 1, &c);
    }
    full_barrier(cb);
  });
}

void FlatGrads::scatter() {
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    for (int id : ids_) {
      const Tensor& t = g_.node(id).grad;
      const float* in = host_ + offset_[size_t(id)];
      if (t.dtype() == DType::F32) std::memcpy(t.data<float>(), in, size_t(t.numel()) * sizeof(float));
      else
        for (int64_t k = 0; k < t.numel(); ++k) t.data<double>()[k] = in[k];
    }
    return;
  }
  be.device().run_once([&](VkCommandBuffer cb) {
    full_barrier(cb);
    for (int id : ids_) {
      const Tensor& t = g_.node(id).grad;
      const VkBufferCopy c{offset_[size_t(id)] * sizeof(float), 0, size_t(t.numel()) * sizeof(float)};
      vkCmdCopyBuffer(cb, vk_host_.buffer, t.buffer().handle(), 1, &c);
    }
    full_barrier(cb);
  });
}

}  // namespace q4t::ag
