#include "train/device_choice.h"

namespace q4t {

std::unique_ptr<HostKernels> DeviceChoice::host_kernels() const {
  return vulkan ? make_vulkan_host_kernels(*vulkan) : make_cpu_host_kernels();
}

DeviceChoice choose_device(const std::string& spec_text, bool validation) {
  const vk::DeviceSpec spec = vk::DeviceSpec::parse(spec_text);
  DeviceChoice c;
  if (spec.kind == vk::DeviceSpec::Kind::Cpu) return c;
  if (spec.kind == vk::DeviceSpec::Kind::Auto) {
    // A Vulkan device that is itself the CPU (lavapipe, SwiftShader) is slower than the CPU kernels: auto takes a
    // GPU or nothing.
    bool gpu = false;
    try {
      for (const auto& d : vk::Device::list()) gpu |= d.type != "cpu";
    } catch (const vk::DeviceError&) {
    }
    if (!gpu) return c;
  }
  try {
    c.vulkan = vk::Device::open({spec.index, validation});
  } catch (const vk::DeviceError&) {
    if (spec.kind != vk::DeviceSpec::Kind::Auto) throw;
  }
  return c;
}

}  // namespace q4t
