// The autograd graph: every registered gradient-check case (double-precision finite differences, then the f32
// CPU and the Vulkan device against the double-precision CPU), and the rules that keep quantized weights frozen.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "autograd/gradcheck.h"
#include "autograd/memory_plan.h"
#include "autograd/ops.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"

namespace q4t::ag {
namespace {

struct Backends {
  std::unique_ptr<vk::Device> device = vk::Device::open({-1, /*validation=*/true});
  std::unique_ptr<Backend> cpu32 = Backend::cpu(DType::F32);
  std::unique_ptr<Backend> vulkan = Backend::vulkan(*device);
  std::unique_ptr<Backend> mixed = Backend::vulkan(*device, Precision::Mixed);
};
Backends& backends() {
  static Backends b;
  return b;
}

class Gradcheck : public ::testing::TestWithParam<size_t> {};

TEST_P(Gradcheck, MatchesFiniteDifferencesAndTheDoublePrecisionCpu) {
  const GradcheckCase& c = gradcheck_cases().at(GetParam());
  const GradcheckResult r = run_gradcheck(c, {backends().cpu32.get(), backends().vulkan.get()});
  ASSERT_TRUE(r.error.empty()) << r.error;
  if (!c.forward_only) {
    EXPECT_GT(r.fd_points, 0) << "the case has no parameter";
  }
  EXPECT_LE(r.fd_error, c.fd_bound) << "finite differences (double) vs analytic";
  ASSERT_EQ(r.backends.size(), 2u);
  for (const BackendCheck& b : r.backends) {
    EXPECT_LE(b.forward_error, c.device_bound) << b.backend << " forward";
    EXPECT_LE(b.backward_error, c.device_bound) << b.backend << " backward";
  }
  const auto msgs = backends().device->validation_messages();
  EXPECT_TRUE(msgs.empty()) << "validation: " << (msgs.empty() ? "" : msgs.back());
}

std::string case_test_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string s;
  for (char ch : gradcheck_cases().at(info.param).name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s + "_" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(AllOps, Gradcheck, ::testing::Range(size_t(0), gradcheck_cases().size()), case_test_name);

// Mixed precision (f16 inputs, f32 sums) against f32 on the same device, within each case's stated bound: on a
// device without cooperative matrices the portable kernels (the same tiles, decoding and row scaling), on one
// with them the tensor cores. Cases of fewer than 32 tokens run f32 either way and must agree exactly.
class MixedGradcheck : public ::testing::TestWithParam<size_t> {};

TEST_P(MixedGradcheck, StaysWithinTheCaseBoundOfF32) {
  const GradcheckCase& c = gradcheck_cases().at(GetParam());
  const BackendCheck m = run_mixed_check(c, *backends().vulkan, *backends().mixed);
  EXPECT_LE(m.forward_error, c.mixed_bound) << "forward";
  EXPECT_LE(m.backward_error, c.mixed_bound) << "gradients";
}

INSTANTIATE_TEST_SUITE_P(AllOps, MixedGradcheck, ::testing::Range(size_t(0), gradcheck_cases().size()),
                         case_test_name);

// The mixed products run where they should: a case of 40 tokens differs from f32 (f16 rounding shows), one of 17
// does not (it stays f32).
TEST(MixedPrecision, ProductsOf32TokensOrMoreRunMixedAndFewerStayF32) {
  auto lin = [](int64_t T) {
    return GradcheckCase{"linear", [T](Graph& g, std::mt19937& r) {
                           Var w = random_frozen(g, r, frozen_dtype(Format::Q4_0), 70, 96, "w");
                           return linear(random_param(g, r, {T, 96}, "x"), w);
                         }};
  };
  const BackendCheck many = run_mixed_check(lin(40), *backends().vulkan, *backends().mixed);
  const BackendCheck few = run_mixed_check(lin(17), *backends().vulkan, *backends().mixed);
  EXPECT_GT(many.forward_error, 1e-6);
  EXPECT_LT(many.forward_error, 1e-2);
  EXPECT_EQ(few.forward_error, 0.0);
  EXPECT_EQ(few.backward_error, 0.0);
}

// An op with a backward needs a full gradient check; a forward-only case covers only an op without one.
TEST(OpTable, EveryOpHasAGradientCheckCase) {
  std::set<std::string> gradient_checked, forward_checked;
  for (const auto& c : gradcheck_cases())
    (c.forward_only ? forward_checked : gradient_checked).insert(c.name.substr(0, c.name.find(' ')));
  for (const OpDef* op : op_table()) {
    if (op->backward)
      EXPECT_TRUE(gradient_checked.count(op->name)) << op->name << " has a backward but no gradient-check case";
    else
      EXPECT_TRUE(gradient_checked.count(op->name) || forward_checked.count(op->name)) << op->name << " has no case";
  }
  EXPECT_GE(op_table().size(), 17u);
}

// A forward-only case skips the gradient checks, so it may not hold a parameter whose gradient would go unchecked.
TEST(OpTable, AForwardOnlyCaseWithAParameterFails) {
  GradcheckCase c{"scale forward-only", [](Graph& g, std::mt19937& r) { return scale(random_param(g, r, {3}, "x"), 2); }};
  c.forward_only = true;
  const GradcheckResult r = run_gradcheck(c, {backends().cpu32.get()});
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.error.find("a forward-only case must have no parameters"), std::string::npos) << r.error;
}

Tensor q4_0_weight(Backend& be, int64_t n_out, int64_t n_in) {
  std::vector<float> f(size_t(n_out * n_in));
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(i % 7) - 3.0f;
  std::vector<uint8_t> bytes(size_t(n_out * n_in / 32 * 18));
  bytes = quantize_matrix(Format::Q4_0, f, n_out, n_in);
  return be.quantized(bytes, {n_out, n_in}, frozen_dtype(Format::Q4_0));
}

TEST(GraphRules, MarkingAQuantizedWeightTrainableFails) {
  auto be = Backend::cpu();
  Graph g(*be);
  try {
    g.param(q4_0_weight(*be, 4, 32), "blk.0.attn_q.weight");
    FAIL() << "accepted a quantized parameter";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("'blk.0.attn_q.weight' trainable: it is q4_0"), std::string::npos)
        << e.what();
  }
  Var w = g.constant(q4_0_weight(*be, 4, 32), "w");
  EXPECT_THROW(g.set_trainable(w), GraphError);
}

TEST(GraphRules, BackpropagatingIntoAQuantizedWeightFails) {
  auto be = Backend::cpu();
  Graph g(*be);
  Var w = g.constant(q4_0_weight(*be, 4, 32), "w");
  Var x = g.param(be->from_host(std::vector<float>(64, 0.5f), {2, 32}), "x");
  Var y = linear(x, w);
  g.forward();
  g.backward(y, be->from_host(std::vector<float>(8, 1.0f), {2, 4}));
  EXPECT_EQ(be->to_host(g.grad(x)).size(), 64u);
  try {
    g.grad(w);
    FAIL() << "a quantized weight returned a gradient";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("'w' is quantized (q4_0): frozen weights have no gradient"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(g.backward(w, be->zeros({4, 32}, DType::F32)), GraphError);
}

TEST(GraphRules, ALinearRefusesATrainableWeight) {
  auto be = Backend::cpu();
  Graph g(*be);
  Var w = g.param(be->zeros({4, 32}, DType::F32), "w");
  Var x = g.constant(be->zeros({2, 32}, DType::F32), "x");
  EXPECT_THROW(linear(x, w), GraphError);
}

TEST(GraphRules, ShapeMismatchesNameBothShapes) {
  auto be = Backend::cpu();
  Graph g(*be);
  Var a = g.constant(be->zeros({2, 3}, DType::F32), "a");
  Var b = g.constant(be->zeros({3, 2}, DType::F32), "b");
  try {
    add(a, b);
    FAIL();
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("b [3, 2] must equal a [2, 3]"), std::string::npos) << e.what();
  }
}

// An op's code reads its node's parameters as its own struct; a node holding any other fails at once, by name.
TEST(GraphRules, ANodeWithAnotherOpsParametersFailsNamingTheOp) {
  auto be = Backend::cpu();
  Graph g(*be);
  Var x = g.constant(be->zeros({2, 3}, DType::F32), "x");
  const OpDef* reshape_op = nullptr;
  for (const OpDef* op : op_table())
    if (std::string(op->name) == "reshape") reshape_op = op;
  ASSERT_NE(reshape_op, nullptr);
  try {
    g.add(*reshape_op, {x}, 0.5);
    FAIL();
  } catch (const GraphError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("reshape: its code reads parameters of type", 0), 0u) << e.what();
  }
}

TEST(GraphRules, AVulkanGraphRecordedOnceSeesNewInputsOnEveryRun) {
  auto& be = *backends().vulkan;
  Graph g(be);
  Tensor xt = be.from_host(std::vector<float>{1, 2, 3}, {3});
  Var x = g.constant(xt, "x");
  Var s = g.param(be.from_host(std::vector<float>{2, 2, 2}, {3}), "s");
  Var y = mul(x, s);
  g.forward();
  EXPECT_EQ(be.to_host(y.value()), (std::vector<double>{2, 4, 6}));
  be.upload(xt, std::vector<float>{-1, 0, 5});
  g.forward();
  EXPECT_EQ(be.to_host(y.value()), (std::vector<double>{-2, 0, 10}));
  g.backward(y, be.from_host(std::vector<float>{1, 1, 1}, {3}));
  EXPECT_EQ(be.to_host(g.grad(s)), (std::vector<double>{-1, 0, 5}));
  g.backward(y, be.from_host(std::vector<float>{1, 1, 1}, {3}));  // zeroed first: not doubled
  EXPECT_EQ(be.to_host(g.grad(s)), (std::vector<double>{-1, 0, 5}));
}

// Frozen weights come back as the GGML bytes they were made from, on either backend, although the device keeps
// Q6_K in its own grouped layout (an odd block count: the last group is part padding).
TEST(GraphRules, FrozenWeightsReturnTheirGgmlBytesOnEitherBackend) {
  const int64_t n_out = 3, n_in = 768;
  std::vector<float> f(size_t(n_out * n_in));
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(i % 13) - 6.0f + 0.01f * float(i % 101);
  std::vector<uint8_t> q6(size_t(n_out * n_in / 256 * 210)), q4(size_t(n_out * n_in / 32 * 18));
  q6 = quantize_matrix(Format::Q6_K, f, n_out, n_in);
  q4 = quantize_matrix(Format::Q4_0, f, n_out, n_in);
  for (Backend* be : {backends().cpu32.get(), backends().vulkan.get()}) {
    EXPECT_EQ(be->raw_bytes(be->quantized(q6, {n_out, n_in}, frozen_dtype(Format::Q6_K))), q6) << be->name();
    EXPECT_EQ(be->raw_bytes(be->quantized(q4, {n_out, n_in}, frozen_dtype(Format::Q4_0))), q4) << be->name();
  }
}

TEST(GraphRules, ProfilingTimesEachOpOfTheRecordedPassesWithoutChangingResults) {
  auto& be = *backends().vulkan;
  Graph g(be);
  Var x = g.param(be.from_host(std::vector<float>{1, -2, 3, 0.5f}, {2, 2}), "x");
  Var w = g.constant(be.from_host(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2}), "w");
  Var y = matmul_nt(x, w);  // [2, 3]
  Var z = mul(y, y);
  const std::vector<float> ones(6, 1.0f);
  g.forward();
  g.backward(z, be.from_host(ones, {2, 3}));
  const std::vector<double> want_z = be.to_host(z.value()), want_dx = be.to_host(g.grad(x));
  EXPECT_TRUE(g.op_times().empty());  // off by default

  g.set_profiling(true);
  for (int run = 0; run < 2; ++run) {
    g.forward();
    g.backward(z, be.from_host(ones, {2, 3}));
  }
  EXPECT_EQ(be.to_host(z.value()), want_z);
  EXPECT_EQ(be.to_host(g.grad(x)), want_dx);
  ASSERT_EQ(g.op_times().size(), 2u);
  for (const char* op : {"matmul_nt", "mul"}) {
    ASSERT_TRUE(g.op_times().count(op)) << op;
    EXPECT_GT(g.op_times().at(op).forward_ns, 0.0) << op;
    EXPECT_GT(g.op_times().at(op).backward_ns, 0.0) << op;
  }
  g.clear_op_times();
  EXPECT_TRUE(g.op_times().empty());
  g.set_profiling(false);
  g.forward();
  EXPECT_TRUE(g.op_times().empty());
}

// The arena placement: items live at the same step never share a byte, items that never meet do, and offsets
// keep the alignment. Random lifetimes and sizes, checked pair by pair.
TEST(MemoryPlan, ItemsLiveTogetherNeverShareBytes) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> step(0, 200), len(0, 30), bytes(1, 5000);
  std::vector<PlanItem> items(400);
  for (PlanItem& it : items) {
    it.bytes = size_t(bytes(rng));
    for (int k = 0, t = step(rng) / 2; k < 3 && t < 200; ++k) {
      const int last = t + len(rng);
      it.live.push_back({t, last});
      t = last + 1 + step(rng) / 4;
    }
  }
  items[0].live.clear();  // never used
  const Placement p = place_items(items, 256);
  size_t sum = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    sum += items[i].bytes;
    EXPECT_EQ(p.offset[i] % 256, 0u);
    EXPECT_LE(p.offset[i] + items[i].bytes, p.bytes);
    for (size_t j = 0; j < i; ++j) {
      if (!live_together(items[i], items[j])) continue;
      const bool apart = p.offset[i] + items[i].bytes <= p.offset[j] || p.offset[j] + items[j].bytes <= p.offset[i];
      EXPECT_TRUE(apart) << "items " << i << " and " << j << " are live together and overlap";
    }
  }
  // No placement can beat the bytes live at the busiest step; the greedy one stays near that bound.
  size_t busiest = 0;
  for (int t = 0; t < 300; ++t) {
    size_t live = 0;
    for (const PlanItem& it : items)
      if (live_together(it, {1, {{t, t}}})) live += (it.bytes + 255) / 256 * 256;
    busiest = std::max(busiest, live);
  }
  EXPECT_GE(p.bytes, busiest);
  EXPECT_LT(p.bytes, busiest * 5 / 4) << "busiest step " << busiest << ", all items " << sum;
  // A chain of items that never meet fits in the largest of them.
  const Placement chain = place_items({{100, {{0, 1}}}, {300, {{2, 5}}}, {200, {{6, 6}, {9, 12}}}, {50, {{7, 8}}}}, 4);
  EXPECT_EQ(chain.bytes, 300u);
  EXPECT_TRUE(live_together({1, {{0, 3}, {10, 12}}}, {1, {{12, 14}}}));
  EXPECT_FALSE(live_together({1, {{0, 3}, {10, 12}}}, {1, {{4, 9}, {13, 20}}}));
}

// With recomputation, a value marked with keep() is not computed again, and the gradients stay the same.
TEST(GraphRules, AKeptValueIsNotRecomputedAndChangesNoGradient) {
  auto be = Backend::cpu();
  auto run = [&](bool recompute, bool keep_c, int64_t* recomputed) {
    Graph g(*be);
    Var x = g.param(be->from_host(std::vector<float>{1, -2, 3, 0.5f}, {2, 2}), "x");
    g.defer_memory();
    Var a = mul(x, x);
    Var b = mul(a, x);  // mul's backward reads its inputs: a is computed again
    g.checkpoint(b);
    Var c = mul(b, x);
    Var d = mul(c, x);  // likewise c, unless kept
    g.checkpoint(d);
    Var e = mul(d, d);
    if (keep_c) g.keep(c);
    EXPECT_THROW(g.keep(x), GraphError);  // a leaf
    g.plan_memory(e, recompute);
    EXPECT_THROW(g.keep(a), GraphError);  // planned already
    *recomputed = g.recomputed_steps();
    g.forward();
    g.backward(e, be->from_host(std::vector<float>{1, 1, 1, 1}, {2, 2}));
    return be->to_host(g.grad(x));
  };
  int64_t n_plain = -1, n_again = -1, n_kept = -1;
  const auto plain = run(false, false, &n_plain), again = run(true, false, &n_again), kept = run(true, true, &n_kept);
  EXPECT_EQ(n_plain, 0);
  EXPECT_EQ(n_again, 2);  // a and c
  EXPECT_EQ(n_kept, 1);   // a only
  EXPECT_EQ(again, plain);
  EXPECT_EQ(kept, plain);
}

// With recomputation, a value that no backward reads (add's and scale's backwards read none) is not computed
// again, nor is what only it needed; the gradients stay the same.
TEST(GraphRules, ValuesNoBackwardReadsAreNotRecomputed) {
  auto be = Backend::cpu();
  auto run = [&](bool recompute, int64_t* recomputed) {
    Graph g(*be);
    Var x = g.param(be->from_host(std::vector<float>{1, -2, 3, 0.5f}, {2, 2}), "x");
    g.defer_memory();
    Var p = scale(x, 2.0);
    Var q = add(p, x);
    Var r = scale(q, 3.0);
    Var s = mul(r, x);      // mul's backward reads its inputs: r is needed, and computing r needs q, then p;
                            // s itself is read only by the add below, whose backward reads nothing
    Var t = scale(x, 5.0);  // likewise
    Var u = add(s, t);
    g.checkpoint(u);
    Var v = mul(u, u);
    g.plan_memory(v, recompute);
    *recomputed = g.recomputed_steps();
    g.forward();
    g.backward(v, be->from_host(std::vector<float>{1, 1, 1, 1}, {2, 2}));
    return be->to_host(g.grad(x));
  };
  int64_t n_plain = -1, n_again = -1;
  const auto plain = run(false, &n_plain), again = run(true, &n_again);
  EXPECT_EQ(n_again, 3);  // p, q, r; not s or t
  EXPECT_EQ(again, plain);
}

// A memory-planned graph runs the passes it was planned for, in order, and says so otherwise.
TEST(GraphRules, AMemoryPlannedGraphRunsOnlyThePassesItWasPlannedFor) {
  auto be = Backend::cpu();
  Graph g(*be);
  Var x = g.param(be->from_host(std::vector<float>{1, -2, 3, 0.5f}, {2, 2}), "x");
  g.defer_memory();
  Var y = mul(x, x);
  Var z = scale(y, 3.0);
  Var other = scale(y, 2.0);
  EXPECT_THROW(g.forward(), GraphError);  // not planned yet
  g.plan_memory(z, false);
  EXPECT_GT(g.planned_bytes(), 0u);
  EXPECT_THROW(scale(z, 1.0), GraphError);  // complete once planned
  EXPECT_THROW(g.plan_memory(z, false), GraphError);
  const Tensor seed = be->from_host(std::vector<float>{1, 1, 1, 1}, {2, 2});
  EXPECT_THROW(g.backward(z, seed), GraphError);  // no forward before it
  g.forward();
  EXPECT_EQ(be->to_host(z.value()), (std::vector<double>{3, 12, 27, 0.75}));
  EXPECT_THROW(g.backward(other, seed), GraphError);  // planned for z only
  g.backward(z, seed);
  EXPECT_EQ(be->to_host(g.grad(x)), (std::vector<double>{6, -12, 18, 3}));
  EXPECT_THROW(g.backward(z, seed), GraphError);  // the forward's values are spent
  Graph late(*be);
  Var a = late.param(be->from_host(std::vector<float>{1}, {1}), "a");
  scale(a, 2.0);
  EXPECT_THROW(late.defer_memory(), GraphError);  // after op nodes
}


// n values uniform in [-1, 1).
std::vector<double> uniform_values(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(static_cast<size_t>(n));
  for (double& e : x) e = u(rng);
  return x;
}

// Rows [r0, r1) of a row-major [rows, cols] matrix.
std::vector<double> row_slice(const std::vector<double>& m, int64_t cols, int64_t r0, int64_t r1) {
  return {m.begin() + r0 * cols, m.begin() + r1 * cols};
}

TEST(SegmentedAttention, ASegmentAttendsAsIfItRanAlone) {
  const int64_t T = 7, H = 2, Hkv = 1, D = 8, r0 = 3, r1 = 6;  // the second segment is rows [3, 6)
  const std::vector<int32_t> seg{1, 1, 1, 2, 2, 2, 3};
  auto be = Backend::cpu(DType::F64);
  std::mt19937 rng(7);
  auto random = [&](int64_t n) { return uniform_values(rng, n); };
  const std::vector<double> q = random(T * H * D), k = random(T * Hkv * D), v = random(T * Hkv * D);
  // dL/d(out): random on the second segment's rows, zero elsewhere.
  std::vector<double> dout(size_t(T * H * D), 0.0);
  const std::vector<double> rows = random((r1 - r0) * H * D);
  std::copy(rows.begin(), rows.end(), dout.begin() + r0 * H * D);

  Graph packed(*be);
  Var pq = packed.param(be->from_host(q, {T, H * D}), "q");
  Var pk = packed.param(be->from_host(k, {T, Hkv * D}), "k");
  Var pv = packed.param(be->from_host(v, {T, Hkv * D}), "v");
  Var pout = attention(pq, pk, pv, H, Hkv, ids_constant(packed, seg, "segment_ids"));
  packed.forward();
  packed.backward(pout, be->from_host(dout, {T, H * D}));

  const int64_t n = r1 - r0;
  Graph alone(*be);
  Var aq = alone.param(be->from_host(row_slice(q, H * D, r0, r1), {n, H * D}), "q");
  Var ak = alone.param(be->from_host(row_slice(k, Hkv * D, r0, r1), {n, Hkv * D}), "k");
  Var av = alone.param(be->from_host(row_slice(v, Hkv * D, r0, r1), {n, Hkv * D}), "v");
  Var aout = attention(aq, ak, av, H, Hkv);
  alone.forward();
  alone.backward(aout, be->from_host(row_slice(dout, H * D, r0, r1), {n, H * D}));

  auto expect_near_all = [](const std::vector<double>& got, const std::vector<double>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t e = 0; e < got.size(); ++e) EXPECT_NEAR(got[e], want[e], 1e-6) << what << " element " << e;
  };
  expect_near_all(row_slice(be->to_host(pout.value()), H * D, r0, r1), be->to_host(aout.value()), "out");
  const std::pair<Var, Var> grads[] = {{pq, aq}, {pk, ak}, {pv, av}};
  for (const auto& [p, a] : grads) {
    const int64_t cols = p.shape()[1];
    const std::vector<double> g = be->to_host(packed.grad(p));
    expect_near_all(row_slice(g, cols, r0, r1), be->to_host(alone.grad(a)), "gradient of the segment's rows");
    // No gradient leaks into the other segments, whose outputs have a zero upstream gradient.
    for (int64_t e = 0; e < T * cols; ++e) {
      if (e >= r0 * cols && e < r1 * cols) continue;
      EXPECT_EQ(g[size_t(e)], 0.0) << "gradient element " << e;
    }
  }
}

// A long packed batch: more than 128 tiles of 32 keys (the fused kernels take the segments' tile bits 128 tiles
// at a time), an example across the 4096th token and one of a single token. The device's forward and backward
// against the f32 CPU's (on the tensor cores where the device has them: D = 16), with gradients of order 1 and
// of order 1e-7 (a long sequence's mean loss gives small ones; f16 alone would flush them).
class LongPackedAttention : public ::testing::TestWithParam<double> {};

TEST_P(LongPackedAttention, TheDeviceMatchesTheCpuOverManyTiles) {
  const int64_t H = 2, Hkv = 1, D = 16;
  std::vector<int32_t> seg;
  int32_t id = 0;
  for (int64_t len : {1000, 1, 2200, 1003, 33}) seg.insert(seg.end(), size_t(len), ++id);
  const int64_t T = int64_t(seg.size());
  std::mt19937 rng(11);
  auto random = [&](int64_t n) { return uniform_values(rng, n); };
  const std::vector<double> q = random(T * H * D), k = random(T * Hkv * D), v = random(T * Hkv * D);
  std::vector<double> dout = random(T * H * D);
  for (double& e : dout) e *= GetParam();
  std::vector<std::vector<double>> results[2];
  Backend* bes[2] = {backends().cpu32.get(), backends().vulkan.get()};
  for (int b = 0; b < 2; ++b) {
    Backend& be = *bes[b];
    Graph g(be);
    Var vq = g.param(be.from_host(q, {T, H * D}), "q");
    Var vk = g.param(be.from_host(k, {T, Hkv * D}), "k");
    Var vv = g.param(be.from_host(v, {T, Hkv * D}), "v");
    Var out = attention(vq, vk, vv, H, Hkv, ids_constant(g, seg, "segment_ids"));
    g.forward();
    g.backward(out, be.from_host(dout, {T, H * D}));
    results[b] = {be.to_host(out.value()), be.to_host(g.grad(vq)), be.to_host(g.grad(vk)), be.to_host(g.grad(vv))};
  }
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (size_t t = 0; t < 4; ++t) {
    const std::vector<double>&got = results[1][t], &want = results[0][t];
    ASSERT_EQ(got.size(), want.size());
    double err = 0, scale = 0;
    for (size_t e = 0; e < got.size(); ++e) {
      err = std::max(err, std::abs(got[e] - want[e]));
      scale = std::max(scale, std::abs(want[e]));
    }
    EXPECT_LE(err, 1e-4 * scale) << names[t];  // the gradient checks' bound for the f32 backends
  }
}

INSTANTIATE_TEST_SUITE_P(GradientScales, LongPackedAttention, ::testing::Values(1.0, 1e-7));

}  // namespace
}  // namespace q4t::ag
