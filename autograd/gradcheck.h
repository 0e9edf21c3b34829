// Gradient-check harness. A case builds a small graph from random inputs (drawn from an rng, so every backend
// gets the same values) and returns its output y. The harness draws a random upstream gradient g and checks,
// for every parameter p of the graph:
//   - on the CPU in double precision: the analytic dL/dp of L = <g, y> against central finite differences;
//   - on each other backend (the CPU in f32, a Vulkan device): the forward y and every dL/dp against the
//     double-precision CPU values.
// A forward-only case (for an inference-only op, one with no backward) has no parameters; only its forward y is
// compared, on each other backend against the double-precision CPU. It cannot cover an op that has a backward
// (test_autograd's op-table test requires a full case for those).
// Errors are norm-wise relative: max_i |got_i - want_i| / max(max_i |want_i|, 1e-7).
#pragma once
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "autograd/graph.h"

namespace q4t::ag {

struct GradcheckCase {
  std::string name;
  std::function<Var(Graph&, std::mt19937&)> build;
  double fd_bound = 1e-6;      // finite differences vs analytic, in double
  double device_bound = 1e-4;  // f32 backends vs the double-precision CPU
  // Mixed precision (f16 inputs, f32 sums) against f32 on the same Vulkan device (run_mixed_check): two f16
  // roundings per product term (the input's and the weight's, 2^-11 each), which add up like a random walk over a
  // sum and pass through a few products in a case; ops without mixed kernels give equal results.
  double mixed_bound = 1e-2;
  double fd_step = 1e-6;
  bool forward_only = false;  // no parameters, no backward: compare the forward across backends only
};

// Helpers for case builders: uniform [lo, hi) reals as a parameter or a constant, and Q4_0 weights.
Var random_param(Graph& g, std::mt19937& rng, const Shape& shape, const std::string& name, double lo = -1,
                 double hi = 1);
Var random_constant(Graph& g, std::mt19937& rng, const Shape& shape, const std::string& name, double lo = -1,
                    double hi = 1);
Var random_q4_0(Graph& g, std::mt19937& rng, int64_t n_out, int64_t n_in, const std::string& name);
// W [n_out, n_in] of uniform [-1, 1) values stored as frozen `t` (Q4_0, Q8_0 or F16).
Var random_frozen(Graph& g, std::mt19937& rng, DType t, int64_t n_out, int64_t n_in, const std::string& name);
Var ids_constant(Graph& g, const std::vector<int32_t>& ids, const std::string& name);

struct BackendCheck {
  std::string backend;
  double forward_error = 0, backward_error = 0;
};

struct GradcheckResult {
  std::string name;
  double fd_error = 0;  // worst over parameters
  int64_t fd_points = 0;
  std::vector<BackendCheck> backends;
  bool pass = false;
  std::string error;  // set when the case threw
};

// Runs one case. `others` are the backends compared against the double-precision CPU (may be empty).
GradcheckResult run_gradcheck(const GradcheckCase& c, const std::vector<Backend*>& others, uint32_t seed = 1234);

// Mixed precision against f32: the case's forward and every parameter's gradient on `mixed` (a Vulkan backend at
// Precision::Mixed) against `f32` (the same device at Precision::F32), norm-wise relative.
BackendCheck run_mixed_check(const GradcheckCase& c, Backend& f32, Backend& mixed, uint32_t seed = 1234);

// Every registered case: one or more per op in op_table(), the LoRA linear and a one-block transformer graph.
const std::vector<GradcheckCase>& gradcheck_cases();

}  // namespace q4t::ag
