#include "autograd/gradcheck.h"

#include <algorithm>
#include <cmath>

#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/shapes.h"

namespace q4t::ag {

namespace {

std::vector<float> uniform(std::mt19937& rng, int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = float(u(rng));
  return v;
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  if (!std::isfinite(num)) return INFINITY;
  // A gradient that is exactly zero in double (e.g. q and k of one-token attention) is compared absolutely:
  // f32 rounding may leave ~1e-9 there.
  return num / std::max(den, 1e-7);
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Finite differences of L = <g, y> for up to kMaxPointsPerParam elements of each parameter (all of them for
// small tensors, an evenly spread subset otherwise).
constexpr int64_t kMaxPointsPerParam = 48;

double check_finite_differences(Graph& g, Var out, const std::vector<double>& upstream, double h,
                                int64_t* points) {
  double worst = 0;
  Backend& be = g.backend();
  for (Var p : g.params()) {
    const std::vector<double> analytic = be.to_host(g.grad(p));
    double* data = p.value().data<double>();
    const int64_t n = p.value().numel();
    const int64_t stride = std::max<int64_t>(1, n / kMaxPointsPerParam);
    std::vector<double> fd, an;
    for (int64_t i = 0; i < n; i += stride) {
      const double keep = data[i];
      data[i] = keep + h;
      g.forward();
      const double lp = dot(be.to_host(out.value()), upstream);
      data[i] = keep - h;
      g.forward();
      const double lm = dot(be.to_host(out.value()), upstream);
      data[i] = keep;
      fd.push_back((lp - lm) / (2 * h));
      an.push_back(analytic[size_t(i)]);
    }
    *points += int64_t(fd.size());
    worst = std::max(worst, rel_error(fd, an));
  }
  g.forward();
  return worst;
}

constexpr const char* kForwardOnlyParams =
    "a forward-only case must have no parameters (their gradients would go unchecked)";

// A forward-only case: the forward of every other backend against the double-precision one (ref_out).
void compare_forward(const GradcheckCase& c, const std::vector<double>& ref_out, const std::vector<Backend*>& others,
                     uint32_t seed, GradcheckResult& r) {
  r.pass = true;
  for (Backend* be : others) {
    Graph g(*be);
    std::mt19937 brng(seed);
    Var o = c.build(g, brng);
    if (!g.params().empty()) throw GraphError(kForwardOnlyParams);
    g.forward();
    BackendCheck bc{be->name()};
    bc.forward_error = rel_error(be->to_host(o.value()), ref_out);
    r.pass = r.pass && bc.forward_error <= c.device_bound;
    r.backends.push_back(bc);
  }
}

}  // namespace

Var random_param(Graph& g, std::mt19937& rng, const Shape& shape, const std::string& name, double lo, double hi) {
  return g.param(g.backend().from_host(uniform(rng, numel(shape), lo, hi), shape), name);
}

Var random_constant(Graph& g, std::mt19937& rng, const Shape& shape, const std::string& name, double lo,
                    double hi) {
  return g.constant(g.backend().from_host(uniform(rng, numel(shape), lo, hi), shape), name);
}

Var random_q4_0(Graph& g, std::mt19937& rng, int64_t n_out, int64_t n_in, const std::string& name) {
  return random_frozen(g, rng, frozen_dtype(Format::Q4_0), n_out, n_in, name);
}

Var random_frozen(Graph& g, std::mt19937& rng, DType t, int64_t n_out, int64_t n_in, const std::string& name) {
  if (!is_frozen_storage(t))
    throw GraphError(std::string("random_frozen: ") + dtype_name(t) + " is not a frozen storage type");
  const std::vector<uint8_t> bytes = quantize_matrix(frozen_format(t), uniform(rng, n_out * n_in, -1, 1), n_out, n_in);
  return g.constant(g.backend().quantized(bytes, {n_out, n_in}, t), name);
}

Var ids_constant(Graph& g, const std::vector<int32_t>& ids, const std::string& name) {
  return g.constant(g.backend().from_host_i32(ids, {int64_t(ids.size())}), name);
}

GradcheckResult run_gradcheck(const GradcheckCase& c, const std::vector<Backend*>& others, uint32_t seed) {
  GradcheckResult r;
  r.name = c.name;
  try {
    auto ref_be = Backend::cpu(DType::F64);
    Graph ref(*ref_be);
    std::mt19937 rng(seed);
    Var out = c.build(ref, rng);
    ref.forward();
    const Shape out_shape = out.shape();
    if (c.forward_only) {
      if (!ref.params().empty()) throw GraphError(kForwardOnlyParams);
      compare_forward(c, ref_be->to_host(out.value()), others, seed, r);
      return r;
    }
    std::mt19937 grng(seed + 1);
    const std::vector<float> g32 = uniform(grng, numel(out_shape), -1, 1);
    const std::vector<double> upstream(g32.begin(), g32.end());
    ref.backward(out, ref_be->from_host(g32, out_shape));
    const std::vector<double> ref_out = ref_be->to_host(out.value());
    std::vector<std::vector<double>> ref_grads;
    for (Var p : ref.params()) ref_grads.push_back(ref_be->to_host(ref.grad(p)));
    r.fd_error = check_finite_differences(ref, out, upstream, c.fd_step, &r.fd_points);
    r.pass = r.fd_error <= c.fd_bound;

    for (Backend* be : others) {
      Graph g(*be);
      std::mt19937 brng(seed);
      Var o = c.build(g, brng);
      g.forward();
      BackendCheck bc{be->name()};
      bc.forward_error = rel_error(be->to_host(o.value()), ref_out);
      g.backward(o, be->from_host(g32, out_shape));
      const auto ps = g.params();
      for (size_t k = 0; k < ps.size(); ++k)
        bc.backward_error = std::max(bc.backward_error, rel_error(be->to_host(g.grad(ps[k])), ref_grads.at(k)));
      r.pass = r.pass && bc.forward_error <= c.device_bound && bc.backward_error <= c.device_bound;
      r.backends.push_back(bc);
    }
  } catch (const std::exception& e) {
    r.error = e.what();
    r.pass = false;
  }
  return r;
}

BackendCheck run_mixed_check(const GradcheckCase& c, Backend& f32, Backend& mixed, uint32_t seed) {
  // The forward and the gradients of one backend, from the same inputs and upstream gradient as run_gradcheck's.
  auto run = [&](Backend& be, std::vector<double>& out, std::vector<std::vector<double>>& grads) {
    Graph g(be);
    std::mt19937 brng(seed);
    Var o = c.build(g, brng);
    g.forward();
    out = be.to_host(o.value());
    if (c.forward_only) return;
    std::mt19937 grng(seed + 1);
    const std::vector<float> g32 = uniform(grng, numel(o.shape()), -1, 1);
    g.backward(o, be.from_host(g32, o.shape()));
    for (Var p : g.params()) grads.push_back(be.to_host(g.grad(p)));
  };
  std::vector<double> out_f32, out_mixed;
  std::vector<std::vector<double>> grads_f32, grads_mixed;
  run(f32, out_f32, grads_f32);
  run(mixed, out_mixed, grads_mixed);
  BackendCheck bc{mixed.name() + " (mixed)"};
  bc.forward_error = rel_error(out_mixed, out_f32);
  for (size_t k = 0; k < grads_f32.size(); ++k)
    bc.backward_error = std::max(bc.backward_error, rel_error(grads_mixed.at(k), grads_f32[k]));
  return bc;
}

}  // namespace q4t::ag
