// The vocabulary-tiled loss: linear_cross_entropy(x, w, labels, tile) is cross_entropy(linear(x, w), labels)
// without the [T, V] logits. Its loss and dx must match the untiled graph for every tile size, on the CPU in
// f64 and f32 and on the Vulkan device (lavapipe in CI), and its peak extra device memory must be one
// [T, tile] tile, not the logits. Also the loss's edge cases: no counted token, out-of-range ids and labels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "autograd/ops.h"
#include "kernels/quant/q4_0.h"
#include "kernels/shapes.h"

namespace q4t::ag {
namespace {

// Tight bounds: both graphs compute the same sums, only in another order (tiles, online log-sum-exp, dx
// accumulated tile by tile). Norm-wise relative: max |got - want| / max |want|.
constexpr double kBoundF64 = 1e-12;
constexpr double kBoundF32 = 1e-5;

struct Problem {
  int64_t T, C, V;
  std::vector<float> x;         // [T, C]
  std::vector<uint8_t> w;       // [V, C] Q4_0
  std::vector<int32_t> labels;  // [T], every 5th token -100
};

Problem make_problem(int64_t T, int64_t C, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> label(0, int32_t(V - 1));
  Problem p{T, C, V, std::vector<float>(size_t(T * C)), std::vector<uint8_t>(size_t(V * row_bytes(Format::Q4_0, C))),
            std::vector<int32_t>(size_t(T))};
  for (float& v : p.x) v = u(rng);
  std::vector<float> w(size_t(V * C));
  for (float& v : w) v = u(rng);
  p.w = quantize_matrix(Format::Q4_0, w, V, C);
  for (int64_t t = 0; t < T; ++t) p.labels[size_t(t)] = t % 5 == 2 ? -100 : label(rng);
  return p;
}

struct Leaves {
  Var x, w, labels;
};
Leaves leaves(Graph& g, Backend& be, const Problem& p) {
  return {g.param(be.from_host(p.x, {p.T, p.C}), "x"), g.constant(be.quantized(p.w, {p.V, p.C}, frozen_dtype(Format::Q4_0)), "w"),
          g.constant(be.from_host_i32(p.labels, {p.T}), "labels")};
}

struct LossAndGrad {
  double loss;
  std::vector<double> dx;
};

// tile = 0: the untiled reference graph. The seed 0.7 checks that the backward scales by it.
LossAndGrad run(Backend& be, const Problem& p, int64_t tile) {
  Graph g(be);
  const Leaves in = leaves(g, be, p);
  Var loss = tile > 0 ? linear_cross_entropy(in.x, in.w, in.labels, tile)
                       : cross_entropy(linear(in.x, in.w), in.labels);
  g.forward();
  g.backward(loss, be.from_host(std::vector<float>{0.7f}, {1}));
  return {be.to_host(loss.value()).at(0), be.to_host(g.grad(in.x))};
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(got.at(i) - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return std::isfinite(num) ? num / std::max(den, 1e-30) : INFINITY;
}

vk::Device& device() {
  static std::unique_ptr<vk::Device> dev = vk::Device::open({-1, /*validation=*/true});
  return *dev;
}

void expect_no_validation_messages() {
  const auto msgs = device().validation_messages();
  EXPECT_TRUE(msgs.empty()) << "validation: " << (msgs.empty() ? "" : msgs.back());
}

void expect_tiled_matches_untiled(Backend& be, double bound) {
  for (const Problem& p : {make_problem(7, 64, 37, 1), make_problem(70, 96, 200, 2)}) {
    const LossAndGrad want = run(be, p, 0);
    ASSERT_GT(want.loss, 0.0);
    for (int64_t tile : {int64_t(1), int64_t(7), int64_t(64), p.V, p.V + 500}) {
      const LossAndGrad got = run(be, p, tile);
      EXPECT_LE(std::abs(got.loss - want.loss) / want.loss, bound) << be.name() << " V=" << p.V << " tile=" << tile;
      EXPECT_LE(rel_error(got.dx, want.dx), bound) << be.name() << " V=" << p.V << " tile=" << tile;
    }
  }
}

TEST(VocabTiledLoss, MatchesCrossEntropyOfLinearOnTheCpuInDouble) {
  expect_tiled_matches_untiled(*Backend::cpu(DType::F64), kBoundF64);
}

TEST(VocabTiledLoss, MatchesCrossEntropyOfLinearOnTheCpuInFloat) {
  expect_tiled_matches_untiled(*Backend::cpu(DType::F32), kBoundF32);
}

TEST(VocabTiledLoss, MatchesCrossEntropyOfLinearOnVulkan) {
  expect_tiled_matches_untiled(*Backend::vulkan(device()), kBoundF32);
  expect_no_validation_messages();
}

// Measured with the device's allocation accounting from before the leaves exist; the inputs (x, w, labels)
// are subtracted, everything else the graph allocates counts (x's gradient, outputs, saved tile and stats).
TEST(VocabTiledLoss, PeakExtraDeviceMemoryIsOneTileNotTheLogits) {
  const int64_t T = 512, C = 64, V = 32000, tile = 1024;
  const Problem p = make_problem(T, C, V, 3);
  auto be = Backend::vulkan(device());
  const int64_t logits_bytes = T * V * 4, tile_bytes = T * tile * 4;
  auto extra_bytes = [&](bool tiled) {
    device().reset_peak();
    const int64_t before = device().bytes_allocated();
    Graph g(*be);
    const Leaves in = leaves(g, *be, p);
    const int64_t inputs = int64_t(in.x.value().bytes() + in.w.value().bytes() + in.labels.value().bytes());
    Var loss = tiled ? linear_cross_entropy(in.x, in.w, in.labels, tile) : cross_entropy(linear(in.x, in.w), in.labels);
    if (tiled) {
      g.forward();
      g.backward(loss);
      EXPECT_TRUE(std::isfinite(be->to_host(loss.value()).at(0)));
    }
    return device().peak_bytes_allocated() - before - inputs;
  };
  const int64_t tiled = extra_bytes(true);
  RecordProperty("tiled_extra_bytes", std::to_string(tiled));
  EXPECT_LT(tiled, logits_bytes) << "one [T, V] f32 logits matrix is " << logits_bytes << " bytes";
  EXPECT_GE(tiled, tile_bytes) << "the accounting missed the [T, tile] tile";
  // The untiled graph (built only: its memory is allocated at build time) holds the logits and their gradient.
  const int64_t untiled = extra_bytes(false);
  RecordProperty("untiled_extra_bytes", std::to_string(untiled));
  EXPECT_GE(untiled, 2 * logits_bytes);
  std::printf("peak extra bytes: tiled %lld, untiled %lld, one tile %lld, [T, V] logits %lld\n", (long long)tiled,
              (long long)untiled, (long long)tile_bytes, (long long)logits_bytes);
  expect_no_validation_messages();
}

// No counted token (every label -100): loss 0 and dx 0 instead of 0/0, for both losses on every backend.
TEST(VocabTiledLoss, ABatchWithNoCountedTokenHasZeroLossAndZeroGradient) {
  Problem p = make_problem(6, 32, 11, 4);
  std::fill(p.labels.begin(), p.labels.end(), -100);
  auto cpu64 = Backend::cpu(DType::F64), cpu32 = Backend::cpu(DType::F32), vulkan = Backend::vulkan(device());
  for (Backend* be : {cpu64.get(), cpu32.get(), vulkan.get()})
    for (int64_t tile : {int64_t(0), int64_t(4)}) {
      const LossAndGrad r = run(*be, p, tile);
      EXPECT_EQ(r.loss, 0.0) << be->name() << " tile=" << tile;
      EXPECT_EQ(*std::max_element(r.dx.begin(), r.dx.end()), 0.0) << be->name() << " tile=" << tile;
      EXPECT_EQ(*std::min_element(r.dx.begin(), r.dx.end()), 0.0) << be->name() << " tile=" << tile;
    }
  expect_no_validation_messages();
}

TEST(VocabTiledLoss, OutOfRangeIdsAndLabelsAreErrorsOnTheCpu) {
  auto be = Backend::cpu(DType::F32);
  Graph g(*be);
  Var table = g.constant(be->from_host(std::vector<float>(4 * 3, 1.0f), {4, 3}), "table");
  embedding(table, g.constant(be->from_host_i32(std::vector<int32_t>{0, 4}, {2}), "ids"));
  EXPECT_THROW(g.forward(), std::out_of_range);

  Graph g2(*be);
  Var logits = g2.constant(be->from_host(std::vector<float>(2 * 5, 0.5f), {2, 5}), "logits");
  cross_entropy(logits, g2.constant(be->from_host_i32(std::vector<int32_t>{-100, -1}, {2}), "labels"));
  EXPECT_THROW(g2.forward(), std::out_of_range);
}

// A shader cannot throw: the GPU lookup clamps an out-of-range id to the nearest row.
TEST(VocabTiledLoss, OutOfRangeIdsAreClampedOnVulkan) {
  auto be = Backend::vulkan(device());
  Graph g(*be);
  std::vector<float> rows(4 * 3);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = float(i);
  Var table = g.constant(be->from_host(rows, {4, 3}), "table");
  Var y = embedding(table, g.constant(be->from_host_i32(std::vector<int32_t>{-3, 2, 9}, {3}), "ids"));
  g.forward();
  EXPECT_EQ(be->to_host(y.value()), (std::vector<double>{0, 1, 2, 6, 7, 8, 9, 10, 11}));
  expect_no_validation_messages();
}

}  // namespace
}  // namespace q4t::ag
