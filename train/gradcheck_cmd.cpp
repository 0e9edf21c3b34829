// q4tune gradcheck: every gradient-check case of the autograd op table, one line each: finite differences in
// double on the CPU, then the f32 CPU and the chosen Vulkan device against the double-precision CPU.
#include <cstdio>
#include <ostream>

#include "autograd/gradcheck.h"
#include "train/commands.h"
#include "train/device_choice.h"

namespace q4t {

int run_gradcheck_cmd(const DeviceChoice& dev, std::ostream& out) {
  auto cpu32 = ag::Backend::cpu(ag::DType::F32);
  std::unique_ptr<ag::Backend> vulkan;
  std::vector<ag::Backend*> others{cpu32.get()};
  if (!dev.is_cpu()) {
    vulkan = ag::Backend::vulkan(*dev.vulkan);
    others.push_back(vulkan.get());
  }
  out << "gradcheck: finite differences in double on the CPU; ";
  for (size_t i = 0; i < others.size(); ++i) out << (i ? " and " : "") << others[i]->name();
  out << " against the double-precision CPU\n";
  int failed = 0;
  for (const auto& c : ag::gradcheck_cases()) {
    const ag::GradcheckResult r = ag::run_gradcheck(c, others);
    char line[512];
    int n = std::snprintf(line, sizeof line, "%-40s fd %.1e (%3lld pts)", c.name.c_str(), r.fd_error,
                          static_cast<long long>(r.fd_points));
    for (const auto& b : r.backends)
      n += std::snprintf(line + n, sizeof line - size_t(n), "  %s fwd %.1e bwd %.1e",
                         b.backend.rfind("cpu", 0) == 0 ? "cpu" : "vulkan", b.forward_error, b.backward_error);
    out << line << "  " << (r.pass ? "PASS" : "FAIL");
    if (!r.error.empty()) out << " (" << r.error << ")";
    out << "\n";
    failed += r.pass ? 0 : 1;
  }
  out << (failed == 0 ? "gradcheck passed" : "gradcheck FAILED: " + std::to_string(failed) + " case(s)") << "\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace q4t
