// q4tune selftest: every linear kernel on the chosen device against the plain double-precision reference, on
// awkward shapes (one block, odd row counts, tiles that don't divide), so a user can check their driver.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/reference.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/random_inputs.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/device_choice.h"

namespace q4t {

namespace {

constexpr double kBound = 1e-4;  // max |got - want| / max |want|, f32 accumulation

struct Shape {
  int64_t n_out, n_in, T;
};
// (T >= 32 takes the tensor-core GEMM where the device has one.)
const Shape kShapes[] = {{1, 32, 1},  {7, 64, 1},    {65, 4128, 1}, {1000, 64, 1},  {63, 4128, 1},
                         {7, 32, 3},  {65, 64, 17},  {1000, 4128, 3}, {63, 96, 17}, {257, 320, 300},
                         {65, 32, 33},  {256, 4128, 65}};
// The K-quants' widths are whole 256-weight super-blocks.
const Shape kKQuantShapes[] = {{1, 256, 1},   {7, 512, 1},    {65, 4096, 1},  {1000, 256, 1}, {37, 768, 1},
                               {7, 256, 3},   {65, 512, 17},  {1000, 768, 3}, {63, 256, 17},  {257, 512, 65}};

// A frozen weight format and the shapes to check it on.
struct FormatCase {
  Format format;
  const char* name;
  std::span<const Shape> shapes;
};
// Every format of the table, Q4_0 first (the one-token dx paths below are its).
std::vector<FormatCase> format_cases() {
  std::vector<FormatCase> out{{Format::Q4_0, "q4_0", kShapes}};
  for (const FormatTraits& t : format_table())
    if (t.format != Format::Q4_0)
      out.push_back({t.format, t.name, t.block_elems == 256 ? std::span<const Shape>(kKQuantShapes) : kShapes});
  return out;
}

// One output line: the worst error over all cases of a kernel.
struct KernelResult {
  std::string name;
  double worst = 0;
  int cases = 0;
  std::string error;
  void add(double e) { worst = std::max(worst, e); ++cases; }
};

// The four lines of one format: GEMV, GEMM, dx for one token and dx for several, plus one for an exception
// that stopped its checks.
struct FormatResults {
  KernelResult gemv, gemm, dx, dx_multi, all;
  explicit FormatResults(const std::string& f)
      : gemv{f + "_gemv"}, gemm{f + "_gemm"}, dx{f + "_dx"}, dx_multi{f + "_dx (T>1)"}, all{f + " kernels"} {}
};

// dx of shape s (weights w) into r, two cases: over row tiles of 3/8 of n_out (never dividing evenly),
// accumulated from a non-zero start, then over all rows without accumulating.
void check_dx(HostKernels& k, std::mt19937& rng, const FormatCase& f, const Shape& s, const std::vector<uint8_t>& w,
              KernelResult& r) {
  const auto dy = random_floats(rng, s.T * s.n_out);
  auto dxv = random_floats(rng, s.T * s.n_in);
  const auto dx0 = dxv;
  const int64_t tile = std::max<int64_t>(1, s.n_out * 3 / 8);
  for (int64_t j = 0; j < s.n_out; j += tile)
    k.frozen_dx(f.format, dxv, w, dy, s.T, s.n_out, s.n_in, j, std::min(s.n_out, j + tile), true);
  auto want = ref::frozen_dx(f.format, w.data(), dy.data(), dx0.data(), s.T, s.n_out, s.n_in, 0, s.n_out);
  r.add(ref::max_rel_error(dxv.data(), want));
  k.frozen_dx(f.format, dxv, w, dy, s.T, s.n_out, s.n_in, 0, s.n_out, false);
  want = ref::frozen_dx(f.format, w.data(), dy.data(), nullptr, s.T, s.n_out, s.n_in, 0, s.n_out);
  r.add(ref::max_rel_error(dxv.data(), want));
}

void check_frozen(HostKernels& k, std::mt19937& rng, const FormatCase& f, FormatResults& r) {
  for (const Shape& s : f.shapes) {
    const auto w = random_weights(rng, f.format, s.n_out, s.n_in);
    const auto x = random_floats(rng, s.T * s.n_in);
    std::vector<float> y(size_t(s.T * s.n_out));
    k.frozen_gemm(f.format, y, w, x, s.T, s.n_out, s.n_in);
    const auto want_y = ref::frozen_gemm(f.format, w.data(), x.data(), s.T, s.n_out, s.n_in);
    (s.T == 1 ? r.gemv : r.gemm).add(ref::max_rel_error(y.data(), want_y));
    check_dx(k, rng, f, s, w, s.T == 1 ? r.dx : r.dx_multi);
  }
}

using HostGemm = void (HostKernels::*)(std::span<float>, std::span<const float>, std::span<const float>, int64_t,
                                       int64_t, int64_t, bool, float);
using RefGemm = std::vector<double> (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                        double);

void check_f32(HostKernels& k, std::mt19937& rng, HostGemm fn, RefGemm ref_fn, KernelResult& r) {
  const int64_t dims[][3] = {{1, 1, 1}, {3, 17, 65}, {65, 16, 4128}, {17, 130, 33}, {300, 257, 40}};
  for (const auto& d : dims) {
    const auto a = random_floats(rng, d[0] * d[2]);
    const auto b = random_floats(rng, d[2] * d[1]);
    for (bool acc : {false, true}) {  // accumulating with a scale, as LoRA's products do
      const double alpha = acc ? 0.75 : 1.0;
      auto c = random_floats(rng, d[0] * d[1]);
      const auto c0 = c;
      (k.*fn)(c, a, b, d[0], d[1], d[2], acc, float(alpha));
      r.add(ref::max_rel_error(c.data(),
                               ref_fn(a.data(), b.data(), acc ? c0.data() : nullptr, d[0], d[1], d[2], alpha)));
    }
  }
}

// The one-token GEMVs of format f through k, T = 1 shapes only (the integer-dot path, forced).
void check_gemv(HostKernels& k, std::mt19937& rng, const FormatCase& f, KernelResult& r) {
  for (const Shape& s : f.shapes) {
    if (s.T != 1) continue;
    const auto w = random_weights(rng, f.format, s.n_out, s.n_in);
    const auto x = random_floats(rng, s.n_in);
    std::vector<float> y(size_t(s.n_out));
    k.frozen_gemm(f.format, y, w, x, 1, s.n_out, s.n_in);
    r.add(ref::max_rel_error(y.data(), ref::frozen_gemm(f.format, w.data(), x.data(), 1, s.n_out, s.n_in)));
  }
}

// The CPU's mixed GEMV of format f on its T = 1 shapes, against the reference on the activation as it rounds it.
void check_mixed_gemv(std::mt19937& rng, const FormatCase& f, KernelResult& r) {
  for (const Shape& s : f.shapes) {
    if (s.T != 1) continue;
    const auto w = random_weights(rng, f.format, s.n_out, s.n_in);
    const auto x = random_floats(rng, s.n_in);
    std::vector<float> y(size_t(s.n_out));
    cpu::frozen_gemm(f.format, y, w, x, 1, s.n_out, s.n_in, Precision::Mixed);
    const auto xr = ref::act_rounded(f.format, x.data(), s.n_in);
    r.add(ref::max_rel_error(y.data(), ref::frozen_gemm(f.format, w.data(), xr.data(), 1, s.n_out, s.n_in)));
  }
}

// The one-token dx of format f through k on the T = 1 shapes among `shapes` (check_dx's two cases each).
void check_one_token_dx(HostKernels& k, std::mt19937& rng, const FormatCase& f, std::span<const Shape> shapes,
                        KernelResult& r) {
  for (const Shape& s : shapes)
    if (s.T == 1) check_dx(k, rng, f, s, random_weights(rng, f.format, s.n_out, s.n_in), r);
}

template <class F>
void guarded(KernelResult& r, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    r.error = e.what();
  }
}

}  // namespace

int run_selftest(const DeviceChoice& dev, std::ostream& out) {
  auto k = dev.host_kernels();
  out << "selftest on " << k->device_name() << " (bound: max relative error <= " << kBound << ")\n";
  std::mt19937 rng(1234);
  const std::vector<FormatCase> cases = format_cases();
  std::vector<FormatResults> formats;
  for (const FormatCase& f : cases) formats.emplace_back(f.name);
  KernelResult nt{"f32_gemm_nt"}, nn{"f32_gemm_nn"}, tn{"f32_gemm_tn"};
  // Q4_0 and the f32 GEMMs first, so that their inputs stay what they were before Q8_0 and F16 were added.
  guarded(formats[0].all, [&] { check_frozen(*k, rng, cases[0], formats[0]); });
  guarded(nt, [&] { check_f32(*k, rng, &HostKernels::gemm_nt, &ref::gemm_nt, nt); });
  guarded(nn, [&] { check_f32(*k, rng, &HostKernels::gemm_nn, &ref::gemm_nn, nn); });
  guarded(tn, [&] { check_f32(*k, rng, &HostKernels::gemm_tn, &ref::gemm_tn, tn); });
  for (size_t i = 1; i < formats.size(); ++i)
    guarded(formats[i].all, [&] { check_frozen(*k, rng, cases[i], formats[i]); });

  std::vector<KernelResult*> all;
  for (size_t i = 0; i < formats.size(); ++i) {
    FormatResults& r = formats[i];
    for (KernelResult* line : {&r.gemv, &r.gemm, &r.dx, &r.dx_multi}) all.push_back(line);
    if (i == 0) all.insert(all.end(), {&nt, &nn, &tn});
  }
  for (FormatResults& r : formats)
    if (!r.all.error.empty()) all.push_back(&r.all);
  // The GEMVs that large matrices run on 8-bit integer dot products, forced onto that path for these shapes.
  std::vector<KernelResult> path_lines;
  if (dev.vulkan && dev.vulkan->integer_dot()) {
    const auto dot = make_vulkan_host_kernels(*dev.vulkan, 0, vk::LinearKernels::IntegerDot::Always);
    for (const FormatCase& f : cases)
      if (format_traits(f.format).gpu.gemv_dot) {
        path_lines.push_back({std::string(f.name) + "_gemv (dot)"});
        guarded(path_lines.back(), [&] { check_gemv(*dot, rng, f, path_lines.back()); });
      }
  }
  // Where the one-token dx of Q4_0 and Q4_K decodes through f16 pairs: Q4_0 rows of several block pairs per
  // workgroup, and both formats with the f32 decode that devices without f16 arithmetic run.
  if (dev.vulkan && dev.vulkan->float16()) {
    const Shape wide[] = {{37, 1088, 1}, {1000, 4160, 1}};
    path_lines.push_back({"q4_0_dx (pairs)"});
    guarded(path_lines.back(), [&] { check_one_token_dx(*k, rng, cases[0], wide, path_lines.back()); });
    const auto f32 = make_vulkan_host_kernels(*dev.vulkan, 0, vk::LinearKernels::IntegerDot::Auto, false);
    for (const FormatCase& f : cases)
      if (format_traits(f.format).gpu.dx_split_f16) {
        path_lines.push_back({std::string(f.name) + "_dx (f32 decode)"});
        guarded(path_lines.back(), [&] { check_one_token_dx(*f32, rng, f, f.shapes, path_lines.back()); });
      }
  }
  // On the CPU, the GEMVs of --precision mixed: the activation rounded to 8-bit blocks, integer sums.
  if (dev.is_cpu())
    for (const FormatCase& f : cases)
      if (cpu::has_mixed(f.format)) {
        path_lines.push_back({std::string(f.name) + "_gemv (mixed)"});
        guarded(path_lines.back(), [&] { check_mixed_gemv(rng, f, path_lines.back()); });
      }
  for (KernelResult& r : path_lines) all.push_back(&r);
  bool ok = true;
  for (const KernelResult* r : all) {
    const bool pass = r->error.empty() && r->cases > 0 && r->worst <= kBound;
    ok = ok && pass;
    char line[256];
    if (!r->error.empty())
      std::snprintf(line, sizeof line, "%-20s error: %s  FAIL", r->name.c_str(), r->error.c_str());
    else
      std::snprintf(line, sizeof line, "%-20s max rel err %.2e over %2d cases  %s", r->name.c_str(), r->worst,
                    r->cases, pass ? "PASS" : "FAIL");
    out << line << "\n";
  }
  out << (ok ? "selftest passed" : "selftest FAILED") << "\n";
  return ok ? 0 : 1;
}

Command add_selftest(CLI::App& app) {
  auto* cmd = app.add_subcommand("selftest",
                                 "Check every kernel on a device against a double-precision reference; "
                                 "exits non-zero on any failure");
  const auto dev = add_device_flags(cmd, /*with_precision=*/false);
  set_examples(cmd, "  q4tune selftest --device vulkan");
  return {cmd, [dev] { return run_selftest(dev->open(), std::cout); }};
}

}  // namespace q4t
