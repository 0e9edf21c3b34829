#include "kernels/vulkan/pipeline.h"

#include "kernels/vulkan/shaders.h"

namespace q4t::vk {

Pipeline::Pipeline(Device& dev, const std::string& shader, uint32_t n_buffers, uint32_t push_bytes,
                   const std::vector<uint32_t>& spec_constants)
    : dev_(dev), name_(shader), n_buffers_(n_buffers), push_bytes_(push_bytes) {
  const auto& table = shader_table();
  auto it = table.find(shader);
  if (it == table.end()) throw DeviceError("no embedded shader named '" + shader + "'");

  VkShaderModuleCreateInfo mci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mci.codeSize = it->second.size() * sizeof(uint32_t);
  mci.pCode = it->second.data();
  check(vkCreateShaderModule(dev.handle(), &mci, nullptr, &module_), "vkCreateShaderModule");

  std::vector<VkDescriptorSetLayoutBinding> bindings(n_buffers);
  for (uint32_t i = 0; i < n_buffers; ++i)
    bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo sci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  sci.bindingCount = n_buffers;
  sci.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(dev.handle(), &sci, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");

  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo lci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  lci.setLayoutCount = 1;
  lci.pSetLayouts = &set_layout_;
  lci.pushConstantRangeCount = push_bytes ? 1 : 0;
  lci.pPushConstantRanges = &range;
  check(vkCreatePipelineLayout(dev.handle(), &lci, nullptr, &layout_), "vkCreatePipelineLayout");

  std::vector<VkSpecializationMapEntry> entries(spec_constants.size());
  for (uint32_t i = 0; i < entries.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo spec{uint32_t(entries.size()), entries.data(), spec_constants.size() * 4,
                            spec_constants.data()};
  VkComputePipelineCreateInfo pci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  pci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  pci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  pci.stage.module = module_;
  pci.stage.pName = "main";
  pci.stage.pSpecializationInfo = spec_constants.empty() ? nullptr : &spec;
  pci.layout = layout_;
  check(vkCreateComputePipelines(dev.handle(), dev.pipeline_cache(), 1, &pci, nullptr, &pipeline_),
        ("vkCreateComputePipelines(" + shader + ")").c_str());
}

Pipeline::~Pipeline() {
  vkDestroyPipeline(dev_.handle(), pipeline_, nullptr);
  vkDestroyPipelineLayout(dev_.handle(), layout_, nullptr);
  vkDestroyDescriptorSetLayout(dev_.handle(), set_layout_, nullptr);
  vkDestroyShaderModule(dev_.handle(), module_, nullptr);
}

}  // namespace q4t::vk
