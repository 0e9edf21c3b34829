#include "train/device_choice.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <thread>
#include <vector>
#include <stdexcept>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/q4_0_rows.h"
#include "kernels/cpu/threads.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/distributed.h"

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
  if (precision == Precision::Mixed && !vulkan && !cpu::has_mixed(Format::Q4_0))
    throw std::invalid_argument(std::string("--precision mixed: this CPU's kernels (") +
                                cpu::detail::q4_0_kernels().name +
                                ") have no integer loops (they need AVX2); use --precision f32 or a Vulkan device");
}

std::unique_ptr<ag::Backend> DeviceChoice::backend() const {
  return vulkan ? ag::Backend::vulkan(*vulkan, precision) : ag::Backend::cpu(ag::DType::F32, precision);
}

std::string DeviceChoice::precision_text() const {
  if (precision == Precision::F32) return "f32 precision";
  if (!vulkan)
    return "mixed precision (the inputs of products under " + std::to_string(cpu::kMixedTokens) +
           " tokens rounded to 8-bit blocks, integer sums)";
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

int rank_threads(int requested) {
  const int ranks = dist::World::get().local_size();
  if (requested > 0 || ranks == 1) return requested;
  return std::max(1, int(std::thread::hardware_concurrency()) / ranks);
}

DeviceChoice choose_rank_device(const std::string& spec_text, bool shared) {
  const dist::World& w = dist::World::get();
  const vk::DeviceSpec spec = vk::DeviceSpec::parse(spec_text);
  if (w.local_size() == 1 || spec.kind == vk::DeviceSpec::Kind::Cpu || spec.index >= 0) return choose_device(spec_text);
  std::vector<vk::PhysicalDeviceInfo> all;
  try {
    all = vk::Device::list();
  } catch (const vk::DeviceError&) {
    if (spec.kind != vk::DeviceSpec::Kind::Auto) throw;
  }
  std::vector<vk::PhysicalDeviceInfo> gpus;
  for (const auto& d : all)
    if (d.type != "cpu") gpus.push_back(d);
  if (gpus.empty() && spec.kind == vk::DeviceSpec::Kind::Auto) return DeviceChoice{};  // the CPU, as auto does
  if (gpus.empty()) gpus = all;
  if (gpus.empty()) throw vk::DeviceError("--device " + spec_text + ": no Vulkan device on " + w.host());
  if (w.local_size() > int(gpus.size()) && !shared)
    throw std::invalid_argument("--device " + spec_text + ": " + std::to_string(w.local_size()) + " ranks run on " +
                                w.host() + ", which has " + std::to_string(gpus.size()) + " Vulkan " +
                                (gpus.size() == 1 ? "device" : "devices") +
                                "; start at most that many per machine, or pass --allow-shared-device to share them");
  DeviceChoice c;
  c.vulkan = vk::Device::open({int(gpus[size_t(w.local_rank()) % gpus.size()].index), false});
  return c;
}

namespace {

// q4tune devices: the CPU, then each Vulkan device by its --device name, with what --precision auto takes there.
int list_devices(std::ostream& out) {
  const auto devs = vk::Device::list();
  out << "cpu          the CPU kernels (" << cpu::num_threads() << " threads, "
      << cpu::detail::q4_0_kernels().name << "; --precision auto is f32"
      << (cpu::has_mixed(Format::Q4_0) ? ", mixed rounds inputs to 8-bit blocks)\n" : "; no mixed)\n");
  if (devs.empty()) out << "(no Vulkan devices)\n";
  for (const auto& d : devs)
    out << "vulkan:" << d.index << "     " << d.name << " (" << d.type << ", Vulkan "
        << VK_API_VERSION_MAJOR(d.api_version) << "." << VK_API_VERSION_MINOR(d.api_version) << "; "
        << (d.coop_matrix ? "tensor cores: --precision auto is mixed" : "no tensor cores: --precision auto is f32")
        << ")\n";
  return 0;
}

}  // namespace

Command add_devices(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the devices --device can name");
  set_examples(cmd, "  q4tune devices");
  return {cmd, [] { return list_devices(std::cout); }};
}

}  // namespace q4t
