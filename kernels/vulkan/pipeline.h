// A compute pipeline made from an embedded shader: N storage buffers at bindings 0..N-1 of set 0, a push-constant
// block, and optional specialization constants (constant_id 0, 1, ... as uint32). The constructor checks N and the
// push size against the shader's own SPIR-V (reflect_spirv), so a drift between C++ and GLSL fails at creation.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/vulkan/device.h"

namespace q4t::vk {

class Pipeline {
 public:
  // Throws std::logic_error naming the shader and both values when the shader declares a storage buffer outside
  // bindings 0..n_buffers-1 of set 0, or a push-constant block of other than push_bytes (0: none).
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
  // Whether the shader may write the buffer at `binding` (its SPIR-V has a storage-buffer variable there not
  // declared readonly). Sequence places barriers from this.
  bool writes(uint32_t binding) const { return binding < writes_.size() && writes_[binding]; }

 private:
  Device& dev_;
  std::string name_;
  uint32_t n_buffers_, push_bytes_;
  std::vector<bool> writes_;  // per binding
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
};

// What a SPIR-V module declares for the host: its storage buffers in descriptor set 0 and its push constants.
struct ShaderInterface {
  std::vector<uint32_t> bindings;  // the bindings of set 0 that hold a buffer, ascending, each once
  // Per binding 0..max(bindings): whether the module may write it. A binding is read-only when every variable
  // bound there is NonWritable, on the variable or on each member of its block; a binding no variable uses is
  // neither read nor written (false).
  std::vector<bool> writes;
  uint32_t push_bytes = 0;  // the push-constant block's size (the end of its last member); 0 without a block
};
// Throws DeviceError when the words are not a SPIR-V module or a push-constant member has a type it cannot size.
ShaderInterface reflect_spirv(std::span<const uint32_t> words);

}  // namespace q4t::vk
