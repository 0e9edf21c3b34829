#include "kernels/vulkan/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace q4t::vk {

namespace {

const char* result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    default: return "VkResult error";
  }
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

// Lower is better: the order in which a device is picked when none is named.
int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

const char* kNoDevice =
    "no Vulkan device found (looked for Vulkan drivers through the loader: VK_DRIVER_FILES / "
    "/usr/share/vulkan/icd.d); install your GPU's Vulkan driver, or mesa-vulkan-drivers for the CPU device "
    "lavapipe, or use --device cpu";

bool layer_available(const char* name) {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  return std::any_of(layers.begin(), layers.end(),
                     [&](const VkLayerProperties& l) { return std::strcmp(l.layerName, name) == 0; });
}

bool layer_has_extension(const char* layer, const char* ext) {
  uint32_t n = 0;
  vkEnumerateInstanceExtensionProperties(layer, &n, nullptr);
  std::vector<VkExtensionProperties> props(n);
  vkEnumerateInstanceExtensionProperties(layer, &n, props.data());
  return std::any_of(props.begin(), props.end(),
                     [&](const VkExtensionProperties& p) { return std::strcmp(p.extensionName, ext) == 0; });
}

VkInstance create_instance(bool validation) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "q4tune";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  const char* layer = "VK_LAYER_KHRONOS_validation";
  const char* exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
  // Synchronization validation too: it reports a command that touches bytes another command may still be using
  // (a barrier Sequence left out).
  const VkValidationFeatureEnableEXT sync = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
  VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
  features.enabledValidationFeatureCount = 1;
  features.pEnabledValidationFeatures = &sync;
  if (validation) {
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = &layer;
    ci.enabledExtensionCount = layer_has_extension(layer, exts[1]) ? 2 : 1;
    ci.ppEnabledExtensionNames = exts;
    if (ci.enabledExtensionCount == 2) ci.pNext = &features;
  }
  VkInstance inst = VK_NULL_HANDLE;
  VkResult r = vkCreateInstance(&ci, nullptr, &inst);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER) throw DeviceError(kNoDevice);
  check(r, "vkCreateInstance");
  return inst;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance inst) {
  uint32_t n = 0;
  check(vkEnumeratePhysicalDevices(inst, &n, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devs(n);
  check(vkEnumeratePhysicalDevices(inst, &n, devs.data()), "vkEnumeratePhysicalDevices");
  return devs;
}

}  // namespace

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS)
    throw DeviceError(std::string(what) + " failed: " + result_name(r) + " (" + std::to_string(int(r)) + ")");
}

DeviceSpec DeviceSpec::parse(const std::string& s) {
  DeviceSpec d;
  if (s == "auto") return d;
  if (s == "cpu") { d.kind = Kind::Cpu; return d; }
  if (s == "vulkan") { d.kind = Kind::Vulkan; return d; }
  if (s.rfind("vulkan:", 0) == 0) {
    const std::string n = s.substr(7);
    if (!n.empty() && n.size() < 6 && std::all_of(n.begin(), n.end(), ::isdigit)) {
      d.kind = Kind::Vulkan;
      d.index = std::stoi(n);
      return d;
    }
  }
  throw DeviceError("--device: '" + s + "' is not one of auto, cpu, vulkan, vulkan:N");
}

VkBool32 VKAPI_PTR debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                  VkDebugUtilsMessageTypeFlagsEXT, const VkDebugUtilsMessengerCallbackDataEXT* data,
                                  void* user) {
  auto* dev = static_cast<Device*>(user);
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    std::lock_guard<std::mutex> lock(dev->messages_mutex_);
    dev->messages_.emplace_back(data->pMessage ? data->pMessage : "(no message)");
  }
  return VK_FALSE;
}

namespace {
std::vector<VkExtensionProperties> device_extensions(VkPhysicalDevice pd) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data());
  return exts;
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  return std::any_of(exts.begin(), exts.end(),
                     [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

// Fills a chain of feature structs (sType set, pNext linking the rest) from the device.
template <class Features>
void query_features(VkPhysicalDevice pd, Features& first) {
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &first;
  vkGetPhysicalDeviceFeatures2(pd, &f2);
}

// Whether a device has what the tensor-core kernels (*_coop.comp, mixed_gemm.comp with COOP) need:
// VK_NV_cooperative_matrix with 16x16x16 f16 x f16 + f32 on subgroups of 32, f16 arithmetic and the Vulkan memory
// model.
bool coop_matrix_supported(VkInstance inst, VkPhysicalDevice pd) {
  VkPhysicalDeviceSubgroupProperties sg{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &sg;
  vkGetPhysicalDeviceProperties2(pd, &p2);
  const auto exts = device_extensions(pd);
  for (const char* e : {VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME,
                        VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME})
    if (!has_extension(exts, e)) return false;
  if (sg.subgroupSize != 32) return false;
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coop_f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceShaderFloat16Int8FeaturesKHR f16_f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES_KHR};
  VkPhysicalDeviceVulkanMemoryModelFeaturesKHR vmm_f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES_KHR};
  coop_f.pNext = &f16_f;
  f16_f.pNext = &vmm_f;
  query_features(pd, coop_f);
  auto props_fn = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  bool shape = false;
  if (props_fn) {
    uint32_t n = 0;
    props_fn(pd, &n, nullptr);
    std::vector<VkCooperativeMatrixPropertiesNV> cm(n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
    props_fn(pd, &n, cm.data());
    for (const auto& c : cm)
      shape = shape || (c.MSize == 16 && c.NSize == 16 && c.KSize == 16 && c.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                        c.BType == VK_COMPONENT_TYPE_FLOAT16_NV && c.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                        c.DType == VK_COMPONENT_TYPE_FLOAT32_NV && c.scope == VK_SCOPE_SUBGROUP_NV);
  }
  return shape && coop_f.cooperativeMatrix && f16_f.shaderFloat16 && vmm_f.vulkanMemoryModel;
}

// VK_KHR_cooperative_matrix (Vulkan 1.3.255; Debian 12's headers are 1.3.239): its registered structure types and
// the structures' layouts as the specification gives them. Component types and scopes have NV's values.
constexpr const char* kCoopKhrExtension = "VK_KHR_cooperative_matrix";
constexpr auto kCoopKhrFeaturesType = VkStructureType(1000506000);
constexpr auto kCoopKhrPropertiesType = VkStructureType(1000506001);
struct CoopKhrFeatures {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
};
struct CoopKhrProperties {
  VkStructureType sType;
  void* pNext;
  uint32_t MSize, NSize, KSize;
  VkComponentTypeNV AType, BType, CType, ResultType;
  VkBool32 saturatingAccumulation;
  VkScopeNV scope;
};
using CoopKhrPropertiesFn = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*, CoopKhrProperties*);

// Whether the device also has VK_KHR_cooperative_matrix with the same 16x16x16 f16 x f16 + f32 subgroup shape (the
// *_khr kernels, kernels/spirv/coop_khr.h). The environment variable Q4T_COOP_NV_ONLY keeps the NV kernels.
bool coop_khr_supported(VkInstance inst, VkPhysicalDevice pd, const std::vector<VkExtensionProperties>& exts) {
  if (std::getenv("Q4T_COOP_NV_ONLY") || !has_extension(exts, kCoopKhrExtension)) return false;
  CoopKhrFeatures f{kCoopKhrFeaturesType};
  query_features(pd, f);
  auto props_fn = reinterpret_cast<CoopKhrPropertiesFn>(
      vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
  if (!f.cooperativeMatrix || !props_fn) return false;
  uint32_t n = 0;
  props_fn(pd, &n, nullptr);
  std::vector<CoopKhrProperties> cm(n, CoopKhrProperties{kCoopKhrPropertiesType});
  props_fn(pd, &n, cm.data());
  for (const auto& c : cm)
    if (c.MSize == 16 && c.NSize == 16 && c.KSize == 16 && c.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
        c.BType == VK_COMPONENT_TYPE_FLOAT16_NV && c.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
        c.ResultType == VK_COMPONENT_TYPE_FLOAT32_NV && c.scope == VK_SCOPE_SUBGROUP_NV)
      return true;
  return false;
}

// Device `index` of `devs`, or with index < 0 the best by type (type_rank; the first of equals).
VkPhysicalDevice pick_physical_device(const std::vector<VkPhysicalDevice>& devs, int index) {
  if (devs.empty()) throw DeviceError(kNoDevice);
  if (index >= 0) {
    if (index >= int(devs.size()))
      throw DeviceError("--device vulkan:" + std::to_string(index) + ": only " + std::to_string(devs.size()) +
                        " Vulkan device(s) present (see `q4tune devices`)");
    return devs[index];
  }
  VkPhysicalDevice best_pd = VK_NULL_HANDLE;
  int best = 99;
  for (VkPhysicalDevice pd : devs) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    if (type_rank(p.deviceType) < best) { best = type_rank(p.deviceType); best_pd = pd; }
  }
  return best_pd;
}
}  // namespace

std::vector<PhysicalDeviceInfo> Device::list() {
  VkInstance inst = create_instance(false);
  std::vector<PhysicalDeviceInfo> out;
  const auto devs = physical_devices(inst);
  for (uint32_t i = 0; i < devs.size(); ++i) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(devs[i], &p);
    out.push_back({i, p.deviceName, type_name(p.deviceType), p.apiVersion, coop_matrix_supported(inst, devs[i])});
  }
  vkDestroyInstance(inst, nullptr);
  return out;
}

std::unique_ptr<Device> Device::open(const Options& opt) {
  std::unique_ptr<Device> d(new Device());
  d->validation_ = opt.validation && layer_available("VK_LAYER_KHRONOS_validation");
  d->instance_ = create_instance(d->validation_);
  if (d->validation_) d->create_messenger();
  d->physical_ = pick_physical_device(physical_devices(d->instance_), opt.index);
  d->read_properties();
  d->probe_optional_features();
  d->create_logical_device();
  return d;
}

void Device::create_messenger() {
  auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
      vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
  VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                   VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  mi.pfnUserCallback = debug_callback;
  mi.pUserData = this;
  if (create) check(create(instance_, &mi, nullptr, &messenger_), "vkCreateDebugUtilsMessengerEXT");
}

void Device::read_properties() {
  vkGetPhysicalDeviceProperties(physical_, &props_);
  vkGetPhysicalDeviceMemoryProperties(physical_, &mem_props_);
  name_ = props_.deviceName;
  if (VK_API_VERSION_MINOR(props_.apiVersion) < 1 && VK_API_VERSION_MAJOR(props_.apiVersion) == 1)
    throw DeviceError(name_ + ": Vulkan 1.1 is required (device reports 1.0)");

  VkPhysicalDeviceSubgroupProperties sg{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &sg;
  vkGetPhysicalDeviceProperties2(physical_, &p2);
  subgroup_size_ = sg.subgroupSize;
  const VkSubgroupFeatureFlags need =
      VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
  if ((sg.supportedOperations & need) != need || !(sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT))
    throw DeviceError(name_ + ": compute shaders lack subgroup arithmetic or shuffles, which q4tune's kernels need");

  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, qf.data());
  bool found = false;
  for (uint32_t i = 0; i < nq && !found; ++i)
    if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) { queue_family_ = i; found = true; }
  if (!found) throw DeviceError(name_ + ": no compute queue");
  timestamps_ = qf[queue_family_].timestampValidBits > 0 && props_.limits.timestampPeriod > 0;
}

void Device::probe_optional_features() {
  const auto exts = device_extensions(physical_);
  // Tensor cores: every extension and feature the *_coop.comp kernels use, and the one matrix shape they use.
  coop_matrix_ = coop_matrix_supported(instance_, physical_);
  coop_khr_ = coop_matrix_ && coop_khr_supported(instance_, physical_, exts);
  // 8-bit integer dot products (the *_gemv_dot.comp kernels): the extension and its one feature.
  if (has_extension(exts, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) {
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot_f{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
    query_features(physical_, dot_f);
    integer_dot_ = dot_f.shaderIntegerDotProduct;
  }
  // f16 arithmetic in shaders: part of the tensor-core set above, else on its own where the device has it.
  if (coop_matrix_) {
    float16_ = true;
  } else if (has_extension(exts, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME)) {
    VkPhysicalDeviceShaderFloat16Int8FeaturesKHR half_f{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES_KHR};
    query_features(physical_, half_f);
    float16_ = half_f.shaderFloat16;
  }
  // Pipeline statistics, for kernel development only (Device::pipeline_stats).
  if (std::getenv("Q4T_PIPELINE_STATS") && has_extension(exts, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) {
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR stats_f{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
    query_features(physical_, stats_f);
    pipeline_stats_ = stats_f.pipelineExecutableInfo;
  }
}

void Device::create_logical_device() {
  // The features to enable, each optional set chained in front of the others where probe_optional_features found it.
  VkPhysicalDeviceVulkanMemoryModelFeaturesKHR vmm_f{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES_KHR, nullptr, VK_TRUE, VK_FALSE, VK_FALSE};
  VkPhysicalDeviceShaderFloat16Int8FeaturesKHR f16_f{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES_KHR, &vmm_f, VK_TRUE, VK_FALSE};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coop_f{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, &f16_f, VK_TRUE, VK_FALSE};
  VkPhysicalDeviceShaderFloat16Int8FeaturesKHR half_f{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES_KHR, nullptr, VK_TRUE, VK_FALSE};
  VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot_f{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR, nullptr, VK_TRUE};
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR stats_f{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, nullptr, VK_TRUE};

  float prio = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &prio;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  std::vector<const char*> enabled;
  if (coop_matrix_) {
    dci.pNext = &coop_f;
    enabled = {VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME,
               VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME};
  }
  CoopKhrFeatures coop_khr_f{kCoopKhrFeaturesType, nullptr, VK_TRUE, VK_FALSE};
  if (coop_khr_) {
    coop_khr_f.pNext = const_cast<void*>(dci.pNext);
    dci.pNext = &coop_khr_f;
    enabled.push_back(kCoopKhrExtension);
  }
  if (float16_ && !coop_matrix_) {
    half_f.pNext = const_cast<void*>(dci.pNext);
    dci.pNext = &half_f;
    enabled.push_back(VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
  }
  if (integer_dot_) {
    dot_f.pNext = const_cast<void*>(dci.pNext);
    dci.pNext = &dot_f;
    enabled.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
  }
  if (pipeline_stats_) {
    stats_f.pNext = const_cast<void*>(dci.pNext);
    dci.pNext = &stats_f;
    enabled.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  }
  dci.enabledExtensionCount = uint32_t(enabled.size());
  dci.ppEnabledExtensionNames = enabled.data();
  check(vkCreateDevice(physical_, &dci, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = queue_family_;
  check(vkCreateCommandPool(device_, &pci, nullptr, &command_pool_), "vkCreateCommandPool");
  VkPipelineCacheCreateInfo cci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  check(vkCreatePipelineCache(device_, &cci, nullptr, &pipeline_cache_), "vkCreatePipelineCache");
}

Device::~Device() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    free_host_buffer(staging_);
    vkDestroyPipelineCache(device_, pipeline_cache_, nullptr);
    vkDestroyCommandPool(device_, command_pool_, nullptr);
    vkDestroyDevice(device_, nullptr);
  }
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

std::vector<std::string> Device::validation_messages() const {
  std::lock_guard<std::mutex> lock(messages_mutex_);
  return messages_;
}

uint32_t Device::pick_memory_type(uint32_t type_bits, bool* host_visible) const {
  int fallback = -1;
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i) {
    if (!(type_bits & (1u << i))) continue;
    const VkMemoryPropertyFlags f = mem_props_.memoryTypes[i].propertyFlags;
    if (!(f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) continue;
    if (!(f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) { *host_visible = false; return i; }
    const VkMemoryPropertyFlags mapped = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if (fallback < 0 && (f & mapped) == mapped) fallback = int(i);
  }
  if (fallback < 0) throw DeviceError(name_ + ": no device-local memory type for a storage buffer");
  *host_visible = true;
  return uint32_t(fallback);
}

Device::HostBuffer Device::make_host_buffer(size_t bytes, bool cached) {
  HostBuffer b;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = std::max<size_t>(bytes, 4);
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(vkCreateBuffer(device_, &bi, nullptr, &b.buffer), "vkCreateBuffer (staging)");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, b.buffer, &req);
  const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int type = -1;
  for (const VkMemoryPropertyFlags extra : {VkMemoryPropertyFlags(cached ? VK_MEMORY_PROPERTY_HOST_CACHED_BIT : 0), 0u})
    for (uint32_t i = 0; i < mem_props_.memoryTypeCount && type < 0; ++i)
      if ((req.memoryTypeBits & (1u << i)) && (mem_props_.memoryTypes[i].propertyFlags & (want | extra)) == (want | extra))
        type = int(i);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = uint32_t(type);
  VkResult r = type < 0 ? VK_ERROR_FEATURE_NOT_PRESENT : vkAllocateMemory(device_, &ai, nullptr, &b.memory);
  if (r == VK_SUCCESS) r = vkBindBufferMemory(device_, b.buffer, b.memory, 0);
  if (r == VK_SUCCESS) r = vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.ptr);
  if (r != VK_SUCCESS) {
    free_host_buffer(b);
    throw DeviceError(name_ + (type < 0 ? ": no host-visible memory for staging"
                                        : ": cannot allocate " + std::to_string(bytes) + " bytes of staging memory"));
  }
  return b;
}

void Device::free_host_buffer(HostBuffer& b) {
  if (b.buffer) vkDestroyBuffer(device_, b.buffer, nullptr);
  if (b.memory) vkFreeMemory(device_, b.memory, nullptr);
  b = {};
}

void Device::with_staging(size_t bytes, const std::function<void(const HostBuffer&)>& fn) {
  std::lock_guard<std::mutex> lock(staging_mutex_);
  if (staging_bytes_ < bytes) {
    free_host_buffer(staging_);
    staging_bytes_ = 0;
    const size_t grown = std::max<size_t>(bytes, 64 << 10);
    staging_ = make_host_buffer(grown);
    staging_bytes_ = grown;
  }
  fn(staging_);
}

void Device::run_once(const std::function<void(VkCommandBuffer)>& fn) {
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = command_pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cb;
  check(vkAllocateCommandBuffers(device_, &ai, &cb), "vkAllocateCommandBuffers");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vkBeginCommandBuffer(cb, &bi);
  fn(cb);
  vkEndCommandBuffer(cb);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VkFence fence;
  check(vkCreateFence(device_, &fci, nullptr, &fence), "vkCreateFence");
  VkResult r = vkQueueSubmit(queue_, 1, &si, fence);
  if (r == VK_SUCCESS) r = vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX);
  vkDestroyFence(device_, fence, nullptr);
  vkFreeCommandBuffers(device_, command_pool_, 1, &cb);
  check(r, "one-time submit");
}

void Device::note_alloc(int64_t bytes) {
  bytes_now_ += bytes;
  bytes_peak_ = std::max(bytes_peak_, bytes_now_);
}

}  // namespace q4t::vk
