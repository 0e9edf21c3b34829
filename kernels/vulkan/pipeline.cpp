#include "kernels/vulkan/pipeline.h"

#include "kernels/vulkan/shaders.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

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

std::string binding_list(const std::vector<uint32_t>& bindings) {
  if (bindings.empty()) return "none";
  std::string s;
  for (uint32_t b : bindings) s += (s.empty() ? "" : ", ") + std::to_string(b);
  return s;
}

// The layout the C++ side asks for against the shader's own. Bindings: every buffer the shader declares must lie
// in 0..n_buffers-1 (one past would be left out of the layout). C++ may give more than the shader declares:
// glslang -Os drops the buffers a shader never touches, and the FP32 attention passes leave binding 9 unused to
// share the tensor-core passes' host call. Push constants: exactly the block's size. Vulkan needs the range to
// cover the block; a longer range means C++ fields the shader never reads, and our blocks hold 4-byte scalars
// only, so a C++ struct of the same fields has no tail padding to excuse a difference.
void check_interface(const std::string& shader, const ShaderInterface& s, uint32_t n_buffers, uint32_t push_bytes) {
  if (!s.bindings.empty() && s.bindings.back() >= n_buffers)
    throw std::logic_error("pipeline '" + shader + "': the C++ code gives n_buffers = " + std::to_string(n_buffers) +
                           " (bindings " + (n_buffers ? "0.." + std::to_string(n_buffers - 1) : std::string("none")) +
                           "), the shader declares storage buffers at bindings " + binding_list(s.bindings) +
                           " of set 0");
  if (push_bytes != s.push_bytes)
    throw std::logic_error("pipeline '" + shader + "': the C++ code gives push_bytes = " + std::to_string(push_bytes) +
                           ", the shader's push-constant block is " + std::to_string(s.push_bytes) +
                           " bytes (they must be equal)");
}
}  // namespace

Pipeline::Pipeline(Device& dev, const std::string& shader, uint32_t n_buffers, uint32_t push_bytes,
                   const std::vector<uint32_t>& spec_constants)
    : dev_(dev), name_(shader), n_buffers_(n_buffers), push_bytes_(push_bytes) {
  const auto& table = shader_table();
  auto it = table.find(shader);
  if (it == table.end()) throw DeviceError("no embedded shader named '" + shader + "'");
  const ShaderInterface reflected = reflect_spirv(it->second);
  check_interface(shader, reflected, n_buffers, push_bytes);
  writes_ = reflected.writes;

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
  if (dev.pipeline_stats()) pci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  check(vkCreateComputePipelines(dev.handle(), dev.pipeline_cache(), 1, &pci, nullptr, &pipeline_),
        ("vkCreateComputePipelines(" + shader + ")").c_str());
  if (dev.pipeline_stats()) print_statistics(dev.handle(), pipeline_, shader);
}

namespace {
// Opcodes and enumerants of the SPIR-V specification.
constexpr uint32_t kOpTypeInt = 21, kOpTypeFloat = 22, kOpTypeVector = 23, kOpTypeArray = 28, kOpTypeStruct = 30,
                   kOpTypePointer = 32, kOpConstant = 43, kOpVariable = 59, kOpDecorate = 71, kOpMemberDecorate = 72;
constexpr uint32_t kArrayStride = 6, kNonWritable = 24, kBinding = 33, kDescriptorSet = 34, kOffset = 35;
constexpr uint32_t kUniform = 2, kPushConstant = 9, kStorageBuffer = 12;

// One SPIR-V id: the decorations reflection reads, and for a type or a constant the instruction that made it.
struct SpirvId {
  int64_t binding = -1;
  uint32_t set = 0;
  bool non_writable = false;            // decorated on the id itself
  std::vector<bool> member_nw;          // a struct's members decorated NonWritable
  std::vector<uint32_t> member_offset;  // ... and their Offsets
  uint32_t array_stride = 0;
  uint32_t op = 0;                      // OpType* or OpConstant
  std::vector<uint32_t> args;           // its operands after the result id (an OpConstant: its value)
};

// A buffer or push-constant variable.
struct SpirvVariable {
  uint32_t id, pointer_type, storage_class;
};

struct SpirvModule {
  std::vector<SpirvId> ids;
  std::vector<SpirvVariable> variables;
};

template <class T>
void set_at(std::vector<T>& v, uint32_t i, T value) {
  if (v.size() <= i) v.resize(i + 1, T{});
  v[i] = value;
}

SpirvModule parse_spirv(std::span<const uint32_t> words) {
  if (words.size() < 5 || words[0] != 0x07230203u) throw DeviceError("SPIR-V reflection: not a SPIR-V module");
  const uint32_t bound = words[3];
  SpirvModule m{std::vector<SpirvId>(bound), {}};
  for (size_t i = 5; i < words.size();) {
    const uint32_t op = words[i] & 0xFFFFu, n = words[i] >> 16;
    if (n == 0 || i + n > words.size()) throw DeviceError("SPIR-V reflection: malformed instruction");
    const uint32_t* a = &words[i + 1];
    if (op == kOpDecorate && n >= 3 && a[0] < bound) {
      SpirvId& id = m.ids[a[0]];
      if (a[1] == kNonWritable) id.non_writable = true;
      if (a[1] == kBinding && n >= 4) id.binding = a[2];
      if (a[1] == kDescriptorSet && n >= 4) id.set = a[2];
      if (a[1] == kArrayStride && n >= 4) id.array_stride = a[2];
    } else if (op == kOpMemberDecorate && n >= 4 && a[0] < bound) {
      if (a[2] == kNonWritable) set_at(m.ids[a[0]].member_nw, a[1], true);
      if (a[2] == kOffset && n >= 5) set_at(m.ids[a[0]].member_offset, a[1], a[3]);
    } else if ((op == kOpTypeInt || op == kOpTypeFloat || op == kOpTypeVector || op == kOpTypeArray ||
                op == kOpTypeStruct || op == kOpTypePointer) && n >= 2 && a[0] < bound) {
      m.ids[a[0]].op = op;
      m.ids[a[0]].args.assign(a + 1, a + n - 1);
    } else if (op == kOpConstant && n >= 4 && a[1] < bound) {
      m.ids[a[1]].op = op;
      m.ids[a[1]].args = {a[2]};
    } else if (op == kOpVariable && n >= 4 && a[0] < bound && a[1] < bound &&
               (a[2] == kStorageBuffer || a[2] == kUniform || a[2] == kPushConstant)) {
      m.variables.push_back({a[1], a[0], a[2]});
    }
    i += n;
  }
  return m;
}

// The bytes a type spans in an explicitly laid-out block: scalars, vectors, arrays and structs (all a push-constant
// block of ours holds); a struct ends at the end of its last member.
uint32_t type_bytes(const SpirvModule& m, uint32_t type) {
  const SpirvId* t = type < m.ids.size() ? &m.ids[type] : nullptr;
  const size_t n_args = t ? t->args.size() : 0;
  if (t && (t->op == kOpTypeInt || t->op == kOpTypeFloat) && n_args >= 1) return t->args[0] / 8;
  if (t && t->op == kOpTypeVector && n_args >= 2) return t->args[1] * type_bytes(m, t->args[0]);
  if (t && t->op == kOpTypeArray && n_args >= 2 && t->args[1] < m.ids.size() &&
      m.ids[t->args[1]].op == kOpConstant) {
    const uint32_t stride = t->array_stride ? t->array_stride : type_bytes(m, t->args[0]);
    return m.ids[t->args[1]].args[0] * stride;
  }
  if (t && t->op == kOpTypeStruct) {
    uint32_t end = 0;
    for (size_t i = 0; i < n_args; ++i) {
      const uint32_t offset = i < t->member_offset.size() ? t->member_offset[i] : 0;
      end = std::max(end, offset + type_bytes(m, t->args[i]));
    }
    return end;
  }
  throw DeviceError("SPIR-V reflection: a push-constant member of a type it cannot size (id " +
                    std::to_string(type) + ", opcode " + std::to_string(t ? t->op : 0) + ")");
}

// The type a pointer type points to (0 when it is not a pointer).
uint32_t pointee(const SpirvModule& m, uint32_t ptr) {
  const SpirvId& p = m.ids[ptr];
  return p.op == kOpTypePointer && p.args.size() >= 2 && p.args[1] < m.ids.size() ? p.args[1] : 0;
}
}  // namespace

ShaderInterface reflect_spirv(std::span<const uint32_t> words) {
  const SpirvModule m = parse_spirv(words);
  ShaderInterface out;
  for (const SpirvVariable& var : m.variables) {
    const uint32_t block = pointee(m, var.pointer_type);
    if (var.storage_class == kPushConstant) {
      out.push_bytes = std::max(out.push_bytes, type_bytes(m, block));
      continue;
    }
    const SpirvId& v = m.ids[var.id];
    if (v.binding < 0 || v.set != 0) continue;
    const auto b = uint32_t(v.binding);
    if (!std::binary_search(out.bindings.begin(), out.bindings.end(), b))
      out.bindings.insert(std::upper_bound(out.bindings.begin(), out.bindings.end(), b), b);
    if (out.writes.size() <= b) out.writes.resize(b + 1, false);
    const SpirvId& st = m.ids[block];
    const size_t members = st.op == kOpTypeStruct ? st.args.size() : 0;
    const bool members_nw = members > 0 && st.member_nw.size() == members &&
                            std::all_of(st.member_nw.begin(), st.member_nw.end(), [](bool nw) { return nw; });
    if (!v.non_writable && !members_nw) out.writes[b] = true;
  }
  return out;
}

Pipeline::~Pipeline() {
  vkDestroyPipeline(dev_.handle(), pipeline_, nullptr);
  vkDestroyPipelineLayout(dev_.handle(), layout_, nullptr);
  vkDestroyDescriptorSetLayout(dev_.handle(), set_layout_, nullptr);
  vkDestroyShaderModule(dev_.handle(), module_, nullptr);
}

}  // namespace q4t::vk
