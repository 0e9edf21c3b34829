// Turns a --device string into the device a command runs on: the CPU, or an open Vulkan device.
#pragma once
#include <memory>
#include <string>

#include "autograd/backend.h"
#include "kernels/host_kernels.h"
#include "kernels/precision.h"
#include "kernels/vulkan/device.h"

namespace q4t {

struct DeviceChoice {
  std::unique_ptr<vk::Device> vulkan;  // null: the CPU
  Precision precision = Precision::F32;  // of the products (set_precision)
  bool is_cpu() const { return !vulkan; }
  std::string name() const { return vulkan ? vulkan->name() : "cpu"; }
  std::unique_ptr<HostKernels> host_kernels() const;
  // --precision: "auto" (mixed where the device has cooperative matrices, f32 elsewhere), "mixed" or "f32"; mixed on
  // a CPU without the integer loops of kernels/cpu/int_rows.h is an error naming the flag.
  void set_precision(const std::string& flag);
  // The autograd backend of this device and precision (the CPU's in f32 tensors).
  std::unique_ptr<ag::Backend> backend() const;
  // "mixed precision (f16 inputs, f32 sums, on tensor cores)" and the like: what a run's first line says.
  std::string precision_text() const;
};

// The precision --precision auto takes on a Vulkan device: mixed where it has cooperative matrices.
Precision default_precision(const vk::Device& dev);

// "auto" takes the best Vulkan GPU and falls back to the CPU kernels when there is none (a CPU-type Vulkan device
// such as lavapipe is slower than them; "vulkan" still opens it); "vulkan"/"vulkan:N" fail with DeviceError instead.
DeviceChoice choose_device(const std::string& spec, bool validation = false);

// The device of this rank of a data-parallel run (dist::World): "auto" and "vulkan" take the GPU of the rank's place
// among the ranks on its machine (local rank i: the i-th GPU of `q4tune devices`; lavapipe counts where there is
// no GPU); "vulkan:N" and "cpu" are taken as they are. More ranks on a machine than GPUs fail with
// std::invalid_argument unless `shared`, which deals them out in turn. One process: choose_device(spec).
DeviceChoice choose_rank_device(const std::string& spec, bool shared);

// --threads of this rank: `requested`, or with 0 the machine's cores divided among the ranks on it (all of them for
// one process: 0 stays 0).
int rank_threads(int requested);

}  // namespace q4t
