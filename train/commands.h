// The q4tune subcommands implemented in train/; each returns the process exit code.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

namespace q4t {

struct DeviceChoice;

// Runs every kernel on the device against the double-precision reference; one line per kernel.
int run_selftest(const DeviceChoice& dev, std::ostream& out);

// Runs every autograd gradient-check case (CPU f32, and the Vulkan device unless dev is the CPU).
int run_gradcheck_cmd(const DeviceChoice& dev, std::ostream& out);

struct BenchOptions {
  std::vector<std::string> kernels;  // empty: all
  std::vector<std::string> shapes;   // "n_outxn_in"; empty: the default set
  std::string json_path;             // empty: no JSON
  double seconds_per_case = 0.25;
};
int run_bench(const DeviceChoice& dev, const BenchOptions& opt, std::ostream& out);

}  // namespace q4t
