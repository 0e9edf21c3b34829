// The Vulkan kernels against the double-precision reference on awkward shapes, on whatever Vulkan device the
// machine has (lavapipe in CI), with the validation layer on when it is installed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "kernels/cpu/reference.h"
#include "kernels/host_kernels.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/linear_kernels.h"
#include "kernels/vulkan/pipeline.h"
#include "kernels/vulkan/shaders.h"

namespace q4t {
namespace {

// f32 accumulation over at most 4128 terms of |x·w| <= 1: comfortably inside 1e-4 relative.
constexpr double kBound = 1e-4;

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

class VulkanKernels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    device_ = vk::Device::open({-1, /*validation=*/true}).release();
    kernels_ = make_vulkan_host_kernels(*device_).release();
  }
  static void TearDownTestSuite() {
    delete kernels_;
    delete device_;
  }
  void TearDown() override {
    const auto msgs = device_->validation_messages();
    EXPECT_TRUE(msgs.empty()) << "validation: " << (msgs.empty() ? "" : msgs.front());
  }
  static vk::Device* device_;
  static HostKernels* kernels_;
  std::mt19937 rng_{42};
};
vk::Device* VulkanKernels::device_ = nullptr;
HostKernels* VulkanKernels::kernels_ = nullptr;

const int64_t kNIn[] = {32, 64, 4096 + 32};
const int64_t kNOut[] = {1, 7, 63, 65, 1000};
const int64_t kT[] = {1, 3, 17};

// The largest relative error of k's Q4_0 GEMM with weights w against the reference, on a random X.
double q4_0_gemm_error(HostKernels& k, std::mt19937& rng, const std::vector<uint8_t>& w, int64_t T, int64_t n_out,
                       int64_t n_in) {
  const auto x = random_floats(rng, T * n_in);
  std::vector<float> y(size_t(T * n_out), NAN);
  k.q4_0_gemm(y, w, x, T, n_out, n_in);
  return ref::max_rel_error(y.data(), ref::q4_0_gemm(w.data(), x.data(), T, n_out, n_in));
}

TEST_F(VulkanKernels, Q4_0ForwardMatchesReferenceOnAwkwardShapes) {
  for (int64_t n_in : kNIn)
    for (int64_t n_out : kNOut)
      for (int64_t T : kT)
        EXPECT_LE(q4_0_gemm_error(*kernels_, rng_, random_q4_0(rng_, n_out, n_in), T, n_out, n_in), kBound)
            << "n_out=" << n_out << " n_in=" << n_in << " T=" << T;
}

// dx (+)= dy · W[j_start:n_out] from k, with and without accumulate (dx drawn from rng), against the reference.
void expect_q4_0_dx_matches(HostKernels& k, std::mt19937& rng, const std::vector<uint8_t>& w,
                            const std::vector<float>& dy, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start,
                            const std::string& what) {
  for (bool acc : {false, true}) {
    auto dx = random_floats(rng, T * n_in);
    const auto dx0 = dx;
    k.q4_0_dx(dx, w, dy, T, n_out, n_in, j_start, n_out, acc);
    const auto want = ref::q4_0_dx(w.data(), dy.data(), acc ? dx0.data() : nullptr, T, n_out, n_in, j_start, n_out);
    EXPECT_LE(ref::max_rel_error(dx.data(), want), kBound) << what << " accumulate=" << acc;
  }
}

TEST_F(VulkanKernels, Q4_0DxMatchesReferenceWithAndWithoutAccumulate) {
  for (int64_t n_in : kNIn)
    for (int64_t n_out : kNOut)
      for (int64_t T : kT) {
        const auto w = random_q4_0(rng_, n_out, n_in);
        const auto dy = random_floats(rng_, T * n_out);
        expect_q4_0_dx_matches(*kernels_, rng_, w, dy, T, n_out, n_in, 0,
                               "n_out=" + std::to_string(n_out) + " n_in=" + std::to_string(n_in) +
                                   " T=" + std::to_string(T));
      }
}

// A tile of 1300 rows makes 11 row chunks for the one-token dx, which the reduce pass adds 4 at a time and then
// the last 3 (q4_0_dx_reduce.comp).
TEST_F(VulkanKernels, Q4_0DxTilesThatDoNotDivideSumToTheUntiledResult) {
  struct Case { int64_t n_out, n_in, T, tile; };
  for (const Case c : {Case{1000, 4128, 1, 300}, Case{1000, 64, 3, 300}, Case{7, 32, 17, 5}, Case{65, 64, 1, 64},
                       Case{63, 4128, 3, 10}, Case{1000, 4128, 300, 300}, Case{1400, 64, 1, 1300}}) {
    const auto w = random_q4_0(rng_, c.n_out, c.n_in);
    const auto dy = random_floats(rng_, c.T * c.n_out);
    std::vector<float> dx(size_t(c.T * c.n_in), NAN);
    for (int64_t j = 0; j < c.n_out; j += c.tile)
      kernels_->q4_0_dx(dx, w, dy, c.T, c.n_out, c.n_in, j, std::min(c.n_out, j + c.tile), j > 0);
    const auto want = ref::q4_0_dx(w.data(), dy.data(), nullptr, c.T, c.n_out, c.n_in, 0, c.n_out);
    EXPECT_LE(ref::max_rel_error(dx.data(), want), kBound) << "n_out=" << c.n_out << " tile=" << c.tile;
    // One tile alone only touches its own rows of W.
    std::vector<float> part(size_t(c.T * c.n_in));
    kernels_->q4_0_dx(part, w, dy, c.T, c.n_out, c.n_in, c.tile, std::min(c.n_out, 2 * c.tile), false);
    if (c.tile < c.n_out) {
      const auto want_part =
          ref::q4_0_dx(w.data(), dy.data(), nullptr, c.T, c.n_out, c.n_in, c.tile, std::min(c.n_out, 2 * c.tile));
      EXPECT_LE(ref::max_rel_error(part.data(), want_part), kBound);
    }
  }
}

// --- Q8_0, F16, Q4_K and Q6_K: the same checks, once per format -------------------------------------------------

std::vector<uint8_t> random_q8_0(std::mt19937& rng, int64_t n_out, int64_t n_in) {
  std::vector<uint8_t> w(size_t(n_out * q8_0_row_bytes(n_in)));
  quant::quantize_q8_0(w, random_floats(rng, n_out * n_in), n_out, n_in);
  return w;
}

std::vector<uint8_t> random_f16(std::mt19937& rng, int64_t n_out, int64_t n_in) {
  std::vector<uint8_t> w(size_t(n_out * f16_row_bytes(n_in)));
  quant::f32_row_to_f16(w.data(), random_floats(rng, n_out * n_in).data(), n_out * n_in);
  return w;
}

std::vector<uint8_t> random_q4_k(std::mt19937& rng, int64_t n_out, int64_t n_in) {
  std::vector<uint8_t> w(size_t(n_out * q4_k_row_bytes(n_in)));
  quant::quantize_q4_k(w, random_floats(rng, n_out * n_in), n_out, n_in);
  return w;
}

std::vector<uint8_t> random_q6_k(std::mt19937& rng, int64_t n_out, int64_t n_in) {
  std::vector<uint8_t> w(size_t(n_out * q6_k_row_bytes(n_in)));
  quant::quantize_q6_k(w, random_floats(rng, n_out * n_in), n_out, n_in);
  return w;
}

// A table or output matrix in the shaders' format code (5 = Q6_K) as a Vulkan buffer holds it: Q6_K in the
// grouped layout (kernels/shapes.h), the others as GGML stores them.
std::vector<uint8_t> device_bytes(uint32_t format, const std::vector<uint8_t>& w) {
  return format == 5 ? quant::q6_k_to_device(w) : w;
}

// Row-range tiles of a dx: rows [0, n_out) in steps of `tile`, with T tokens.
struct DxTileCase {
  int64_t n_out, n_in, T, tile;
};

// A frozen weight format: how to make W, its host kernels and its references, and the shapes to check. F16 adds
// n_in = 2 and 98 (even, but not a multiple of 4, 32 or the tile width); the K-quants take whole super-blocks
// (n_in = 256 and 9·256, both odd block counts, so Q6_K rows start at every place in the device's groups of 8
// blocks) and odd row counts around their GEMV row groups. The first width is the smallest.
struct FrozenFormat {
  const char* name;
  std::vector<uint8_t> (*make)(std::mt19937&, int64_t, int64_t);
  decltype(&HostKernels::q8_0_gemm) gemm;
  decltype(&HostKernels::q8_0_dx) dx;
  decltype(&ref::q8_0_gemm) ref_gemm;
  decltype(&ref::q8_0_dx) ref_dx;
  std::vector<int64_t> n_ins, n_outs;
  std::vector<DxTileCase> dx_tiles;
  bool k_quant = false;  // 256-weight super-blocks
};

const std::vector<DxTileCase> kBlock32DxTiles = {{1000, 4128, 1, 300}, {1000, 64, 3, 300}, {7, 32, 17, 5},
                                                 {65, 64, 1, 64},      {63, 4128, 3, 10},  {200, 96, 130, 70}};
// 1000 rows of one super-block make 8 row chunks for the one-token dx (at least 128 rows each), reduced in order
// 4 at a time; a tile of 1300 rows makes 11, so the reduce pass also adds a last 3.
const std::vector<DxTileCase> kKQuantDxTiles = {{1000, 256, 1, 300}, {1000, 256, 1, 1000}, {257, 768, 1, 100},
                                                {37, 256, 3, 10},    {130, 512, 65, 70},   {257, 256, 17, 64},
                                                {1400, 256, 1, 1300}};

// K-quant widths: 1 and 9 super-blocks (odd counts: Q6_K rows start anywhere in a group of 8 blocks, and the
// last group is part padding) and 18 (the one-token kernels' invocations take more than one pass).
const FrozenFormat kFrozenFormats[] = {
    {"q8_0", random_q8_0, &HostKernels::q8_0_gemm, &HostKernels::q8_0_dx, ref::q8_0_gemm, ref::q8_0_dx,
     {32, 64, 4128}, {1, 7, 63, 65, 1000}, kBlock32DxTiles},
    {"f16", random_f16, &HostKernels::f16_gemm, &HostKernels::f16_dx, ref::f16_gemm, ref::f16_dx,
     {2, 32, 64, 98, 4128}, {1, 7, 63, 65, 1000}, kBlock32DxTiles},
    {"q4_k", random_q4_k, &HostKernels::q4_k_gemm, &HostKernels::q4_k_dx, ref::q4_k_gemm, ref::q4_k_dx,
     {256, 2304, 4608}, {1, 3, 37, 257}, kKQuantDxTiles, true},
    {"q6_k", random_q6_k, &HostKernels::q6_k_gemm, &HostKernels::q6_k_dx, ref::q6_k_gemm, ref::q6_k_dx,
     {256, 2304, 4608}, {1, 3, 37, 257}, kKQuantDxTiles, true},
};

// The largest relative error of format f's GEMM against its reference, on a random W and X.
double frozen_gemm_error(HostKernels& k, std::mt19937& rng, const FrozenFormat& f, int64_t T, int64_t n_out,
                         int64_t n_in) {
  const auto w = f.make(rng, n_out, n_in);
  const auto x = random_floats(rng, T * n_in);
  std::vector<float> y(size_t(T * n_out), NAN);
  (k.*f.gemm)(y, w, x, T, n_out, n_in);
  return ref::max_rel_error(y.data(), f.ref_gemm(w.data(), x.data(), T, n_out, n_in));
}

TEST_F(VulkanKernels, FrozenFormatsForwardMatchReferenceOnAwkwardShapes) {
  for (const FrozenFormat& f : kFrozenFormats)
    for (int64_t n_in : f.n_ins)
      for (int64_t n_out : f.n_outs)
        for (int64_t T : kT)
          EXPECT_LE(frozen_gemm_error(*kernels_, rng_, f, T, n_out, n_in), kBound)
              << f.name << " n_out=" << n_out << " n_in=" << n_in << " T=" << T;
}

// The one-token GEMVs of Q4_0, Q4_K and Q6_K take 8-bit integer dot products on activations as limbs where the
// device has them (lavapipe does) and the matrix is large: both that path, forced here, and the float one match
// the reference, on rows that are odd in number (Q6_K rows starting anywhere in a group of 8 blocks), widths of
// one block or super-block and more, and activations whose groups mix values six decades apart with groups of
// zeros (one scale per group: the small values keep 2^-24 of the group's largest).
TEST_F(VulkanKernels, OneTokenGemvsMatchReferenceOnEitherPath) {
  using Mode = vk::LinearKernels::IntegerDot;
  if (!device_->integer_dot()) GTEST_SKIP() << device_->name() << " has no 8-bit integer dot products";
  const auto dot_path = make_vulkan_host_kernels(*device_, 0, Mode::Always);
  const auto float_path = make_vulkan_host_kernels(*device_, 0, Mode::Never);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto spread = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t group = i / 32;
      x[i] = group % 3 == 2 ? 0.0f : u(rng_) * (i % 29 == 0 ? 1e3f : group % 3 == 1 ? 1e-3f : 1.0f);
    }
    return x;
  };
  struct Case {
    const char* name;
    std::vector<uint8_t> (*make)(std::mt19937&, int64_t, int64_t);
    decltype(&HostKernels::q8_0_gemm) gemm;
    decltype(&ref::q8_0_gemm) ref_gemm;
    std::vector<int64_t> n_ins;
  };
  const Case cases[] = {{"q4_0", random_q4_0, &HostKernels::q4_0_gemm, ref::q4_0_gemm, {32, 96, 4128}},
                        {"q4_k", random_q4_k, &HostKernels::q4_k_gemm, ref::q4_k_gemm, {256, 2304, 4608}},
                        {"q6_k", random_q6_k, &HostKernels::q6_k_gemm, ref::q6_k_gemm, {256, 2304, 4608}}};
  for (HostKernels* k : {dot_path.get(), float_path.get()})
    for (const Case& c : cases)
      for (int64_t n_in : c.n_ins)
        for (int64_t n_out : {1, 3, 37, 257})
          for (bool wide : {false, true}) {
            const auto w = c.make(rng_, n_out, n_in);
            const auto x = wide ? spread(n_in) : random_floats(rng_, n_in);
            std::vector<float> y(size_t(n_out), NAN);
            (k->*c.gemm)(y, w, x, 1, n_out, n_in);
            EXPECT_LE(ref::max_rel_error(y.data(), c.ref_gemm(w.data(), x.data(), 1, n_out, n_in)), kBound)
                << c.name << (k == dot_path.get() ? " integer-dot path" : " float path") << " n_out=" << n_out
                << " n_in=" << n_in << (wide ? " wide activations" : "");
          }
}

// Products of few output tiles split over K into slices that a second pass adds in order (the HostKernels adaptor
// passes the scratch): the last slice shorter than the others for Q4_0 (129 blocks), whole slices for the rest.
TEST_F(VulkanKernels, ForwardGemmsSplitOverKMatchReference) {
  const int64_t T = 65, n_out = 65;
  for (int64_t n_in : {int64_t(4128), int64_t(4608)}) {
    ASSERT_GT(vk::LinearKernels::gemm_scratch_bytes(T, n_out, n_in), 0u) << "n_in=" << n_in << " is not split";
    EXPECT_LE(q4_0_gemm_error(*kernels_, rng_, random_q4_0(rng_, n_out, n_in), T, n_out, n_in), kBound)
        << "q4_0 n_in=" << n_in;
  }
  for (const FrozenFormat& f : kFrozenFormats)
    EXPECT_LE(frozen_gemm_error(*kernels_, rng_, f, T, n_out, 4608), kBound) << f.name;
}

// Tile shapes of the tensor-core GEMM's way out (where the device has it; the FP32 kernels elsewhere): output
// tiles wholly inside Y, whose rows go straight to memory, beside edge tiles cut by T or n_out, with and without
// a split over K, and an n_out that is not a multiple of 4 (every tile through the staging path).
TEST_F(VulkanKernels, Q4_0GemmTilesInsideAndAtTheEdgesMatchReference) {
  struct Case { int64_t T, n_out, n_in; };
  for (const Case& c : {Case{64, 128, 256}, Case{129, 260, 4128}, Case{96, 384, 2048}, Case{128, 258, 1024}})
    EXPECT_LE(q4_0_gemm_error(*kernels_, rng_, random_q4_0(rng_, c.n_out, c.n_in), c.T, c.n_out, c.n_in), kBound)
        << "T=" << c.T << " n_out=" << c.n_out << " n_in=" << c.n_in;
}

// A window of W's rows on the tensor cores (the vocab-tiled loss's Q4_0 logits): where the device has cooperative
// matrices, windows that start mid-matrix and end short of a tile match the reference for those rows; elsewhere
// the call declines and records nothing.
TEST_F(VulkanKernels, TensorCoreRowWindowsMatchReferenceOrAreDeclined) {
  const int64_t T = 65, n_rows = 300, n_in = 4128;
  const auto w_host = random_q4_0(rng_, n_rows, n_in);
  const auto x_host = random_floats(rng_, T * n_in);
  vk::Buffer w(*device_, w_host.size()), x(*device_, x_host.size() * 4), y(*device_, size_t(T * n_rows) * 4);
  w.upload(w_host);
  x.upload(x_host);
  vk::LinearKernels k(*device_);
  for (const auto& [row0, n] : {std::pair<int64_t, int64_t>{0, 128}, {128, 172}, {299, 1}}) {
    vk::Sequence s(*device_);
    s.begin();
    const bool took = k.q4_0_gemm_rows_coop(s, y, w, x, T, n_rows, row0, n, n_in);
    s.end();
    EXPECT_EQ(took, device_->coop_matrix());
    EXPECT_EQ(s.dispatch_count(), took ? 1u : 0u);
    if (!took) continue;
    s.run();
    const auto want = ref::q4_0_gemm(w_host.data() + row0 * q4_0_row_bytes(n_in), x_host.data(), T, n, n_in);
    EXPECT_LE(ref::max_rel_error(y.download_as<float>(size_t(T * n)).data(), want), kBound) << "rows from " << row0;
  }
  vk::Sequence s(*device_);
  s.begin();
  if (device_->coop_matrix()) {
    EXPECT_THROW(k.q4_0_gemm_rows_coop(s, y, w, x, T, n_rows, 200, 101, n_in), ShapeError);
  }
  s.end();
}

// Inputs of the tensor-core products that add a LoRA adapter's term: a [rows, r] hs or dh whose rows run over
// six decades (10^-3 .. 10^3 by row), and values near 1e-5 (B or A early in training) with zeros where `zero` says.
std::vector<float> decades_by_row(std::mt19937& rng, int64_t rows, int64_t r) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(size_t(rows * r));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < r; ++j) v[size_t(t * r + j)] = u(rng) * std::pow(10.0f, float(t % 7 - 3));
  return v;
}
template <class Zero>
std::vector<float> small_values(std::mt19937& rng, int64_t rows, int64_t cols, Zero zero) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[size_t(i * cols + j)] = zero(i, j) ? 0.0f : 1e-5f * u(rng);
  return v;
}
std::vector<float> scaled_floats(std::mt19937& rng, int64_t n, float scale) {
  auto v = random_floats(rng, n);
  for (float& x : v) x *= scale;
  return v;
}
// got [rows, cols] against want row by row, each row against its own largest value: a term that outweighs the
// rest only in some rows is checked there.
void expect_rows_match(const std::vector<float>& got, const std::vector<double>& want, int64_t rows, int64_t cols,
                       const std::string& what) {
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<double> row(want.begin() + t * cols, want.begin() + (t + 1) * cols);
    ASSERT_LE(ref::max_rel_error(got.data() + t * cols, row), kBound) << what << " row " << t;
  }
}

// A LoRA adapter's term hs·Bᵀ added by the tensor-core GEMM after its main loop (lora_linear's forward), against
// the reference product plus hs·Bᵀ in doubles: tiles cut by T and n_out, products split over K (only the first
// slice adds the term), X split once per product (n_out of 4 tiles and more), ranks that are not a multiple of 16
// up to 32. Rows of hs six decades apart and a B near 1e-5 with a row of zeros: each row of hs and of B gets its
// own power-of-two scale, and in the rows of the largest hs the term outweighs X·Wᵀ (X near 1e-4). Declined,
// with nothing recorded, without tensor cores and above rank 32.
TEST_F(VulkanKernels, TensorCoreGemmAddsTheAdapterTermOrDeclines) {
  struct Case { int64_t T, n_out, n_in, r; };
  vk::LinearKernels k(*device_);
  for (const Case c : {Case{64, 128, 256, 16}, Case{129, 260, 4128, 16}, Case{96, 512, 2048, 8}, Case{40, 130, 512, 32},
                       Case{65, 65, 4608, 5}, Case{512, 1024, 128, 16}}) {
    const auto w_host = random_q4_0(rng_, c.n_out, c.n_in);
    const auto x_host = scaled_floats(rng_, c.T * c.n_in, 1e-4f);
    const auto hs_host = decades_by_row(rng_, c.T, c.r);
    const auto b_host = small_values(rng_, c.n_out, c.r, [](int64_t n, int64_t) { return n == 3; });
    vk::Buffer w(*device_, w_host.size()), x(*device_, x_host.size() * 4), y(*device_, size_t(c.T * c.n_out) * 4);
    vk::Buffer hs(*device_, hs_host.size() * 4), b(*device_, b_host.size() * 4);
    vk::Buffer scratch(*device_, std::max<size_t>(k.forward_scratch_bytes(c.T, c.n_out, c.n_in), 4));
    w.upload(w_host);
    x.upload(x_host);
    hs.upload(hs_host);
    b.upload(b_host);
    vk::Sequence s(*device_);
    s.begin();
    const bool took = k.q4_0_gemm_lora(s, y, w, x, c.T, c.n_out, c.n_in, &scratch, hs, b, c.r);
    s.end();
    EXPECT_EQ(took, device_->coop_matrix());
    EXPECT_EQ(s.dispatch_count() > 0, took);
    if (!took) continue;
    s.run();
    auto want = ref::q4_0_gemm(w_host.data(), x_host.data(), c.T, c.n_out, c.n_in);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t n = 0; n < c.n_out; ++n)
        for (int64_t j = 0; j < c.r; ++j)
          want[size_t(t * c.n_out + n)] += double(hs_host[size_t(t * c.r + j)]) * b_host[size_t(n * c.r + j)];
    expect_rows_match(y.download_as<float>(size_t(c.T * c.n_out)), want, c.T, c.n_out,
                      "T=" + std::to_string(c.T) + " n_out=" + std::to_string(c.n_out) + " r=" + std::to_string(c.r));
  }
  vk::Buffer any(*device_, 1 << 20);
  vk::Sequence s(*device_);
  s.begin();
  EXPECT_FALSE(k.q4_0_gemm_lora(s, any, any, any, 64, 128, 256, nullptr, any, any, 33));
  s.end();
  EXPECT_EQ(s.dispatch_count(), 0u);
}

// The backward's counterpart: dX += dY·W + dh·A by the tensor-core dx after its main loop (lora_linear's
// backward where the frozen product and the adapter read one input), against doubles row by row: tiles cut by T
// and n_in, products split over W's rows (only the first slice adds the term), dY split once per product or not,
// ranks 5 to 32; rows of dh six decades apart, an A near 1e-5 (one power-of-two scale per tile of A) with a zero
// column, dY near 1e-4 so that the term outweighs dY·W in some rows, and a dX that already holds values (of the
// same size). Declined, with nothing recorded, without tensor cores and above rank 32.
TEST_F(VulkanKernels, TensorCoreDxAddsTheAdapterTermOrDeclines) {
  struct Case { int64_t T, n_out, n_in, r; bool scratch; };
  vk::LinearKernels k(*device_);
  for (const Case c : {Case{64, 128, 128, 16, true}, Case{129, 4128, 288, 16, true}, Case{96, 2048, 512, 8, false},
                       Case{40, 512, 160, 32, true}, Case{65, 256, 4096, 5, true}}) {
    const auto w_host = random_q4_0(rng_, c.n_out, c.n_in);
    const auto dy_host = scaled_floats(rng_, c.T * c.n_out, 1e-4f);
    const auto dx0 = scaled_floats(rng_, c.T * c.n_in, 1e-4f);
    const auto dh_host = decades_by_row(rng_, c.T, c.r);
    const auto a_host = small_values(rng_, c.r, c.n_in, [](int64_t, int64_t n) { return n == 5; });
    vk::Buffer w(*device_, w_host.size()), dy(*device_, dy_host.size() * 4), dx(*device_, dx0.size() * 4);
    vk::Buffer dh(*device_, dh_host.size() * 4), a(*device_, a_host.size() * 4);
    vk::Buffer scratch(*device_, std::max<size_t>(k.q4_0_dx_device_scratch_bytes(c.T, c.n_out, c.n_in), 4));
    w.upload(w_host);
    dy.upload(dy_host);
    dx.upload(dx0);
    dh.upload(dh_host);
    a.upload(a_host);
    vk::Sequence s(*device_);
    s.begin();
    const bool took = k.q4_0_dx_lora(s, dx, w, dy, c.scratch ? &scratch : nullptr, c.T, c.n_out, c.n_in, dh, a, c.r);
    s.end();
    EXPECT_EQ(took, device_->coop_matrix());
    EXPECT_EQ(s.dispatch_count() > 0, took);
    if (!took) continue;
    s.run();
    auto want = ref::q4_0_dx(w_host.data(), dy_host.data(), dx0.data(), c.T, c.n_out, c.n_in, 0, c.n_out);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t n = 0; n < c.n_in; ++n)
        for (int64_t j = 0; j < c.r; ++j)
          want[size_t(t * c.n_in + n)] += double(dh_host[size_t(t * c.r + j)]) * a_host[size_t(j * c.n_in + n)];
    expect_rows_match(dx.download_as<float>(size_t(c.T * c.n_in)), want, c.T, c.n_in,
                      "T=" + std::to_string(c.T) + " n_in=" + std::to_string(c.n_in) + " r=" + std::to_string(c.r));
  }
  vk::Buffer any(*device_, 1 << 20);
  vk::Sequence s(*device_);
  s.begin();
  EXPECT_FALSE(k.q4_0_dx_lora(s, any, any, any, nullptr, 64, 128, 128, any, any, 33));
  s.end();
  EXPECT_EQ(s.dispatch_count(), 0u);
}

// The loss's dx for a window of W's rows on the tensor cores: dX += d[T, n] · W[row0 : row0 + n], windows that
// start off a 32-row boundary and one of a single row; declined (nothing recorded) without tensor cores.
TEST_F(VulkanKernels, TensorCoreDxRowWindowsMatchReferenceOrAreDeclined) {
  const int64_t T = 65, n_rows = 300, n_in = 4128;
  const auto w_host = random_q4_0(rng_, n_rows, n_in);
  vk::Buffer w(*device_, w_host.size()), dx(*device_, size_t(T * n_in) * 4);
  w.upload(w_host);
  vk::LinearKernels k(*device_);
  for (const auto& [row0, n] : {std::pair<int64_t, int64_t>{0, 128}, {128, 172}, {299, 1}}) {
    const auto d_host = random_floats(rng_, T * n), dx0 = random_floats(rng_, T * n_in);
    vk::Buffer d(*device_, d_host.size() * 4);
    vk::Buffer scratch(*device_, std::max<size_t>(k.q4_0_dx_device_scratch_bytes(T, n, n_in), 4));
    d.upload(d_host);
    dx.upload(dx0);
    vk::Sequence s(*device_);
    s.begin();
    const bool took = k.q4_0_dx_rows_coop(s, dx, w, d, scratch, T, n_rows, row0, n, n_in);
    s.end();
    EXPECT_EQ(took, device_->coop_matrix());
    if (!took) {
      EXPECT_EQ(s.dispatch_count(), 0u);
      continue;
    }
    s.run();
    const auto want =
        ref::q4_0_dx(w_host.data() + row0 * q4_0_row_bytes(n_in), d_host.data(), dx0.data(), T, n, n_in, 0, n);
    EXPECT_LE(ref::max_rel_error(dx.download_as<float>(size_t(T * n_in)).data(), want), kBound) << "rows from " << row0;
  }
}

// The tensor-core dx given a scratch too small for dY split once (only the slices' size): it converts dY in each
// workgroup instead. The FP32 dx elsewhere.
TEST_F(VulkanKernels, Q4_0DxWithTheSmallerScratchMatchesReference) {
  const int64_t T = 65, n_out = 300, n_in = 1056;
  const auto w_host = random_q4_0(rng_, n_out, n_in);
  const auto dy_host = random_floats(rng_, T * n_out), dx0 = random_floats(rng_, T * n_in);
  vk::Buffer w(*device_, w_host.size()), dy(*device_, dy_host.size() * 4), dx(*device_, dx0.size() * 4);
  w.upload(w_host);
  dy.upload(dy_host);
  dx.upload(dx0);
  vk::LinearKernels k(*device_);
  const size_t small = vk::LinearKernels::q4_0_dx_scratch_bytes(T, n_out - 7, n_in);
  if (device_->coop_matrix()) EXPECT_LT(small, k.q4_0_dx_device_scratch_bytes(T, n_out - 7, n_in));
  vk::Buffer scratch(*device_, std::max<size_t>(small, 4));
  vk::Sequence s(*device_);
  s.begin();
  k.q4_0_dx(s, dx, w, dy, &scratch, T, n_out, n_in, 7, n_out, true);
  s.end();
  s.run();
  const auto want = ref::q4_0_dx(w_host.data(), dy_host.data(), dx0.data(), T, n_out, n_in, 7, n_out);
  EXPECT_LE(ref::max_rel_error(dx.download_as<float>(size_t(T * n_in)).data(), want), kBound);
}

// 65 tokens x 130 rows: two 64-wide GEMM tiles each way, the second holding one token and two rows.
TEST_F(VulkanKernels, FrozenFormatsGemmTilesThatDoNotDivideMatchReference) {
  const int64_t T = 65, n_out = 130, n_in = 512;
  for (const FrozenFormat& f : kFrozenFormats)
    EXPECT_LE(frozen_gemm_error(*kernels_, rng_, f, T, n_out, n_in), kBound) << f.name;
}

TEST_F(VulkanKernels, FrozenFormatsDxMatchReferenceWithAndWithoutAccumulate) {
  for (const FrozenFormat& f : kFrozenFormats)
    for (int64_t n_in : f.n_ins)
      for (int64_t n_out : f.n_outs)
        for (int64_t T : kT) {
          const auto w = f.make(rng_, n_out, n_in);
          const auto dy = random_floats(rng_, T * n_out);
          for (bool acc : {false, true}) {
            auto dx = random_floats(rng_, T * n_in);
            const auto dx0 = dx;
            (kernels_->*f.dx)(dx, w, dy, T, n_out, n_in, 0, n_out, acc);
            const auto want = f.ref_dx(w.data(), dy.data(), acc ? dx0.data() : nullptr, T, n_out, n_in, 0, n_out);
            EXPECT_LE(ref::max_rel_error(dx.data(), want), kBound)
                << f.name << " n_out=" << n_out << " n_in=" << n_in << " T=" << T << " accumulate=" << acc;
          }
        }
}

TEST_F(VulkanKernels, FrozenFormatsDxTilesThatDoNotDivideSumToTheUntiledResult) {
  for (const FrozenFormat& f : kFrozenFormats)
    for (const DxTileCase c : f.dx_tiles) {
      const auto w = f.make(rng_, c.n_out, c.n_in);
      const auto dy = random_floats(rng_, c.T * c.n_out);
      std::vector<float> dx(size_t(c.T * c.n_in), NAN);
      for (int64_t j = 0; j < c.n_out; j += c.tile)
        (kernels_->*f.dx)(dx, w, dy, c.T, c.n_out, c.n_in, j, std::min(c.n_out, j + c.tile), j > 0);
      const auto want = f.ref_dx(w.data(), dy.data(), nullptr, c.T, c.n_out, c.n_in, 0, c.n_out);
      EXPECT_LE(ref::max_rel_error(dx.data(), want), kBound)
          << f.name << " n_out=" << c.n_out << " T=" << c.T << " tile=" << c.tile;
      // One tile alone only touches its own rows of W.
      if (c.tile < c.n_out) {
        std::vector<float> part(size_t(c.T * c.n_in));
        const int64_t j1 = std::min(c.n_out, 2 * c.tile);
        (kernels_->*f.dx)(part, w, dy, c.T, c.n_out, c.n_in, c.tile, j1, false);
        const auto want_part = f.ref_dx(w.data(), dy.data(), nullptr, c.T, c.n_out, c.n_in, c.tile, j1);
        EXPECT_LE(ref::max_rel_error(part.data(), want_part), kBound) << f.name << " rows " << c.tile << ".." << j1;
      }
    }
}

// The one-token dx of Q4_0 and Q4_K with and without the f16 decode (q4_0_dx_split_pairs.comp,
// q4_k_dx_split.glsl). Q4_0 widths of an even block count take the pairs kernel: 1 pair, 17 pairs (three
// workgroups along x, the last one partly out of range) and 65 pairs, over all rows and from row 7 on (dy then
// not read as vec4s); odd counts keep q4_0_dx_split.comp either way.
TEST_F(VulkanKernels, OneTokenDxWithAndWithoutTheF16DecodeMatchesReference) {
  const auto f32_decode = make_vulkan_host_kernels(*device_, 0, vk::LinearKernels::IntegerDot::Auto, false);
  for (HostKernels* k : {kernels_, f32_decode.get()}) {
    const std::string mode = k == kernels_ ? "default decode" : "f32 decode";
    for (int64_t n_in : {32, 64, 1088, 4128, 4160})
      for (int64_t n_out : {1, 7, 65, 1000}) {
        const auto w = random_q4_0(rng_, n_out, n_in);
        const auto dy = random_floats(rng_, n_out);
        expect_q4_0_dx_matches(*k, rng_, w, dy, 1, n_out, n_in, 0,
                               mode + " q4_0 n_out=" + std::to_string(n_out) + " n_in=" + std::to_string(n_in));
        // Rows from 7 on: the pairs kernel reads dy one float at a time, not as vec4s.
        if (n_out > 7)
          expect_q4_0_dx_matches(*k, rng_, w, dy, 1, n_out, n_in, 7,
                                 mode + " q4_0 rows 7.. n_out=" + std::to_string(n_out) +
                                     " n_in=" + std::to_string(n_in));
      }
    for (int64_t n_in : {256, 2304, 4608})
      for (int64_t n_out : {1, 37, 1000})
        for (bool acc : {false, true}) {
          const auto w = random_q4_k(rng_, n_out, n_in);
          const auto dy = random_floats(rng_, n_out);
          auto dx = random_floats(rng_, n_in);
          const auto dx0 = dx;
          k->q4_k_dx(dx, w, dy, 1, n_out, n_in, 0, n_out, acc);
          const auto want = ref::q4_k_dx(w.data(), dy.data(), acc ? dx0.data() : nullptr, 1, n_out, n_in, 0, n_out);
          EXPECT_LE(ref::max_rel_error(dx.data(), want), kBound)
              << mode << " q4_k n_out=" << n_out << " n_in=" << n_in << " accumulate=" << acc;
        }
  }
}

// More row groups than one dispatch dimension guarantees (65535 of 2 Q8_0 or 4 F16 rows): the GEMVs number
// workgroups over x and y. The K-quant GEMVs do the same in the same words; 4·65535 and more of their rows take
// seconds on lavapipe, so they are left out here.
TEST_F(VulkanKernels, Q8_0AndF16GemvCoverMoreThan65535RowGroups) {
  for (const FrozenFormat& f : kFrozenFormats) {
    if (f.k_quant) continue;
    const int64_t n_out = 4 * 65535 + 11, n_in = f.n_ins.front();
    const auto w = f.make(rng_, n_out, n_in);
    const auto x = random_floats(rng_, n_in);
    std::vector<float> y(size_t(n_out), NAN);
    (kernels_->*f.gemm)(y, w, x, 1, n_out, n_in);
    EXPECT_LE(ref::max_rel_error(y.data(), f.ref_gemm(w.data(), x.data(), 1, n_out, n_in)), kBound) << f.name;
  }
}

// The integer-dot GEMVs (2 rows per workgroup) over more than 65535 row groups, numbered over x and y.
TEST_F(VulkanKernels, IntegerDotGemvsCoverMoreThan65535RowGroups) {
  if (!device_->integer_dot()) GTEST_SKIP() << device_->name() << " has no 8-bit integer dot products";
  const auto dot = make_vulkan_host_kernels(*device_, 0, vk::LinearKernels::IntegerDot::Always);
  const int64_t n_out = 2 * 65535 + 3;
  {
    const int64_t n_in = 32;
    const auto w = random_q4_0(rng_, n_out, n_in);
    const auto x = random_floats(rng_, n_in);
    std::vector<float> y(size_t(n_out), NAN);
    dot->q4_0_gemm(y, w, x, 1, n_out, n_in);
    EXPECT_LE(ref::max_rel_error(y.data(), ref::q4_0_gemm(w.data(), x.data(), 1, n_out, n_in)), kBound) << "q4_0";
  }
  for (const FrozenFormat& f : kFrozenFormats) {
    if (!f.k_quant) continue;
    const int64_t n_in = f.n_ins.front();
    const auto w = f.make(rng_, n_out, n_in);
    const auto x = random_floats(rng_, n_in);
    std::vector<float> y(size_t(n_out), NAN);
    (dot.get()->*f.gemm)(y, w, x, 1, n_out, n_in);
    EXPECT_LE(ref::max_rel_error(y.data(), f.ref_gemm(w.data(), x.data(), 1, n_out, n_in)), kBound) << f.name;
  }
}

TEST_F(VulkanKernels, FrozenFormatsRejectWidthsTheirKernelsCannotRead) {
  std::vector<uint8_t> w(2 * 2 * 33);
  std::vector<float> x(33), y(2);
  try {
    kernels_->f16_gemm(y, w, x, 1, 2, 33);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("f16_gemm: n_in = 33 is odd"), std::string::npos) << e.what();
  }
  try {
    kernels_->q8_0_dx(x, w, y, 1, 2, 33, 0, 2, false);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0_dx: n_in = 33 is not a multiple of 32"), std::string::npos)
        << e.what();
  }
  std::vector<float> x32(32);
  try {
    kernels_->q4_k_gemm(y, w, x32, 1, 2, 32);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("q4_k_gemm: n_in = 32 is not a multiple of 256"), std::string::npos)
        << e.what();
  }
  try {
    kernels_->q6_k_dx(x32, w, y, 1, 2, 32, 0, 2, false);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("q6_k_dx: n_in = 32 is not a multiple of 256"), std::string::npos)
        << e.what();
  }
  vk::LinearKernels k(*device_);
  vk::Buffer small(*device_, 16), wbuf(*device_, 68), kbuf(*device_, 2 * 210);
  vk::Sequence s(*device_);
  s.begin();
  EXPECT_THROW(k.q8_0_gemm(s, small, wbuf, small, 1, 2, 32), ShapeError);  // x needs 128 bytes
  EXPECT_THROW(k.f16_dx(s, small, wbuf, small, nullptr, 1, 2, 4, 0, 2, false), ShapeError);  // no scratch
  EXPECT_THROW(k.q4_k_gemm(s, small, wbuf, small, 1, 2, 256), ShapeError);  // W needs 288 bytes
  EXPECT_THROW(k.q6_k_dx(s, small, kbuf, small, nullptr, 1, 2, 256, 0, 2, false), ShapeError);  // no scratch
  s.end();
}

// --- The embedding and the vocab-tiled loss read K-quant tables (format 4 = Q4_K, 5 = Q6_K) -----------------------

// Runs one shader with three buffers and a push block over `groups` workgroups.
template <class Push>
void run_shader(vk::Device& dev, const char* name, const vk::Buffer& b0, const vk::Buffer& b1, const vk::Buffer& b2,
                const Push& push, std::array<uint32_t, 3> groups, const std::vector<uint32_t>& spec = {}) {
  vk::Pipeline p(dev, name, 3, sizeof(Push), spec);
  vk::Sequence s(dev);
  s.begin();
  s.dispatch(p, {&b0, &b1, &b2}, push, groups);
  s.end();
  s.run();
}

uint32_t groups_of(int64_t n, int64_t per) { return uint32_t((n + per - 1) / per); }

// A whole table of K-quant blocks widened to doubles (exact).
template <class Block, void (*Dequantize)(double*, const Block*, int64_t)>
std::vector<double> dequantize_table(const std::vector<uint8_t>& w, int64_t n) {
  std::vector<Block> blocks(static_cast<size_t>(n / kQK_KBlockElems));  // an aligned copy of the bytes
  std::memcpy(blocks.data(), w.data(), blocks.size() * sizeof(Block));
  std::vector<double> out(static_cast<size_t>(n));
  Dequantize(out.data(), blocks.data(), n);
  return out;
}

struct KTable {
  const char* name;
  uint32_t format;
  std::vector<uint8_t> (*make)(std::mt19937&, int64_t, int64_t);
  std::vector<double> (*dequantize)(const std::vector<uint8_t>&, int64_t);
  decltype(&ref::q4_k_gemm) ref_gemm;
  decltype(&ref::q4_k_dx) ref_dx;
  int64_t (*row_bytes)(int64_t);
};
const KTable kKTables[] = {
    {"q4_k", 4, random_q4_k, dequantize_table<quant::BlockQ4_K, quant::dequantize_row_q4_k>, ref::q4_k_gemm,
     ref::q4_k_dx, q4_k_row_bytes},
    {"q6_k", 5, random_q6_k, dequantize_table<quant::BlockQ6_K, quant::dequantize_row_q6_k>, ref::q6_k_gemm,
     ref::q6_k_dx, q6_k_row_bytes}};

// The shader evaluates each weight with one rounding of exact terms, so it equals the exact weight rounded to f32.
TEST_F(VulkanKernels, EmbeddingForwardLooksUpKQuantRows) {
  const int64_t V = 5, C = 512;
  const std::vector<int32_t> ids = {3, 0, 4, 3, -1, 9};  // out of range: clamped to 0 and V - 1
  for (const KTable& t : kKTables) {
    const auto table = t.make(rng_, V, C);
    const auto want = t.dequantize(table, V * C);
    const auto table_dev = device_bytes(t.format, table);
    vk::Buffer y(*device_, ids.size() * C * 4), tb(*device_, table_dev.size()), idb(*device_, ids.size() * 4);
    tb.upload(table_dev);
    idb.upload(ids);
    struct { uint32_t T, C, V, format; } push{uint32_t(ids.size()), uint32_t(C), uint32_t(V), t.format};
    run_shader(*device_, "embedding_forward", y, tb, idb, push, {groups_of(int64_t(ids.size()) * C, 256), 1, 1});
    const auto got = y.download_as<float>(ids.size() * C);
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t v = std::clamp<int64_t>(ids[i], 0, V - 1);
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(got[i * C + c], float(want[size_t(v * C + c)])) << t.name << " id=" << ids[i] << " c=" << c;
    }
  }
}

// logits[T, n] = x · W[row0 : row0 + n]ᵀ and dx += d · W[row0 : row0 + n] on a vocabulary tile that is not a
// multiple of either GEMM tile (64 or 128 wide), starting at an odd row, for every quantised output format.
TEST_F(VulkanKernels, LossTilesReadEveryQuantisedOutputMatrixWithEitherTile) {
  struct LossFormat {
    const char* name;
    uint32_t format;  // shader_format of autograd/ops/embedding_loss.cpp
    std::vector<uint8_t> (*make)(std::mt19937&, int64_t, int64_t);
    decltype(&ref::q4_k_gemm) ref_gemm;
    decltype(&ref::q4_k_dx) ref_dx;
    int64_t (*row_bytes)(int64_t);
  };
  const LossFormat formats[] = {
      {"q4_0", 1, random_q4_0, ref::q4_0_gemm, ref::q4_0_dx, q4_0_row_bytes},
      {"q8_0", 2, random_q8_0, ref::q8_0_gemm, ref::q8_0_dx, q8_0_row_bytes},
      {"f16", 3, random_f16, ref::f16_gemm, ref::f16_dx, f16_row_bytes},
      {"q4_k", 4, random_q4_k, ref::q4_k_gemm, ref::q4_k_dx, q4_k_row_bytes},
      {"q6_k", 5, random_q6_k, ref::q6_k_gemm, ref::q6_k_dx, q6_k_row_bytes}};
  const uint32_t V = 300, C = 512, T = 5, row0 = 37, n = 130;
  struct { uint32_t M, N, k_begin, k_end, lda, ldb, accumulate, row0, format, k_slice; } push{};  // k_slice 0: no split
  for (const LossFormat& t : formats)
    for (uint32_t tile : {64u, 128u}) {
      const auto w = t.make(rng_, V, C);
      const uint8_t* tile_w = w.data() + row0 * t.row_bytes(C);
      const auto x = random_floats(rng_, T * C), d = random_floats(rng_, T * n), dx0 = random_floats(rng_, T * C);
      const auto w_dev = device_bytes(t.format, w);
      vk::Buffer wb(*device_, w_dev.size()), xb(*device_, x.size() * 4), db(*device_, d.size() * 4);
      vk::Buffer logits(*device_, T * n * 4), dx(*device_, dx0.size() * 4);
      wb.upload(w_dev);
      xb.upload(x);
      db.upload(d);
      dx.upload(dx0);
      push = {T, n, 0, C, C, C, 0, row0, t.format};
      run_shader(*device_, "linear_ce_logits", logits, xb, wb, push, {groups_of(n, tile), groups_of(T, tile), 1},
                 {tile, tile});
      EXPECT_LE(ref::max_rel_error(logits.download_as<float>(T * n).data(), t.ref_gemm(tile_w, x.data(), T, n, C)),
                kBound)
          << t.name << " logits, tile " << tile;
      push = {T, C, 0, n, n, C, 1, row0, t.format};
      run_shader(*device_, "linear_ce_dx", dx, db, wb, push, {groups_of(C, tile), groups_of(T, tile), 1},
                 {tile, tile});
      EXPECT_LE(ref::max_rel_error(dx.download_as<float>(T * C).data(),
                                   t.ref_dx(tile_w, d.data(), dx0.data(), T, n, C, 0, n)),
                kBound)
          << t.name << " dx, tile " << tile;
    }
}

using HostGemm = void (HostKernels::*)(std::span<float>, std::span<const float>, std::span<const float>, int64_t,
                                       int64_t, int64_t, bool, float);
using RefGemm = std::vector<double> (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                        double);

void check_f32_gemm(HostKernels& k, std::mt19937& rng, HostGemm fn, RefGemm ref_fn) {
  const int64_t dims[] = {1, 3, 17, 65, 300};
  for (int64_t M : dims)
    for (int64_t N : dims)
      for (int64_t K : {int64_t(1), int64_t(33), int64_t(4128)}) {
        if (K == 4128 && M * N > 17 * 300) continue;  // keep the run short; big K is covered by the small tiles
        const auto a = random_floats(rng, M * K), b = random_floats(rng, K * N);
        // Accumulating with alpha -0.375 (LoRA's scale folded into its products), and overwriting with alpha 1.
        for (bool acc : {false, true}) {
          const double alpha = acc ? -0.375 : 1.0;
          auto c = random_floats(rng, M * N);
          const auto c0 = c;
          (k.*fn)(c, a, b, M, N, K, acc, float(alpha));
          EXPECT_LE(ref::max_rel_error(c.data(), ref_fn(a.data(), b.data(), acc ? c0.data() : nullptr, M, N, K, alpha)),
                    kBound)
              << "M=" << M << " N=" << N << " K=" << K << " accumulate=" << acc;
        }
      }
}

TEST_F(VulkanKernels, F32GemmNTMatchesReference) { check_f32_gemm(*kernels_, rng_, &HostKernels::gemm_nt, &ref::gemm_nt); }
TEST_F(VulkanKernels, F32GemmNNMatchesReference) { check_f32_gemm(*kernels_, rng_, &HostKernels::gemm_nn, &ref::gemm_nn); }
TEST_F(VulkanKernels, F32GemmTNMatchesReference) { check_f32_gemm(*kernels_, rng_, &HostKernels::gemm_tn, &ref::gemm_tn); }

// The 128-wide tiles (8x8 per invocation, which small products never pick) on shapes that leave partial tiles
// on every side: T = 130 is one full tile and two tokens, n_out = 257 two full tiles and one row.
TEST_F(VulkanKernels, LargeGemmTilesMatchReferenceOnAwkwardShapes) {
  const auto large = make_vulkan_host_kernels(*device_, 128);
  for (int64_t T : {int64_t(3), int64_t(130)}) {
    const int64_t n_out = 257, n_in = 4096 + 32;
    const auto w = random_q4_0(rng_, n_out, n_in);
    EXPECT_LE(q4_0_gemm_error(*large, rng_, w, T, n_out, n_in), kBound) << "q4_0 T=" << T;
    const auto dy = random_floats(rng_, T * n_out);
    expect_q4_0_dx_matches(*large, rng_, w, dy, T, n_out, n_in, 5, "q4_0 dx T=" + std::to_string(T));
  }
  const int64_t T = 130, n_out = 257;
  for (const FrozenFormat& f : kFrozenFormats) {
    const int64_t n_in = f.n_ins[1];
    const auto w = f.make(rng_, n_out, n_in);
    const auto x = random_floats(rng_, T * n_in);
    std::vector<float> y(size_t(T * n_out), NAN);
    (large.get()->*f.gemm)(y, w, x, T, n_out, n_in);
    EXPECT_LE(ref::max_rel_error(y.data(), f.ref_gemm(w.data(), x.data(), T, n_out, n_in)), kBound) << f.name;
    const auto dy = random_floats(rng_, T * n_out);
    auto dx = random_floats(rng_, T * n_in);
    const auto dx0 = dx;
    (large.get()->*f.dx)(dx, w, dy, T, n_out, n_in, 0, n_out, true);
    EXPECT_LE(ref::max_rel_error(dx.data(), f.ref_dx(w.data(), dy.data(), dx0.data(), T, n_out, n_in, 0, n_out)),
              kBound)
        << f.name << " dx";
  }
  for (const auto& [fn, ref_fn] : {std::pair{&HostKernels::gemm_nt, &ref::gemm_nt},
                                   std::pair{&HostKernels::gemm_nn, &ref::gemm_nn},
                                   std::pair{&HostKernels::gemm_tn, &ref::gemm_tn}})
    for (const auto& [M, N, K] : {std::array<int64_t, 3>{130, 257, 33}, std::array<int64_t, 3>{3, 17, 4128}})
      for (bool acc : {false, true}) {
        const auto a = random_floats(rng_, M * K), b = random_floats(rng_, K * N);
        auto c = random_floats(rng_, M * N);
        const auto c0 = c;
        (large.get()->*fn)(c, a, b, M, N, K, acc, 1);
        EXPECT_LE(ref::max_rel_error(c.data(), ref_fn(a.data(), b.data(), acc ? c0.data() : nullptr, M, N, K, 1)),
                  kBound)
            << "M=" << M << " N=" << N << " K=" << K << " accumulate=" << acc;
      }
}

// Products too small for a wave of 128-wide tiles but with many rows split the dx over the rows (130 tokens x
// 1056 or 1280 columns: 18 or 20 such tiles; 1095 rows: two slices), with either tile, with and without
// accumulate, on a row range that starts past row 0.
TEST_F(VulkanKernels, DxSplitOverRowsMatchesReference) {
  const auto small = make_vulkan_host_kernels(*device_, 64);
  const int64_t T = 130, n_out = 1100, j0 = 5;
  for (HostKernels* k : {kernels_, small.get()}) {
    {
      const int64_t n_in = 1056;
      const auto w = random_q4_0(rng_, n_out, n_in);
      const auto dy = random_floats(rng_, T * n_out);
      expect_q4_0_dx_matches(*k, rng_, w, dy, T, n_out, n_in, j0, "q4_0");
    }
    for (const FrozenFormat& f : kFrozenFormats) {
      const int64_t n_in = f.k_quant ? 1280 : 1056;
      const auto w = f.make(rng_, n_out, n_in);
      const auto dy = random_floats(rng_, T * n_out);
      auto dx = random_floats(rng_, T * n_in);
      const auto dx0 = dx;
      (k->*f.dx)(dx, w, dy, T, n_out, n_in, j0, n_out, true);
      EXPECT_LE(ref::max_rel_error(dx.data(), f.ref_dx(w.data(), dy.data(), dx0.data(), T, n_out, n_in, j0, n_out)),
                kBound)
          << f.name;
    }
  }
  EXPECT_GT(vk::LinearKernels::q4_0_dx_scratch_bytes(T, n_out - j0, 1056), size_t(0));  // the split does apply
}

// The dx GEMM where values span many decades: dY's rows twelve, W's scales large (weights up to 300); a partial
// tile of tokens (130), a row range that starts past row 0 and ends short of the last, with and without
// accumulate. Each token's row is checked against its own largest value, so a small row cannot hide behind a
// large one.
TEST_F(VulkanKernels, Q4_0DxMatchesReferenceRowByRowAcrossDecades) {
  for (const auto& [T, n_out, n_in] : {std::array<int64_t, 3>{32, 260, 32}, std::array<int64_t, 3>{130, 1100, 1056}})
    for (const auto& [j0, j1] : {std::pair<int64_t, int64_t>{0, n_out}, {4, n_out - 8}}) {
      auto wf = random_floats(rng_, n_out * n_in);
      for (float& v : wf) v *= 300.0f;
      std::vector<uint8_t> w(size_t(n_out * q4_0_row_bytes(n_in)));
      quant::quantize_q4_0(w, wf, n_out, n_in);
      auto dy = random_floats(rng_, T * n_out);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < n_out; ++j) dy[size_t(t * n_out + j)] *= float(std::pow(10.0, double(t % 13) - 6.0));
      for (bool acc : {false, true}) {
        auto dx = random_floats(rng_, T * n_in);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < n_in; ++i) dx[size_t(t * n_in + i)] *= float(std::pow(10.0, double(t % 13) - 3.0));
        const auto dx0 = dx;
        kernels_->q4_0_dx(dx, w, dy, T, n_out, n_in, j0, j1, acc);
        const auto want = ref::q4_0_dx(w.data(), dy.data(), acc ? dx0.data() : nullptr, T, n_out, n_in, j0, j1);
        for (int64_t t = 0; t < T; ++t) {
          const std::vector<double> row(want.begin() + t * n_in, want.begin() + (t + 1) * n_in);
          EXPECT_LE(ref::max_rel_error(dx.data() + t * n_in, row), kBound)
              << "T=" << T << " n_out=" << n_out << " n_in=" << n_in << " rows " << j0 << ".." << j1
              << " accumulate=" << acc << " token " << t;
        }
      }
    }
}

TEST_F(VulkanKernels, ForcingAGemmTileOtherThan64Or128IsRefused) {
  vk::LinearKernels k(*device_);
  EXPECT_THROW(k.force_gemm_tile(32), std::invalid_argument);
  EXPECT_NO_THROW(k.force_gemm_tile(128));
  EXPECT_NO_THROW(k.force_gemm_tile(0));
}

TEST_F(VulkanKernels, ASequenceRecordedOnceGivesTheSameResultEverySubmit) {
  const int64_t n_out = 65, n_in = 4128;
  const auto w_host = random_q4_0(rng_, n_out, n_in);
  const auto x_host = random_floats(rng_, n_in);
  vk::Buffer w(*device_, w_host.size()), x(*device_, x_host.size() * 4), y(*device_, n_out * 4);
  vk::Buffer dx(*device_, n_in * 4);
  vk::Buffer scratch(*device_, vk::LinearKernels::q4_0_dx_scratch_bytes(1, n_out, n_in));
  w.upload(w_host);
  x.upload(x_host);
  dx.fill_zero();
  vk::LinearKernels k(*device_);
  vk::Sequence s(*device_);
  s.begin();
  k.q4_0_gemv(s, y, w, x, n_out, n_in);
  // dx += Wᵀ·y, accumulating: after n submits dx = n·Wᵀ·W·x.
  k.q4_0_dx(s, dx, w, y, &scratch, 1, n_out, n_in, 0, n_out, true);
  s.end();
  const auto y_ref = ref::q4_0_gemm(w_host.data(), x_host.data(), 1, n_out, n_in);
  std::vector<float> y_ref_f(y_ref.begin(), y_ref.end());
  const auto dx_one = ref::q4_0_dx(w_host.data(), y_ref_f.data(), nullptr, 1, n_out, n_in, 0, n_out);
  for (int n = 1; n <= 3; ++n) {
    s.run();
    const auto got = dx.download_as<float>(n_in);
    std::vector<double> want(dx_one.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = n * dx_one[i];
    EXPECT_LE(ref::max_rel_error(got.data(), want), kBound) << "after submit " << n;
  }
}

// An independent group between ordered commands: a copy writes x, two GEMVs in the group read it (writing their
// own outputs), and a dx after the group reads the first GEMV's output.
TEST_F(VulkanKernels, AnIndependentGroupRunsBetweenOrderedCommands) {
  const int64_t n_out = 65, n_in = 4128;
  const auto w_host = random_q4_0(rng_, n_out, n_in);
  const auto x_host = random_floats(rng_, n_in);
  vk::Buffer w(*device_, w_host.size()), x0(*device_, n_in * 4), x(*device_, n_in * 4);
  vk::Buffer y1(*device_, n_out * 4), y2(*device_, n_out * 4), dx(*device_, n_in * 4);
  vk::Buffer scratch(*device_, vk::LinearKernels::q4_0_dx_scratch_bytes(1, n_out, n_in));
  w.upload(w_host);
  x0.upload(x_host);
  vk::LinearKernels k(*device_);
  vk::Sequence s(*device_);
  s.begin();
  s.copy(x, x0, size_t(n_in) * 4);
  s.begin_independent();
  k.q4_0_gemv(s, y1, w, x, n_out, n_in);
  k.q4_0_gemv(s, y2, w, x, n_out, n_in);
  s.end_independent();
  k.q4_0_dx(s, dx, w, y1, &scratch, 1, n_out, n_in, 0, n_out, false);
  s.end();
  s.run();
  const auto y_ref = ref::q4_0_gemm(w_host.data(), x_host.data(), 1, n_out, n_in);
  EXPECT_LE(ref::max_rel_error(y1.download_as<float>(n_out).data(), y_ref), kBound);
  EXPECT_LE(ref::max_rel_error(y2.download_as<float>(n_out).data(), y_ref), kBound);
  const std::vector<float> y_ref_f(y_ref.begin(), y_ref.end());
  const auto dx_ref = ref::q4_0_dx(w_host.data(), y_ref_f.data(), nullptr, 1, n_out, n_in, 0, n_out);
  EXPECT_LE(ref::max_rel_error(dx.download_as<float>(n_in).data(), dx_ref), kBound);
}

// Which bindings a shader writes, from its SPIR-V: writeonly and read-write buffers count, readonly ones do not,
// also where two readonly views share a binding (the coop GEMM's A).
TEST(SpirvReflection, FindsTheBindingsAShaderWrites) {
  const auto& table = vk::shader_table();
  EXPECT_EQ(vk::spirv_written_bindings(table.at("copy"), 2), (std::vector<bool>{true, false}));
  EXPECT_EQ(vk::spirv_written_bindings(table.at("q4_0_dx_reduce"), 2), (std::vector<bool>{true, false}));
  EXPECT_EQ(vk::spirv_written_bindings(table.at("q4_0_gemm_coop"), 5),
            (std::vector<bool>{true, false, false, false, false}));
  // Bindings past the ones asked for are left out; a module that is not SPIR-V is an error.
  EXPECT_EQ(vk::spirv_written_bindings(table.at("copy"), 1), (std::vector<bool>{true}));
  const std::vector<uint32_t> junk{1, 2, 3, 4, 5, 6};
  EXPECT_THROW(vk::spirv_written_bindings(junk, 2), vk::DeviceError);
}

// Commands run in levels, a barrier between levels: a command goes one level past the last command before it that
// wrote bytes it reads, or read or wrote bytes it writes, and commands that touch none of each other's bytes
// share a level, in whatever order they were recorded. The results show that the order held.
TEST_F(VulkanKernels, CommandsRunInLevelsOfTheBytesTheyShare) {
  const auto A = random_floats(rng_, 16), C = random_floats(rng_, 16);
  vk::Buffer a(*device_, 64), b(*device_, 64), c(*device_, 64), d(*device_, 64), e(*device_, 64);
  vk::Buffer f(*device_, 64);
  a.upload(A);
  c.upload(C);
  d.upload(C);
  vk::LinearKernels k(*device_);
  vk::Sequence s(*device_);
  s.begin();
  k.copy(s, b, a, 64);  // level 0: b = A
  k.copy(s, e, c, 64);  // level 0: e = C (other bytes)
  k.copy(s, e, b, 64);  // level 1: reads b and writes e, both written at level 0
  k.copy(s, a, c, 64);  // level 1: writes a, read at level 0
  s.copy(c, e, 64);     // level 2, a transfer: reads e (written at 1), writes c (read at 0 and 1)
  k.copy(s, f, d, 64);  // level 0, although recorded last: d and f are nobody else's
  s.fill_zero(d);       // level 1: writes d, read at level 0
  s.end();
  EXPECT_EQ(s.barrier_count(), 2u);
  s.run();
  EXPECT_EQ(b.download_as<float>(16), A);
  EXPECT_EQ(e.download_as<float>(16), A);
  EXPECT_EQ(a.download_as<float>(16), C);
  EXPECT_EQ(c.download_as<float>(16), A);
  EXPECT_EQ(f.download_as<float>(16), C);
  EXPECT_EQ(d.download_as<float>(16), std::vector<float>(16, 0.0f));
}

// Buffers placed in one arena are told apart by their bytes: two at the same offset are one for the barriers,
// two at different offsets are not.
TEST_F(VulkanKernels, BarriersSeeBuffersThatShareAnArenasBytes) {
  const auto A = random_floats(rng_, 64);
  vk::Buffer p(*device_, 256, vk::Buffer::Unplaced{}), q(*device_, 256, vk::Buffer::Unplaced{});
  vk::Buffer r(*device_, 256, vk::Buffer::Unplaced{});
  const VkMemoryRequirements req = p.requirements();
  const size_t step = (req.size + req.alignment - 1) / req.alignment * req.alignment;
  vk::Arena arena(*device_, 2 * step, req.memoryTypeBits);
  p.place(arena, 0);
  q.place(arena, 0);
  r.place(arena, step);
  vk::Buffer src(*device_, 256), dst(*device_, 256);
  src.upload(A);
  vk::LinearKernels k(*device_);
  vk::Sequence s(*device_);
  s.begin();
  k.copy(s, p, src, 256);  // level 0
  k.copy(s, r, src, 256);  // level 0: the arena's other bytes
  k.copy(s, dst, q, 256);  // level 1: q's bytes are p's
  s.end();
  EXPECT_EQ(s.barrier_count(), 1u);
  s.run();
  EXPECT_EQ(dst.download_as<float>(64), A);
  s.begin();
  k.copy(s, p, src, 256);
  k.copy(s, dst, r, 256);  // r's bytes are not p's: one level
  s.end();
  EXPECT_EQ(s.barrier_count(), 0u);
}

TEST_F(VulkanKernels, IndependentGroupsMustBeOpenedAndClosedInARecording) {
  vk::Sequence s(*device_);
  EXPECT_THROW(s.begin_independent(), std::logic_error);  // not recording
  s.begin();
  EXPECT_THROW(s.end_independent(), std::logic_error);  // no group open
  s.begin_independent();
  EXPECT_THROW(s.begin_independent(), std::logic_error);  // nested
  EXPECT_THROW(s.timestamp(), std::logic_error);          // a group is one level: nothing times its inside
  EXPECT_THROW(s.end(), std::logic_error);                // still open
  s.end_independent();
  s.end();
}

TEST_F(VulkanKernels, RejectsNInThatIsNotAMultipleOf32) {
  std::vector<uint8_t> w(100);
  std::vector<float> x(48), y(2);
  try {
    kernels_->q4_0_gemm(y, w, x, 1, 2, 48);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("n_in = 48 is not a multiple of 32"), std::string::npos) << e.what();
  }
}

TEST_F(VulkanKernels, RejectsBuffersOfTheWrongSize) {
  std::vector<uint8_t> w(2 * 18 - 1);
  std::vector<float> x(32), y(2);
  try {
    kernels_->q4_0_gemm(y, w, x, 1, 2, 32);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("W has 35 bytes, expected 36"), std::string::npos) << e.what();
  }
  vk::LinearKernels k(*device_);
  vk::Buffer small(*device_, 16), wbuf(*device_, 36);
  vk::Sequence s(*device_);
  s.begin();
  EXPECT_THROW(k.q4_0_gemv(s, small, wbuf, small, 2, 32), ShapeError);  // x needs 128 bytes
  EXPECT_THROW(k.q4_0_dx(s, small, wbuf, small, nullptr, 1, 2, 32, 0, 2, false), ShapeError);
  s.end();
}

TEST_F(VulkanKernels, RejectsARowRangeOutsideTheMatrix) {
  const auto w = random_q4_0(rng_, 7, 32);
  std::vector<float> dy(7), dx(32);
  EXPECT_THROW(kernels_->q4_0_dx(dx, w, dy, 1, 7, 32, 5, 8, false), ShapeError);
  EXPECT_THROW(kernels_->q4_0_dx(dx, w, dy, 1, 7, 32, 3, 3, false), ShapeError);
}

TEST(VulkanDevice, DeviceStringsParseOrFailClearly) {
  EXPECT_EQ(vk::DeviceSpec::parse("cpu").kind, vk::DeviceSpec::Kind::Cpu);
  EXPECT_EQ(vk::DeviceSpec::parse("vulkan:2").index, 2);
  EXPECT_EQ(vk::DeviceSpec::parse("auto").kind, vk::DeviceSpec::Kind::Auto);
  for (const char* bad : {"gpu", "vulkan:", "vulkan:x", "vulkan:-1", ""}) {
    try {
      vk::DeviceSpec::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const vk::DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("not one of auto, cpu, vulkan, vulkan:N"), std::string::npos);
    }
  }
}

TEST(VulkanDevice, NamingADeviceThatIsNotThereFailsWithTheCount) {
  try {
    vk::Device::open({999, false});
    FAIL() << "no error";
  } catch (const vk::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("vulkan:999: only"), std::string::npos) << e.what();
  }
}

TEST(VulkanDevice, BuffersCountTowardsTheDeviceMemoryAccounting) {
  auto dev = vk::Device::open({-1, false});
  const int64_t before = dev->bytes_allocated();
  {
    vk::Buffer b(*dev, 1001);
    EXPECT_EQ(dev->bytes_allocated(), before + 1004);  // rounded up to whole words
    std::vector<uint8_t> in(1001), out(1001);
    for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i * 7);
    b.upload(in.data(), in.size());
    b.download(out.data(), out.size());
    EXPECT_EQ(in, out);
    EXPECT_THROW(b.upload(in.data(), 1001, 4), std::out_of_range);
  }
  EXPECT_EQ(dev->bytes_allocated(), before);
  EXPECT_GE(dev->peak_bytes_allocated(), before + 1004);
}

// The reused staging buffer: kept while requests fit, grown when one does not, and usable as a transfer source
// at its full requested size (bytes copied through it reach a device buffer intact).
TEST(VulkanDevice, TheReusedStagingBufferGrowsAndCarriesTransfers) {
  auto dev = vk::Device::open({-1, false});
  VkBuffer first = VK_NULL_HANDLE, again = VK_NULL_HANDLE;
  dev->with_staging(16, [&](const vk::Device::HostBuffer& st) { first = st.buffer; });
  dev->with_staging(1000, [&](const vk::Device::HostBuffer& st) { again = st.buffer; });
  EXPECT_EQ(first, again);  // 1000 bytes fit what the first request made
  const size_t n = size_t(3) << 20;  // more than was made: grown
  vk::Buffer dst(*dev, n);
  dev->with_staging(n, [&](const vk::Device::HostBuffer& st) {
    for (size_t i = 0; i < n; ++i) static_cast<uint8_t*>(st.ptr)[i] = uint8_t(i * 13 + 5);
    dev->run_once([&](VkCommandBuffer cb) {
      const VkBufferCopy c{0, 0, n};
      vkCmdCopyBuffer(cb, st.buffer, dst.handle(), 1, &c);
    });
  });
  const auto got = dst.download_as<uint8_t>(int64_t(n));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += got[i] != uint8_t(i * 13 + 5);
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace q4t
