// q4tune gradcheck: every gradient-check case of the autograd op table, one line each: finite differences in
// double on the CPU, then the f32 CPU and the chosen Vulkan device against the double-precision CPU; with
// --precision mixed, also the device's mixed precision against its f32 (each case's mixed_bound).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>

#include "autograd/gradcheck.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/device_choice.h"

#include <stdexcept>
#include <string>

#include "kernels/cpu/linear.h"

namespace q4t {

int run_gradcheck_cmd(const DeviceChoice& dev, std::ostream& out) {
  if (dev.is_cpu() && dev.precision == Precision::Mixed)
    throw std::invalid_argument("--precision mixed: gradcheck compares a Vulkan device's mixed precision with its "
                                "f32; the CPU's mixed products (8-bit inputs below " +
                                std::to_string(cpu::kMixedTokens) + " tokens) are checked by test_cpu_kernels");
  auto cpu32 = ag::Backend::cpu(ag::DType::F32);
  std::unique_ptr<ag::Backend> vulkan, mixed;
  std::vector<ag::Backend*> others{cpu32.get()};
  if (!dev.is_cpu()) {
    vulkan = ag::Backend::vulkan(*dev.vulkan, Precision::F32);
    others.push_back(vulkan.get());
    if (dev.precision == Precision::Mixed) mixed = ag::Backend::vulkan(*dev.vulkan, Precision::Mixed);
  }
  out << "gradcheck: finite differences in double on the CPU; ";
  for (size_t i = 0; i < others.size(); ++i) out << (i ? " and " : "") << others[i]->name();
  out << " against the double-precision CPU";
  if (mixed) out << "; mixed precision against f32 on " << mixed->name();
  out << "\n";
  int failed = 0;
  for (const auto& c : ag::gradcheck_cases()) {
    const ag::GradcheckResult r = ag::run_gradcheck(c, others);
    char line[512];
    int n = std::snprintf(line, sizeof line, "%-40s fd %.1e (%3lld pts)", c.name.c_str(), r.fd_error,
                          static_cast<long long>(r.fd_points));
    for (const auto& b : r.backends)
      n += std::snprintf(line + n, sizeof line - size_t(n), "  %s fwd %.1e bwd %.1e",
                         b.backend.rfind("cpu", 0) == 0 ? "cpu" : "vulkan", b.forward_error, b.backward_error);
    bool pass = r.pass;
    std::string error = r.error;
    if (mixed && r.error.empty()) {
      try {
        const ag::BackendCheck m = ag::run_mixed_check(c, *vulkan, *mixed);
        n += std::snprintf(line + n, sizeof line - size_t(n), "  mixed fwd %.1e bwd %.1e (bound %.0e)",
                           m.forward_error, m.backward_error, c.mixed_bound);
        pass = pass && m.forward_error <= c.mixed_bound && m.backward_error <= c.mixed_bound;
      } catch (const std::exception& e) {
        error = e.what();
        pass = false;
      }
    }
    out << line << "  " << (pass ? "PASS" : "FAIL");
    if (!error.empty()) out << " (" << error << ")";
    out << "\n";
    failed += pass ? 0 : 1;
  }
  out << (failed == 0 ? "gradcheck passed" : "gradcheck FAILED: " + std::to_string(failed) + " case(s)") << "\n";
  return failed == 0 ? 0 : 1;
}

Command add_gradcheck(CLI::App& app) {
  auto* cmd = app.add_subcommand("gradcheck",
                                 "Check every autograd op's gradients against finite differences (double) "
                                 "and the f32 CPU and Vulkan device against the double-precision CPU");
  const auto dev = add_device_flags(cmd, /*with_precision=*/false);
  dev->precision = "f32";
  cmd->add_option("--precision", dev->precision,
                  "f32 (the checks against double precision), or mixed: also every case's forward and "
                  "gradients in mixed precision against f32 on the device, within the case's stated bound")
      ->check(CLI::IsMember({"f32", "mixed"}))
      ->capture_default_str();
  set_examples(cmd, "  q4tune gradcheck --device cpu");
  return {cmd, [dev] { return run_gradcheck_cmd(dev->open(), std::cout); }};
}

}  // namespace q4t
