// q4tune: LoRA fine-tuning of quantized GGUF models on Vulkan GPUs or the CPU. Entry point and CLI.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "kernels/cpu/threads.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/device.h"
#include "train/commands.h"
#include "train/device_choice.h"

namespace {

struct DeviceFlags {
  std::string device = "auto";
  int threads = 0;
  void add(CLI::App* app) {
    app->add_option("--device", device,
                    "auto (best Vulkan device, else the CPU), cpu, vulkan (best Vulkan device), or vulkan:N "
                    "(see `q4tune devices`)")
        ->capture_default_str();
    app->add_option("--threads", threads, "CPU worker threads (0: one per core)")->check(CLI::NonNegativeNumber);
  }
  q4t::DeviceChoice open() const {
    q4t::cpu::set_num_threads(threads);
    return q4t::choose_device(device);
  }
};

int list_devices() {
  const auto devs = q4t::vk::Device::list();
  std::cout << "cpu          the CPU kernels (" << q4t::cpu::num_threads() << " threads)\n";
  if (devs.empty()) std::cout << "(no Vulkan devices)\n";
  for (const auto& d : devs)
    std::cout << "vulkan:" << d.index << "     " << d.name << " (" << d.type << ", Vulkan "
              << VK_API_VERSION_MAJOR(d.api_version) << "." << VK_API_VERSION_MINOR(d.api_version) << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"q4tune: fine-tune LoRA adapters for quantized GGUF models on any Vulkan GPU or the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "q4tune 0.1.0");

  auto* devices = app.add_subcommand("devices", "List the devices --device can name");

  DeviceFlags selftest_dev;
  auto* selftest = app.add_subcommand("selftest",
                                      "Check every kernel on a device against a double-precision reference; "
                                      "exits non-zero on any failure");
  selftest_dev.add(selftest);

  DeviceFlags gradcheck_dev;
  auto* gradcheck = app.add_subcommand("gradcheck",
                                       "Check every autograd op's gradients against finite differences (double) "
                                       "and the f32 CPU and Vulkan device against the double-precision CPU");
  gradcheck_dev.add(gradcheck);

  DeviceFlags bench_dev;
  q4t::BenchOptions bench_opt;
  auto* bench = app.add_subcommand("bench",
                                   "Benchmark the copy roofline and the Q4_0 kernels (GEMV, GEMM at T=512, dx at "
                                   "T=1 and T=512) on model-sized shapes");
  bench_dev.add(bench);
  bench->add_option("--kernels", bench_opt.kernels, "comma-separated subset of copy,q4_0_gemv,q4_0_gemm,q4_0_dx")
      ->delimiter(',');
  bench->add_option("--shapes", bench_opt.shapes,
                    "comma-separated N_OUTxN_IN shapes (default 4096x4096,4096x14336,14336x4096,16384x16384)")
      ->delimiter(',');
  bench->add_option("--json", bench_opt.json_path, "also write the results as a JSON array to this file");
  bench->add_option("--seconds", bench_opt.seconds_per_case, "time budget per case")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*devices) return list_devices();
    if (*selftest) return q4t::run_selftest(selftest_dev.open(), std::cout);
    if (*gradcheck) return q4t::run_gradcheck_cmd(gradcheck_dev.open(), std::cout);
    if (*bench) return q4t::run_bench(bench_dev.open(), bench_opt, std::cout);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "q4tune: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
