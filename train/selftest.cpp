// q4tune selftest: every linear kernel on the chosen device against the plain double-precision reference, on
// awkward shapes (one block, odd row counts, tiles that don't divide), so a user can check their driver.
#include <cstdio>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/quant/q4_0.h"
#include "train/commands.h"
#include "train/device_choice.h"

namespace q4t {

namespace {

constexpr double kBound = 1e-4;  // max |got - want| / max |want|, f32 accumulation

struct Shape {
  int64_t n_out, n_in, T;
};
const Shape kShapes[] = {{1, 32, 1}, {7, 64, 1}, {65, 4128, 1}, {1000, 64, 1}, {63, 4128, 1},
                         {7, 32, 3}, {65, 64, 17}, {1000, 4128, 3}, {63, 96, 17}, {257, 320, 300}};

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<uint8_t> random_q4_0(std::mt19937& rng, int64_t n_out, int64_t n_in) {
  std::vector<uint8_t> w(size_t(n_out * q4_0_row_bytes(n_in)));
  quant::quantize_q4_0(w, random_floats(rng, n_out * n_in), n_out, n_in);
  return w;
}

// One output line: the worst error over all cases of a kernel.
struct KernelResult {
  std::string name;
  double worst = 0;
  int cases = 0;
  std::string error;
  void add(double e) { worst = std::max(worst, e); ++cases; }
};

void check_q4_0(HostKernels& k, std::mt19937& rng, KernelResult& gemv, KernelResult& gemm, KernelResult& dx,
                KernelResult& dx_multi) {
  for (const Shape& s : kShapes) {
    const auto w = random_q4_0(rng, s.n_out, s.n_in);
    const auto x = random_floats(rng, s.T * s.n_in);
    std::vector<float> y(size_t(s.T * s.n_out));
    k.q4_0_gemm(y, w, x, s.T, s.n_out, s.n_in);
    (s.T == 1 ? gemv : gemm).add(ref::max_rel_error(y.data(), ref::q4_0_gemm(w.data(), x.data(), s.T, s.n_out, s.n_in)));

    // dx over row tiles of 3/8 of n_out (never dividing evenly), accumulated, from a non-zero start.
    const auto dy = random_floats(rng, s.T * s.n_out);
    auto dxv = random_floats(rng, s.T * s.n_in);
    const auto dx0 = dxv;
    const int64_t tile = std::max<int64_t>(1, s.n_out * 3 / 8);
    for (int64_t j = 0; j < s.n_out; j += tile)
      k.q4_0_dx(dxv, w, dy, s.T, s.n_out, s.n_in, j, std::min(s.n_out, j + tile), true);
    auto want = ref::q4_0_dx(w.data(), dy.data(), dx0.data(), s.T, s.n_out, s.n_in, 0, s.n_out);
    (s.T == 1 ? dx : dx_multi).add(ref::max_rel_error(dxv.data(), want));
    k.q4_0_dx(dxv, w, dy, s.T, s.n_out, s.n_in, 0, s.n_out, false);
    want = ref::q4_0_dx(w.data(), dy.data(), nullptr, s.T, s.n_out, s.n_in, 0, s.n_out);
    (s.T == 1 ? dx : dx_multi).add(ref::max_rel_error(dxv.data(), want));
  }
}

using HostGemm = void (HostKernels::*)(std::span<float>, std::span<const float>, std::span<const float>, int64_t,
                                       int64_t, int64_t, bool);
using RefGemm = std::vector<double> (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t);

void check_f32(HostKernels& k, std::mt19937& rng, HostGemm fn, RefGemm ref_fn, KernelResult& r) {
  const int64_t dims[][3] = {{1, 1, 1}, {3, 17, 65}, {65, 16, 4128}, {17, 130, 33}, {300, 257, 40}};
  for (const auto& d : dims) {
    const auto a = random_floats(rng, d[0] * d[2]);
    const auto b = random_floats(rng, d[2] * d[1]);
    for (bool acc : {false, true}) {
      auto c = random_floats(rng, d[0] * d[1]);
      const auto c0 = c;
      (k.*fn)(c, a, b, d[0], d[1], d[2], acc);
      r.add(ref::max_rel_error(c.data(), ref_fn(a.data(), b.data(), acc ? c0.data() : nullptr, d[0], d[1], d[2])));
    }
  }
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
  KernelResult gemv{"q4_0_gemv"}, gemm{"q4_0_gemm"}, dx{"q4_0_dx"}, dx_multi{"q4_0_dx (T>1)"};
  KernelResult nt{"f32_gemm_nt"}, nn{"f32_gemm_nn"}, tn{"f32_gemm_tn"};
  KernelResult q4_all{"q4_0 kernels"};
  guarded(q4_all, [&] { check_q4_0(*k, rng, gemv, gemm, dx, dx_multi); });
  guarded(nt, [&] { check_f32(*k, rng, &HostKernels::gemm_nt, &ref::gemm_nt, nt); });
  guarded(nn, [&] { check_f32(*k, rng, &HostKernels::gemm_nn, &ref::gemm_nn, nn); });
  guarded(tn, [&] { check_f32(*k, rng, &HostKernels::gemm_tn, &ref::gemm_tn, tn); });

  std::vector<KernelResult*> all = {&gemv, &gemm, &dx, &dx_multi, &nt, &nn, &tn};
  if (!q4_all.error.empty()) all.push_back(&q4_all);
  bool ok = true;
  for (const KernelResult* r : all) {
    const bool pass = r->error.empty() && r->cases > 0 && r->worst <= kBound;
    ok = ok && pass;
    char line[256];
    if (!r->error.empty())
      std::snprintf(line, sizeof line, "%-16s error: %s  FAIL", r->name.c_str(), r->error.c_str());
    else
      std::snprintf(line, sizeof line, "%-16s max rel err %.2e over %2d cases  %s", r->name.c_str(), r->worst,
                    r->cases, pass ? "PASS" : "FAIL");
    out << line << "\n";
  }
  out << (ok ? "selftest passed" : "selftest FAILED") << "\n";
  return ok ? 0 : 1;
}

}  // namespace q4t
