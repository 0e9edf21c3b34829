// A LoRA fine-tune of one frozen Q4_0 linear layer on synthetic regression data: the target is the layer plus
// a rank-4 change, so LoRA of rank 4 can fit it exactly. The loss must fall by >= 100x on the CPU and on the
// Vulkan device, and W's bytes must not change.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "autograd/lora.h"
#include "autograd/ops.h"
#include "kernels/quant/q4_0.h"
#include "kernels/shapes.h"

namespace q4t::ag {
namespace {

constexpr int64_t kOut = 32, kIn = 64, kT = 16, kRank = 4;

// Adam on the host: the optimizer proper comes with the train command; this one only has to converge.
struct HostAdam {
  std::vector<double> m, v;
  int t = 0;
  void step(std::vector<double>& p, const std::vector<double>& g, double lr) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
      p[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
    }
  }
};

struct Result {
  double first_loss = 0, last_loss = 0;
  bool weight_unchanged = false;
};

Result fine_tune(Backend& be, int steps) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> wf(kOut * kIn);
  for (float& x : wf) x = u(rng);
  std::vector<uint8_t> wq(size_t(kOut * row_bytes(Format::Q4_0, kIn)));
  wq = quantize_matrix(Format::Q4_0, wf, kOut, kIn);
  std::vector<double> wd(size_t(kOut * kIn));
  for (int64_t j = 0; j < kOut; ++j)
    quant::dequantize_row_q4_0(wd.data() + j * kIn,
                               reinterpret_cast<const quant::BlockQ4_0*>(wq.data() + j * row_bytes(Format::Q4_0, kIn)), kIn);
  // The teacher's change: delta = Bt·At, rank 4.
  std::vector<double> at(kRank * kIn), bt(kOut * kRank);
  for (double& x : at) x = 0.5 * u(rng);
  for (double& x : bt) x = 0.5 * u(rng);
  for (int64_t j = 0; j < kOut; ++j)
    for (int64_t i = 0; i < kIn; ++i)
      for (int64_t k = 0; k < kRank; ++k) wd[j * kIn + i] += bt[j * kRank + k] * at[k * kIn + i];

  Graph g(be);
  Var w = g.constant(be.quantized(wq, {kOut, kIn}, frozen_dtype(Format::Q4_0)), "w");
  Tensor xt = be.zeros({kT, kIn}, be.real()), yt = be.zeros({kT, kOut}, be.real());
  Var x = g.constant(xt, "x"), target = g.constant(yt, "target");
  LoraConfig cfg;
  cfg.rank = kRank;
  cfg.alpha = kRank;
  LoraLinear lora = LoraLinear::create(w, cfg, "w", rng);
  Var d = add(lora(x), scale(target, -1.0));
  Var r = reshape(d, {1, kT * kOut});
  Var loss = scale(matmul_nt(r, r), 1.0 / double(kT * kOut));

  Result res;
  HostAdam adam_a, adam_b;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> xs(kT * kIn), ys(kT * kOut);
    for (float& v : xs) v = u(rng);
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t j = 0; j < kOut; ++j) {
        double s = 0;
        for (int64_t i = 0; i < kIn; ++i) s += xs[t * kIn + i] * wd[j * kIn + i];
        ys[t * kOut + j] = float(s);
      }
    be.upload(xt, xs);
    be.upload(yt, ys);
    g.forward();
    const double l = be.to_host(loss.value())[0];
    if (step == 0) res.first_loss = l;
    res.last_loss = l;
    g.backward(loss);
    for (auto [p, adam] : {std::pair{lora.a, &adam_a}, std::pair{lora.b, &adam_b}}) {
      std::vector<double> pv = be.to_host(p.value());
      adam->step(pv, be.to_host(g.grad(p)), step < steps / 2 ? 1e-2 : 2e-3);
      Tensor pt = p.value();
      be.upload(pt, std::vector<float>(pv.begin(), pv.end()));
    }
  }
  res.weight_unchanged = be.raw_bytes(w.value()) == wq;
  std::printf("%s: loss %.4g -> %.4g after %d steps (%.0fx lower)\n", be.name().c_str(), res.first_loss,
              res.last_loss, steps, res.first_loss / res.last_loss);
  return res;
}

TEST(LoraTraining, LossFallsAHundredfoldOnTheCpuWithWUnchanged) {
  auto be = Backend::cpu();
  const Result r = fine_tune(*be, 400);
  EXPECT_GT(r.first_loss, 0.0);
  EXPECT_LE(r.last_loss, r.first_loss / 100) << "first " << r.first_loss << " last " << r.last_loss;
  EXPECT_TRUE(r.weight_unchanged);
}

TEST(LoraTraining, LossFallsAHundredfoldOnVulkanWithWUnchanged) {
  auto dev = vk::Device::open({-1, false});
  auto be = Backend::vulkan(*dev);
  const Result r = fine_tune(*be, 400);
  EXPECT_GT(r.first_loss, 0.0);
  EXPECT_LE(r.last_loss, r.first_loss / 100) << "first " << r.first_loss << " last " << r.last_loss;
  EXPECT_TRUE(r.weight_unchanged);
}

}  // namespace
}  // namespace q4t::ag
