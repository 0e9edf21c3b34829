// Turns a --device string into the device a command runs on: the CPU, or an open Vulkan device.
#pragma once
#include <memory>
#include <string>

#include "kernels/host_kernels.h"
#include "kernels/vulkan/device.h"

namespace q4t {

struct DeviceChoice {
  std::unique_ptr<vk::Device> vulkan;  // null: the CPU
  bool is_cpu() const { return !vulkan; }
  std::string name() const { return vulkan ? vulkan->name() : "cpu"; }
  std::unique_ptr<HostKernels> host_kernels() const;
};

// "auto" takes the best Vulkan GPU and falls back to the CPU kernels when there is none (a CPU-type Vulkan device
// such as lavapipe is slower than them; "vulkan" still opens it); "vulkan"/"vulkan:N" fail with DeviceError instead.
DeviceChoice choose_device(const std::string& spec, bool validation = false);

}  // namespace q4t
