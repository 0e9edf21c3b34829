// Vulkan instance + one logical device with a compute queue. One owner (std::unique_ptr<Device>); buffers,
// pipelines and sequences borrow it and must not outlive it.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace q4t::vk {

// No usable device, a failed Vulkan call, or a bad --device string.
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A buffer or memory larger than the device can make or hold.
struct OutOfMemoryError : DeviceError {
  using DeviceError::DeviceError;
};

// Throws DeviceError naming the call and the VkResult.
void check(VkResult r, const char* what);

// What --device asks for: "cpu", "vulkan" (the best Vulkan device), "vulkan:N" (device N of `q4tune devices`),
// or "auto" (the best Vulkan device, falling back to the CPU when there is none).
struct DeviceSpec {
  enum class Kind { Auto, Cpu, Vulkan } kind = Kind::Auto;
  int index = -1;  // -1: best available
  static DeviceSpec parse(const std::string& s);  // throws DeviceError
};

struct PhysicalDeviceInfo {
  uint32_t index;
  std::string name;
  std::string type;  // "discrete", "integrated", "virtual", "cpu", "other"
  uint32_t api_version;
  bool coop_matrix;  // tensor-core matrix products (Device::coop_matrix)
};

class Device {
 public:
  struct Options {
    int index = -1;           // -1: discrete GPU first, then integrated, virtual, CPU (lavapipe)
    bool validation = false;  // enable VK_LAYER_KHRONOS_validation (and its synchronization checks) when installed
  };
  static std::unique_ptr<Device> open(const Options& opt);
  // Every Vulkan physical device on this machine, in Vulkan's order (the N of vulkan:N).
  static std::vector<PhysicalDeviceInfo> list();
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }
  VkPipelineCache pipeline_cache() const { return pipeline_cache_; }
  const std::string& name() const { return name_; }
  const VkPhysicalDeviceProperties& properties() const { return props_; }
  uint32_t subgroup_size() const { return subgroup_size_; }
  bool timestamps_supported() const { return timestamps_; }
  // Tensor-core matrix products (VK_NV_cooperative_matrix with 16x16x16 f16 x f16 + f32 on subgroups of 32,
  // f16 arithmetic and the Vulkan memory model), enabled at open when the device has them all.
  bool coop_matrix() const { return coop_matrix_; }
  // With coop_matrix(): the device also has VK_KHR_cooperative_matrix with that shape, and the mixed GEMMs run
  // their _khr twins (kernels/spirv/coop_khr.h). Off with the environment variable Q4T_COOP_NV_ONLY set.
  bool coop_matrix_khr() const { return coop_khr_; }
  // Whether shaders may use SPV_KHR_integer_dot_product (VK_KHR_shader_integer_dot_product is enabled).
  bool integer_dot() const { return integer_dot_; }
  // Whether shaders may use f16 arithmetic (shaderFloat16, enabled at open when the device has it).
  bool float16() const { return float16_; }
  // Whether pipelines report their compiled statistics (registers, spills, shared memory): with the environment
  // variable Q4T_PIPELINE_STATS set and VK_KHR_pipeline_executable_properties on the device, every pipeline built
  // prints them to stderr, one line each (kernel development: no device time spent guessing).
  bool pipeline_stats() const { return pipeline_stats_; }
  double timestamp_period_ns() const { return props_.limits.timestampPeriod; }
  bool validation_enabled() const { return validation_; }
  // Validation-layer errors and warnings seen so far (tests assert there are none).
  std::vector<std::string> validation_messages() const;

  // Memory type for a buffer: device-local, preferring one that is not host-visible; sets *host_visible.
  uint32_t pick_memory_type(uint32_t type_bits, bool* host_visible) const;
  // Records with fn into a one-time command buffer, submits it and waits.
  void run_once(const std::function<void(VkCommandBuffer)>& fn);

  // A host-visible, coherent buffer for transfers (TRANSFER_SRC and _DST), mapped; free it with free_host_buffer.
  struct HostBuffer {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    void* ptr = nullptr;
  };
  // cached: prefer memory the CPU caches (HOST_CACHED), for buffers the host reads in bulk; uncached host-visible
  // memory is write-combined on discrete GPUs, quick to write and slow to read.
  HostBuffer make_host_buffer(size_t bytes, bool cached = false);
  void free_host_buffer(HostBuffer& b);
  // Runs fn with a host buffer of at least `bytes` that the device keeps and reuses (grown on demand), under a
  // lock: the per-step uploads and downloads of a training step, without an allocation each.
  void with_staging(size_t bytes, const std::function<void(const HostBuffer&)>& fn);

  // Accounting of device memory allocated through Buffer (bytes now and peak since open / reset).
  void note_alloc(int64_t bytes);
  int64_t bytes_allocated() const { return bytes_now_; }
  int64_t peak_bytes_allocated() const { return bytes_peak_; }
  void reset_peak() { bytes_peak_ = bytes_now_; }

 private:
  Device() = default;
  // The steps of open, in order, on instance_ and physical_.
  void create_messenger();         // validation messages into messages_
  void read_properties();          // throws DeviceError where the device lacks what every kernel needs
  void probe_optional_features();  // coop_matrix_, coop_khr_, integer_dot_, float16_, pipeline_stats_
  void create_logical_device();    // with those features enabled; its queue, command pool and pipeline cache
  friend VkBool32 VKAPI_PTR debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT,
                                           VkDebugUtilsMessageTypeFlagsEXT,
                                           const VkDebugUtilsMessengerCallbackDataEXT*, void*);
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props_{};
  VkPhysicalDeviceMemoryProperties mem_props_{};
  std::string name_;
  uint32_t subgroup_size_ = 0;
  bool timestamps_ = false;
  bool coop_matrix_ = false;
  bool coop_khr_ = false;
  bool integer_dot_ = false;
  bool float16_ = false;
  bool pipeline_stats_ = false;
  bool validation_ = false;
  mutable std::mutex messages_mutex_;
  HostBuffer staging_;
  size_t staging_bytes_ = 0;
  std::mutex staging_mutex_;
  std::vector<std::string> messages_;
  int64_t bytes_now_ = 0, bytes_peak_ = 0;
};

}  // namespace q4t::vk
