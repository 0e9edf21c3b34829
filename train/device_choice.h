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

// "auto" falls back to the CPU when no Vulkan device exists; "vulkan"/"vulkan:N" fail with DeviceError instead.
DeviceChoice choose_device(const std::string& spec, bool validation = false);

}  // namespace q4t
