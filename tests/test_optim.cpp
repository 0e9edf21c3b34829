// The optimizer and the learning-rate schedule: AdamW on every backend against a plain double-precision AdamW
// written here, gradient norm and clipping on awkward sizes, checkpoint state round trips, convergence on a
// quadratic, and the schedule's values at hand-computed points.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>

#include "autograd/ops.h"
#include "autograd/optim.h"
#include "train/schedule.h"

namespace q4t::ag {
namespace {

vk::Device& device() {
  static std::unique_ptr<vk::Device> dev = vk::Device::open({-1, /*validation=*/false});
  return *dev;
}
Backend& vulkan() {
  static std::unique_ptr<Backend> be = Backend::vulkan(device());
  return *be;
}

std::vector<float> random_values(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// torch.optim.AdamW on one flat parameter, in double.
struct ReferenceAdamW {
  AdamWConfig cfg;
  std::vector<double> p, m, v;
  int64_t t = 0;
  ReferenceAdamW(const AdamWConfig& c, std::vector<double> p0) : cfg(c), p(std::move(p0)), m(p.size()), v(p.size()) {}
  void step(const std::vector<double>& g, double lr) {
    ++t;
    const double bc1 = 1.0 - std::pow(cfg.beta1, double(t)), bc2 = 1.0 - std::pow(cfg.beta2, double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * g[i];
      v[i] = cfg.beta2 * v[i] + (1.0 - cfg.beta2) * g[i] * g[i];
      p[i] = p[i] * (1.0 - lr * cfg.weight_decay) - lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + cfg.eps);
    }
  }
};

void set_grad(Graph& g, Var v, const std::vector<float>& values) {
  Tensor t = g.grad(v);
  g.backend().upload(t, values);
}

// 20 steps with weight decay and a varying rate on parameters of 15 and 7 values (and 70000 where asked):
// the largest |backend - reference| / max(|reference|, 1) over all values.
double adamw_error_against_reference(Backend& be, bool large) {
  const AdamWConfig cfg{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  std::mt19937 rng(7);
  std::vector<Shape> shapes{{3, 5}, {7}};
  if (large) shapes.push_back({70000});
  Graph g(be);
  std::vector<Var> vars;
  std::vector<ReferenceAdamW> refs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const std::vector<float> p0 = random_values(rng, numel(shapes[k]));
    vars.push_back(g.param(be.from_host(p0, shapes[k]), "p"));
    refs.emplace_back(cfg, std::vector<double>(p0.begin(), p0.end()));
  }
  AdamW opt(g, cfg);
  for (int s = 0; s < 20; ++s) {
    const double lr = cfg.lr * (1.0 + 0.5 * std::sin(double(s)));
    for (size_t k = 0; k < vars.size(); ++k) {
      const std::vector<float> grad = random_values(rng, numel(shapes[k]), s % 3 == 0 ? 1e-3f : 1.0f);
      set_grad(g, vars[k], grad);
      refs[k].step(std::vector<double>(grad.begin(), grad.end()), lr);
    }
    opt.step(lr);
  }
  EXPECT_EQ(opt.t(), 20);
  double err = 0;
  for (size_t k = 0; k < vars.size(); ++k) {
    const std::vector<double> got = be.to_host(vars[k].value());
    for (size_t i = 0; i < got.size(); ++i)
      err = std::max(err, std::abs(got[i] - refs[k].p[i]) / std::max(std::abs(refs[k].p[i]), 1.0));
  }
  return err;
}

TEST(AdamW, DoublePrecisionCpuMatchesThePlainDoubleImplementation) {
  auto be = Backend::cpu(DType::F64);
  EXPECT_LE(adamw_error_against_reference(*be, false), 1e-12);
}

TEST(AdamW, FloatCpuMatchesTheDoubleReference) {
  auto be = Backend::cpu(DType::F32);
  EXPECT_LE(adamw_error_against_reference(*be, true), 1e-5);
}

TEST(AdamW, VulkanMatchesTheDoubleReference) { EXPECT_LE(adamw_error_against_reference(vulkan(), true), 1e-5); }

// grad_norm and clip over parameters of 1, 7 and 70000 values, separately and together.
void check_norm_and_clip(Backend& be) {
  const std::vector<std::vector<int64_t>> cases{{1}, {7}, {70000}, {1, 7, 70000}};
  std::mt19937 rng(3);
  for (const auto& sizes : cases) {
    SCOPED_TRACE("sizes " + shape_str(sizes) + " on " + be.name());
    Graph g(be);
    std::vector<Var> vars;
    std::vector<std::vector<float>> grads;
    double sumsq = 0;
    for (int64_t n : sizes) {
      vars.push_back(g.param(be.zeros({n}, be.real()), "p"));
      grads.push_back(random_values(rng, n));
      set_grad(g, vars.back(), grads.back());
      for (float x : grads.back()) sumsq += double(x) * double(x);
    }
    const double norm = std::sqrt(sumsq);
    AdamW opt(g, {.lr = 1e-3});
    const double got = opt.grad_norm();
    EXPECT_NEAR(got, norm, 1e-6 * norm);
    EXPECT_EQ(opt.grad_norm(), got) << "the norm is deterministic";

    EXPECT_NEAR(opt.clip(2 * norm), norm, 1e-6 * norm);
    for (size_t k = 0; k < vars.size(); ++k) {
      const std::vector<double> after = be.to_host(g.grad(vars[k]));
      for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], double(grads[k][i])) << "below max_norm: untouched";
    }

    const double max_norm = norm / 3;
    EXPECT_NEAR(opt.clip(max_norm), norm, 1e-6 * norm);
    EXPECT_NEAR(opt.grad_norm(), max_norm, 1e-5 * max_norm);
    for (size_t k = 0; k < vars.size(); ++k) {
      const std::vector<double> after = be.to_host(g.grad(vars[k]));
      for (size_t i = 0; i < after.size(); ++i)
        ASSERT_NEAR(after[i], grads[k][i] * max_norm / norm, 1e-6 * std::abs(grads[k][i]) + 1e-12) << i;
    }
  }
}

TEST(AdamW, GradNormAndClipOnAwkwardSizesOnTheCpu) {
  check_norm_and_clip(*Backend::cpu(DType::F32));
  check_norm_and_clip(*Backend::cpu(DType::F64));
}

TEST(AdamW, GradNormAndClipOnAwkwardSizesOnVulkan) { check_norm_and_clip(vulkan()); }

// Runs `steps` steps of seeded gradients on every parameter of opt.
void run_steps(Graph& g, AdamW& opt, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int s = 0; s < steps; ++s) {
    for (const Var& v : opt.params()) set_grad(g, v, random_values(rng, v.value().numel()));
    opt.step(3e-3);
  }
}

void check_state_round_trip(Backend& be) {
  SCOPED_TRACE(be.name());
  const AdamWConfig cfg{.lr = 3e-3, .weight_decay = 0.01};
  const std::vector<Shape> shapes{{4, 9}, {70000}};
  std::mt19937 rng(11);
  Graph a(be);
  for (const Shape& s : shapes) a.param(be.from_host(random_values(rng, numel(s)), s), "p");
  AdamW opt_a(a, cfg);
  run_steps(a, opt_a, 5, 100);

  // A second graph starts from the checkpoint: the parameters' values, the moments and t.
  Graph b(be);
  for (const Var& v : opt_a.params()) {
    const std::vector<double> d = be.to_host(v.value());
    b.param(be.from_host(std::vector<float>(d.begin(), d.end()), v.shape()), "p");
  }
  AdamW opt_b(b, cfg);
  opt_b.load_state(opt_a.moments_m(), opt_a.moments_v(), opt_a.t());
  EXPECT_EQ(opt_b.t(), 5);
  EXPECT_EQ(opt_b.moments_m(), opt_a.moments_m());
  EXPECT_EQ(opt_b.moments_v(), opt_a.moments_v());

  run_steps(a, opt_a, 5, 200);
  run_steps(b, opt_b, 5, 200);
  for (size_t k = 0; k < shapes.size(); ++k)
    EXPECT_EQ(be.to_host(opt_a.params()[k].value()), be.to_host(opt_b.params()[k].value())) << "parameter " << k;
  EXPECT_EQ(opt_a.moments_m(), opt_b.moments_m());
  EXPECT_EQ(opt_a.moments_v(), opt_b.moments_v());
  EXPECT_EQ(opt_b.t(), 10);

  auto m = opt_a.moments_m();
  m[1].pop_back();
  EXPECT_THROW(opt_b.load_state(m, opt_a.moments_v(), 10), std::invalid_argument);
  EXPECT_THROW(opt_b.load_state({}, {}, 10), std::invalid_argument);
  EXPECT_THROW(opt_b.load_state(opt_a.moments_m(), opt_a.moments_v(), -1), std::invalid_argument);
}

TEST(AdamW, ExportedStateResumesBitwiseIdenticalSteps) {
  check_state_round_trip(*Backend::cpu(DType::F32));
  check_state_round_trip(vulkan());
}

// Minimises Σ (p - target)² through the graph (backward with a ones seed) under a cosine schedule.
void check_quadratic_converges(Backend& be) {
  SCOPED_TRACE(be.name());
  const int64_t n = 33;
  std::mt19937 rng(5);
  const std::vector<float> target = random_values(rng, n);
  std::vector<float> neg_target(target);
  for (float& x : neg_target) x = -x;
  Graph g(be);
  Var p = g.param(be.zeros({n}, be.real()), "p");
  Var d = add(p, g.constant(be.from_host(neg_target, {n})));
  Var sq = mul(d, d);
  const Tensor seed = be.from_host(std::vector<float>(size_t(n), 1.0f), {n});
  AdamW opt(g, {.lr = 0.1});
  const train::ScheduleConfig sched{.kind = "cosine", .warmup_steps = 10};
  const int64_t steps = 400;
  for (int64_t s = 0; s < steps; ++s) {
    g.forward();
    g.backward(sq, seed);
    opt.clip(10.0);
    opt.step(train::lr_at(s, steps, opt.config().lr, sched));
  }
  const std::vector<double> got = be.to_host(p.value());
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[size_t(i)], target[size_t(i)], 1e-3) << i;
}

TEST(AdamW, ConvergesOnAQuadratic) {
  check_quadratic_converges(*Backend::cpu(DType::F32));
  check_quadratic_converges(vulkan());
}

TEST(AdamW, RejectsInvalidConfigsNamingTheField) {
  auto be = Backend::cpu(DType::F32);
  Graph g(*be);
  g.param(be->zeros({3}, DType::F32), "p");
  auto message = [&](AdamWConfig c) {
    try {
      AdamW opt(g, c);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.lr = -1}).find("lr"), std::string::npos);
  EXPECT_NE(message({.lr = 1, .beta1 = 1.0}).find("beta1"), std::string::npos);
  EXPECT_NE(message({.lr = 1, .beta2 = -0.1}).find("beta2"), std::string::npos);
  EXPECT_NE(message({.lr = 1, .eps = -1}).find("eps"), std::string::npos);
  EXPECT_NE(message({.lr = 1, .weight_decay = -1}).find("weight_decay"), std::string::npos);
  AdamW opt(g, {.lr = 1});
  EXPECT_THROW(opt.clip(0), std::invalid_argument);
  EXPECT_THROW(opt.step(-1), std::invalid_argument);
}

}  // namespace
}  // namespace q4t::ag

namespace q4t::train {
namespace {

constexpr double kPi = std::numbers::pi;

TEST(Schedule, ConstantWarmsUpLinearlyThenHolds) {
  const ScheduleConfig c{.kind = "constant", .warmup_steps = 4};
  EXPECT_DOUBLE_EQ(lr_at(0, 100, 2.0, c), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(1, 100, 2.0, c), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(3, 100, 2.0, c), 1.5);
  EXPECT_DOUBLE_EQ(lr_at(4, 100, 2.0, c), 2.0);
  EXPECT_DOUBLE_EQ(lr_at(99, 100, 2.0, c), 2.0);
  EXPECT_DOUBLE_EQ(lr_at(0, 100, 2.0, {.kind = "constant"}), 2.0);
}

TEST(Schedule, LinearDecaysToMinLrAtTheLastStep) {
  // W = 10, decay over steps 10 .. 110 from 1.0 to 0.1.
  const ScheduleConfig c{.kind = "linear", .warmup_steps = 10, .min_lr = 0.1};
  EXPECT_DOUBLE_EQ(lr_at(5, 110, 1.0, c), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(10, 110, 1.0, c), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(35, 110, 1.0, c), 0.1 + 0.9 * 0.75);
  EXPECT_DOUBLE_EQ(lr_at(60, 110, 1.0, c), 0.55);
  EXPECT_DOUBLE_EQ(lr_at(110, 110, 1.0, c), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(500, 110, 1.0, c), 0.1) << "past the end it stays at min_lr";
  EXPECT_DOUBLE_EQ(lr_at(50, 100, 1.0, {.kind = "linear"}), 0.5);
}

TEST(Schedule, CosineFollowsHalfACosineToMinLr) {
  const ScheduleConfig c{.kind = "cosine", .warmup_steps = 0, .warmup_ratio = 0.1, .min_lr = 0.2};
  // total 200: W = ceil(0.1 * 200) = 20, decay over 180 steps.
  EXPECT_DOUBLE_EQ(lr_at(10, 200, 1.0, c), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(20, 200, 1.0, c), 1.0);
  EXPECT_NEAR(lr_at(65, 200, 1.0, c), 0.2 + 0.8 * 0.5 * (1 + std::cos(kPi * 0.25)), 1e-15);
  EXPECT_NEAR(lr_at(110, 200, 1.0, c), 0.6, 1e-15);
  EXPECT_NEAR(lr_at(200, 200, 1.0, c), 0.2, 1e-15);
  // A ratio that does not divide evenly rounds the warmup up: ceil(0.1 * 15) = 2.
  EXPECT_DOUBLE_EQ(lr_at(1, 15, 1.0, {.kind = "cosine", .warmup_ratio = 0.1}), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(2, 15, 1.0, {.kind = "cosine", .warmup_ratio = 0.1}), 1.0);
  // warmup_steps wins over warmup_ratio.
  EXPECT_DOUBLE_EQ(lr_at(1, 100, 1.0, {.kind = "cosine", .warmup_steps = 4, .warmup_ratio = 0.5}), 0.25);
}

TEST(Schedule, WarmupLongerThanTheRunEndsAtMinLr) {
  const ScheduleConfig c{.kind = "cosine", .warmup_steps = 10, .min_lr = 0.1};
  EXPECT_DOUBLE_EQ(lr_at(5, 5, 1.0, c), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(10, 5, 1.0, c), 0.1);
}

std::string schedule_error(const ScheduleConfig& c, double base_lr = 1.0, int64_t step = 0, int64_t total = 10) {
  try {
    lr_at(step, total, base_lr, c);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(Schedule, RejectsInvalidConfigsNamingTheField) {
  EXPECT_NE(schedule_error({.kind = "step"}).find("kind"), std::string::npos);
  EXPECT_NE(schedule_error({.warmup_steps = -1}).find("warmup_steps"), std::string::npos);
  EXPECT_NE(schedule_error({.warmup_ratio = -0.1}).find("warmup_ratio"), std::string::npos);
  EXPECT_NE(schedule_error({.warmup_ratio = 1.5}).find("warmup_ratio"), std::string::npos);
  EXPECT_NE(schedule_error({.min_lr = -1e-5}).find("min_lr"), std::string::npos);
  EXPECT_NE(schedule_error({.min_lr = 2.0}, 1.0).find("min_lr"), std::string::npos);
  EXPECT_NE(schedule_error({}, -1.0).find("base_lr"), std::string::npos);
  EXPECT_NE(schedule_error({}, 1.0, -1).find("step"), std::string::npos);
  EXPECT_NE(schedule_error({}, 1.0, 0, -5).find("total_steps"), std::string::npos);
  EXPECT_EQ(schedule_error({.kind = "linear", .warmup_steps = 3, .min_lr = 1.0}), "no error");
}

}  // namespace
}  // namespace q4t::train
