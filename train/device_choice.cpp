#include "train/device_choice.h"

#include <stdexcept>

namespace q4t {

std::unique_ptr<HostKernels> DeviceChoice::host_kernels() const {
  return vulkan ? make_vulkan_host_kernels(*vulkan) : make_cpu_host_kernels();
}

Precision default_precision(const vk::Device& dev) {
  return dev.coop_matrix() ? Precision::Mixed : Precision::F32;
}

void DeviceChoice::set_precision(const std::string& flag) {
  if (flag == "auto") {
    precision = vulkan ? default_precision(*vulkan) : Precision::F32;
    return;
  }
  precision = parse_precision(flag, "--precision");
  if (precision == Precision::Mixed && !vulkan)
    throw std::invalid_argument("--precision mixed: the CPU computes in f32; mixed precision runs on Vulkan devices "
                                "(see `q4tune devices`)");
}

std::string DeviceChoice::precision_text() const {
  if (precision == Precision::F32) return "f32 precision";
  return vulkan && vulkan->coop_matrix() ? "mixed precision (f16 inputs, f32 sums, on tensor cores)"
                                         : "mixed precision (f16 inputs, f32 sums; no tensor cores on this device)";
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
