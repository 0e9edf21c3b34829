// A compute pipeline made from an embedded shader: N storage buffers at bindings 0..N-1 of set 0, a push-constant
// block, and optional specialization constants (constant_id 0, 1, ... as uint32).
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/vulkan/device.h"

namespace q4t::vk {

class Pipeline {
 public:
  Pipeline(Device& dev, const std::string& shader, uint32_t n_buffers, uint32_t push_bytes,
           const std::vector<uint32_t>& spec_constants = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  VkPipeline handle() const { return pipeline_; }
  VkPipelineLayout layout() const { return layout_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }
  uint32_t n_buffers() const { return n_buffers_; }
  uint32_t push_bytes() const { return push_bytes_; }
  const std::string& name() const { return name_; }

 private:
  Device& dev_;
  std::string name_;
  uint32_t n_buffers_, push_bytes_;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
};

}  // namespace q4t::vk
