#include "kernels/vulkan/pipeline.h"

#include "kernels/vulkan/shaders.h"

#include <algorithm>
#include <cstdio>

namespace q4t::vk {

namespace {
// One line of the driver's statistics of a pipeline (Device::pipeline_stats): "name: Registers 128, ...".
void print_statistics(VkDevice dev, VkPipeline pipeline, const std::string& name) {
  auto props_fn = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(dev, "vkGetPipelineExecutablePropertiesKHR"));
  auto stats_fn = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(dev, "vkGetPipelineExecutableStatisticsKHR"));
  if (!props_fn || !stats_fn) return;
  VkPipelineInfoKHR pi{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  pi.pipeline = pipeline;
  uint32_t n_exec = 0;
  props_fn(dev, &pi, &n_exec, nullptr);
  for (uint32_t e = 0; e < n_exec; ++e) {
    VkPipelineExecutableInfoKHR ei{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    ei.pipeline = pipeline;
    ei.executableIndex = e;
    uint32_t n = 0;
    stats_fn(dev, &ei, &n, nullptr);
    std::vector<VkPipelineExecutableStatisticKHR> stats(n, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    stats_fn(dev, &ei, &n, stats.data());
    std::string line = "pipeline " + name + ":";
    for (const auto& st : stats) {
      line += std::string(" ") + st.name + " ";
      switch (st.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: line += st.value.b32 ? "true" : "false"; break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: line += std::to_string(st.value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: line += std::to_string(st.value.u64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: line += std::to_string(st.value.f64); break;
        default: line += "?";
      }
      line += ";";
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}
}  // namespace

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
  writes_ = spirv_written_bindings(it->second, n_buffers);

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
  if (dev.pipeline_stats()) pci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  check(vkCreateComputePipelines(dev.handle(), dev.pipeline_cache(), 1, &pci, nullptr, &pipeline_),
        ("vkCreateComputePipelines(" + shader + ")").c_str());
  if (dev.pipeline_stats()) print_statistics(dev.handle(), pipeline_, shader);
}

std::vector<bool> spirv_written_bindings(std::span<const uint32_t> words, uint32_t n_buffers) {
  // Opcodes and enumerants of the SPIR-V specification.
  constexpr uint32_t kOpTypeStruct = 30, kOpTypePointer = 32, kOpVariable = 59, kOpDecorate = 71,
                     kOpMemberDecorate = 72;
  constexpr uint32_t kNonWritable = 24, kBinding = 33, kDescriptorSet = 34;
  constexpr uint32_t kUniform = 2, kStorageBuffer = 12;
  if (words.size() < 5 || words[0] != 0x07230203u) throw DeviceError("SPIR-V reflection: not a SPIR-V module");
  struct Id {
    int64_t binding = -1;
    uint32_t set = 0;
    bool non_writable = false;   // decorated on the id itself
    uint32_t members = 0;        // a struct type's member count
    std::vector<bool> member_nw;  // ... and which members are NonWritable
    uint32_t pointee = 0;        // a pointer type's pointee
  };
  const uint32_t bound = words[3];
  std::vector<Id> ids(bound);
  std::vector<std::pair<uint32_t, uint32_t>> vars;  // {variable, its pointer type}: buffer variables
  for (size_t i = 5; i < words.size();) {
    const uint32_t op = words[i] & 0xFFFFu, n = words[i] >> 16;
    if (n == 0 || i + n > words.size()) throw DeviceError("SPIR-V reflection: malformed instruction");
    const uint32_t* a = &words[i + 1];
    if (op == kOpDecorate && n >= 3 && a[0] < bound) {
      if (a[1] == kNonWritable) ids[a[0]].non_writable = true;
      if (a[1] == kBinding && n >= 4) ids[a[0]].binding = a[2];
      if (a[1] == kDescriptorSet && n >= 4) ids[a[0]].set = a[2];
    } else if (op == kOpMemberDecorate && n >= 4 && a[0] < bound && a[2] == kNonWritable) {
      auto& m = ids[a[0]].member_nw;
      if (m.size() <= a[1]) m.resize(a[1] + 1, false);
      m[a[1]] = true;
    } else if (op == kOpTypeStruct && n >= 2 && a[0] < bound) {
      ids[a[0]].members = n - 2;
    } else if (op == kOpTypePointer && n >= 4 && a[0] < bound) {
      ids[a[0]].pointee = a[2];
    } else if (op == kOpVariable && n >= 4 && a[1] < bound && (a[2] == kStorageBuffer || a[2] == kUniform)) {
      vars.push_back({a[1], a[0]});
    }
    i += n;
  }
  std::vector<bool> writes(n_buffers, false);
  for (const auto& [var, ptr] : vars) {
    const Id& v = ids[var];
    if (v.binding < 0 || v.set != 0 || v.binding >= int64_t(n_buffers) || v.non_writable) continue;
    const uint32_t st = ptr < bound ? ids[ptr].pointee : 0;
    const Id* block = st < bound ? &ids[st] : nullptr;
    const bool members_nw = block && block->members > 0 && block->member_nw.size() == block->members &&
                            std::all_of(block->member_nw.begin(), block->member_nw.end(), [](bool b) { return b; });
    if (!members_nw) writes[size_t(v.binding)] = true;
  }
  return writes;
}

Pipeline::~Pipeline() {
  vkDestroyPipeline(dev_.handle(), pipeline_, nullptr);
  vkDestroyPipelineLayout(dev_.handle(), layout_, nullptr);
  vkDestroyDescriptorSetLayout(dev_.handle(), set_layout_, nullptr);
  vkDestroyShaderModule(dev_.handle(), module_, nullptr);
}

}  // namespace q4t::vk
