// The Vulkan kernels against the double-precision reference on awkward shapes, on whatever Vulkan device the
// machine has (lavapipe in CI), with the validation layer on when it is installed. The frozen linears are checked
// for every weight format of kernels/formats.h (one test instance per format).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "kernels/cpu/reference.h"
#include "kernels/formats.h"
#include "kernels/host_kernels.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/linear_kernels.h"
#include "kernels/vulkan/pipeline.h"

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

// Random W [n_out, n_in] in format f as GGML stores it, from weights uniform in [-scale, scale].
std::vector<uint8_t> random_weights(std::mt19937& rng, Format f, int64_t n_out, int64_t n_in, float scale = 1.0f) {
  auto v = random_floats(rng, n_out * n_in);
  if (scale != 1.0f)
    for (float& x : v) x *= scale;
  return quantize_matrix(f, v, n_out, n_in);
}

// A tall W [n_out, n_in]: 1009 random rows (a prime count, out of step with any row grouping) repeated in turn, so
// that a matrix of hundreds of thousands of rows is made quickly and a row read from the wrong place still shows.
std::vector<uint8_t> tall_weights(std::mt19937& rng, Format f, int64_t n_out, int64_t n_in) {
  const int64_t distinct = 1009, rb = row_bytes(f, n_in);
  const auto base = random_weights(rng, f, distinct, n_in);
  std::vector<uint8_t> w(size_t(n_out * rb));
  for (int64_t r = 0; r < n_out; ++r) std::memcpy(w.data() + r * rb, base.data() + r % distinct * rb, size_t(rb));
  return w;
}

// Whether the Vulkan kernels of format f take rows of n_in weights (whole blocks, and whole units of the kernels).
bool takes_width(Format f, int64_t n_in) {
  const FormatTraits& t = format_traits(f);
  return n_in > 0 && n_in % t.block_elems == 0 && n_in % t.gpu_n_in_multiple == 0;
}
// The narrowest such width.
int64_t narrowest_width(Format f) {
  const FormatTraits& t = format_traits(f);
  return std::lcm(t.block_elems, t.gpu_n_in_multiple);
}
// The first of `widths` that format f takes, or else the first multiple of its narrowest width at least widths[0].
int64_t width_like(Format f, std::initializer_list<int64_t> widths) {
  for (int64_t n : widths)
    if (takes_width(f, n)) return n;
  const int64_t m = narrowest_width(f);
  return (*widths.begin() + m - 1) / m * m;
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
  // Each test answers for the validation messages that arrive while it runs (the device keeps them all).
  void SetUp() override { messages_before_ = device_->validation_messages().size(); }
  void TearDown() override {
    const auto msgs = device_->validation_messages();
    EXPECT_EQ(msgs.size(), messages_before_)
        << "validation: " << (msgs.size() > messages_before_ ? msgs[messages_before_] : "");
  }
  static vk::Device* device_;
  static HostKernels* kernels_;
  std::mt19937 rng_{42};
  size_t messages_before_ = 0;
};
vk::Device* VulkanKernels::device_ = nullptr;
HostKernels* VulkanKernels::kernels_ = nullptr;

// The same fixture, once per weight format.
class VulkanFormats : public VulkanKernels, public ::testing::WithParamInterface<Format> {
 protected:
  static Format format() { return GetParam(); }
  static std::string name() { return format_name(GetParam()); }
};

const int64_t kT[] = {1, 3, 17};

// Row-range tiles of a dx: rows [0, n_out) in steps of `tile`, with T tokens.
struct DxTileCase {
  int64_t n_out, n_in, T, tile;
};

// A 1300-row tile makes 11 row chunks for the one-token dx, which the reduce pass adds 4 at a time and then the
// last 3 (q4_0_dx_reduce.comp).
const std::vector<DxTileCase> kBlock32DxTiles = {{1000, 4128, 1, 300}, {1000, 64, 3, 300},  {7, 32, 17, 5},
                                                 {65, 64, 1, 64},      {63, 4128, 3, 10},   {200, 96, 130, 70},
                                                 {1000, 4128, 300, 300}, {1400, 64, 1, 1300}};
// 1000 rows of one super-block make 8 row chunks for the one-token dx (at least 128 rows each), reduced in order
// 4 at a time; a tile of 1300 rows makes 11, so the reduce pass also adds a last 3.
const std::vector<DxTileCase> kKQuantDxTiles = {{1000, 256, 1, 300}, {1000, 256, 1, 1000}, {257, 768, 1, 100},
                                                {37, 256, 3, 10},    {130, 512, 65, 70},   {257, 256, 17, 64},
                                                {1400, 256, 1, 1300}};

// The shapes to check for a format. Blocks of 32: one, two and 129 blocks. Formats of one weight a block add
// n_in = 2 and 98 where their kernels take pairs (even, but not a multiple of 4, 32 or the tile width). The
// 256-weight super-blocks: 1 and 9 of them (odd counts: Q6_K rows start anywhere in the device's groups of 8
// blocks, and the last group is part padding) and 18 (the one-token kernels' invocations take more than one pass),
// and odd row counts around their GEMV row groups. The first width is the smallest.
struct FormatShapes {
  std::vector<int64_t> n_ins, n_outs;
  std::vector<DxTileCase> dx_tiles;
};

FormatShapes shapes_for(Format f) {
  FormatShapes s;
  std::vector<int64_t> n_ins;
  if (format_traits(f).block_elems == 256) {
    n_ins = {256, 2304, 4608};
    s = {{}, {1, 3, 37, 257}, kKQuantDxTiles};
  } else {
    n_ins = {2, 32, 64, 98, 4128};
    s = {{}, {1, 7, 63, 65, 1000}, kBlock32DxTiles};
  }
  for (int64_t n : n_ins)
    if (takes_width(f, n)) s.n_ins.push_back(n);
  std::erase_if(s.dx_tiles, [&](const DxTileCase& c) { return !takes_width(f, c.n_in); });
  return s;
}

// Q4T_FULL_MATRIX=1 in the environment: every shape below on every format.
bool full_matrix() {
  const char* v = std::getenv("Q4T_FULL_MATRIX");
  return v && std::string(v) == "1";
}

struct GemmShape {
  int64_t T, n_out, n_in;
};

// The products of ForwardMatches* and DxMatches*. Default: every width and row count at T = 1 (zipped, the shorter
// cycling), and at T > 1 the smallest and the widest width with each odd row count; full matrix: all crossed.
std::vector<GemmShape> product_shapes(Format f) {
  const FormatShapes sh = shapes_for(f);
  std::vector<GemmShape> out;
  if (full_matrix()) {
    for (int64_t n_in : sh.n_ins)
      for (int64_t n_out : sh.n_outs)
        for (int64_t T : kT) out.push_back({T, n_out, n_in});
    return out;
  }
  for (size_t i = 0; i < std::max(sh.n_ins.size(), sh.n_outs.size()); ++i)
    out.push_back({1, sh.n_outs[i % sh.n_outs.size()], sh.n_ins[i % sh.n_ins.size()]});
  for (int64_t T : kT)
    for (int64_t n_in : sh.n_ins)
      for (int64_t n_out : sh.n_outs)
        if (T > 1 && (n_in == sh.n_ins.front() || n_in == sh.n_ins.back()) && n_out % 2 == 1)
          out.push_back({T, n_out, n_in});
  return out;
}

// Whether format f runs every shape of the indexing tests (GemvCovers*, DxTiles*, LargeGemmTiles*, DxSplitOverRows*)
// by default: the first format of each shader template (its own shaders, or the unit kernels) and block size does;
// the others run the smallest shape. Q4T_FULL_MATRIX=1: every format does.
bool runs_every_shape(Format f) {
  const auto key = [](const FormatTraits& t) {
    return std::pair{std::string(t.gpu.gemm ? t.gpu.gemm : "unit"), t.block_elems};
  };
  const auto table = format_table();
  const auto first = std::find_if(table.begin(), table.end(),
                                  [&](const FormatTraits& t) { return key(t) == key(format_traits(f)); });
  return full_matrix() || first->format == f;
}

std::string label(Format f, int64_t T, int64_t n_out, int64_t n_in) {
  return std::string(format_name(f)) + " T=" + std::to_string(T) + " n_out=" + std::to_string(n_out) +
         " n_in=" + std::to_string(n_in);
}

// The largest relative error of k's GEMM of format f with weights w against the reference, on a random X.
double gemm_error(HostKernels& k, std::mt19937& rng, Format f, const std::vector<uint8_t>& w, int64_t T,
                  int64_t n_out, int64_t n_in) {
  const auto x = random_floats(rng, T * n_in);
  std::vector<float> y(size_t(T * n_out), NAN);
  k.frozen_gemm(f, y, w, x, T, n_out, n_in);
  return ref::max_rel_error(y.data(), ref::frozen_gemm(f, w.data(), x.data(), T, n_out, n_in));
}
// The same on a random W.
double gemm_error(HostKernels& k, std::mt19937& rng, Format f, int64_t T, int64_t n_out, int64_t n_in) {
  return gemm_error(k, rng, f, random_weights(rng, f, n_out, n_in), T, n_out, n_in);
}

// dx (+)= dy · W[j_start:n_out] from k, with and without accumulate (dx drawn from rng), against the reference.
void expect_dx_matches(HostKernels& k, std::mt19937& rng, Format f, const std::vector<uint8_t>& w,
                       const std::vector<float>& dy, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start,
                       const std::string& what) {
  for (bool acc : {false, true}) {
    auto dx = random_floats(rng, T * n_in);
    const auto dx0 = dx;
    k.frozen_dx(f, dx, w, dy, T, n_out, n_in, j_start, n_out, acc);
    const auto want =
        ref::frozen_dx(f, w.data(), dy.data(), acc ? dx0.data() : nullptr, T, n_out, n_in, j_start, n_out);
    EXPECT_LE(ref::max_rel_error(dx.data(), want), kBound) << what << " accumulate=" << acc;
  }
}

TEST_P(VulkanFormats, ForwardMatchesReferenceOnAwkwardShapes) {
  const Format f = format();
  for (const auto [T, n_out, n_in] : product_shapes(f))
    EXPECT_LE(gemm_error(*kernels_, rng_, f, T, n_out, n_in), kBound) << label(f, T, n_out, n_in);
}

TEST_P(VulkanFormats, DxMatchesReferenceWithAndWithoutAccumulate) {
  const Format f = format();
  for (const auto [T, n_out, n_in] : product_shapes(f)) {
    const auto w = random_weights(rng_, f, n_out, n_in);
    const auto dy = random_floats(rng_, T * n_out);
    expect_dx_matches(*kernels_, rng_, f, w, dy, T, n_out, n_in, 0, label(f, T, n_out, n_in));
  }
}

TEST_P(VulkanFormats, DxTilesThatDoNotDivideSumToTheUntiledResult) {
  const Format f = format();
  std::vector<DxTileCase> cases = shapes_for(f).dx_tiles;
  if (!runs_every_shape(f))
    cases = {*std::min_element(cases.begin(), cases.end(), [](const DxTileCase& a, const DxTileCase& b) {
      return a.T * a.n_out * a.n_in < b.T * b.n_out * b.n_in;
    })};
  for (const DxTileCase c : cases) {
    const auto w = random_weights(rng_, f, c.n_out, c.n_in);
    const auto dy = random_floats(rng_, c.T * c.n_out);
    std::vector<float> dx(size_t(c.T * c.n_in), NAN);
    for (int64_t j = 0; j < c.n_out; j += c.tile)
      kernels_->frozen_dx(f, dx, w, dy, c.T, c.n_out, c.n_in, j, std::min(c.n_out, j + c.tile), j > 0);
    const auto want = ref::frozen_dx(f, w.data(), dy.data(), nullptr, c.T, c.n_out, c.n_in, 0, c.n_out);
    EXPECT_LE(ref::max_rel_error(dx.data(), want), kBound) << label(f, c.T, c.n_out, c.n_in) << " tile=" << c.tile;
    // One tile alone only touches its own rows of W.
    if (c.tile < c.n_out) {
      std::vector<float> part(size_t(c.T * c.n_in));
      const int64_t j1 = std::min(c.n_out, 2 * c.tile);
      kernels_->frozen_dx(f, part, w, dy, c.T, c.n_out, c.n_in, c.tile, j1, false);
      const auto want_part = ref::frozen_dx(f, w.data(), dy.data(), nullptr, c.T, c.n_out, c.n_in, c.tile, j1);
      EXPECT_LE(ref::max_rel_error(part.data(), want_part), kBound)
          << label(f, c.T, c.n_out, c.n_in) << " rows " << c.tile << ".." << j1;
    }
  }
}

// The one-token GEMVs with an integer-dot twin (Q4_0, Q4_K and Q6_K) take 8-bit integer dot products on
// activations as limbs where the device has them (lavapipe does) and the matrix is large: both that path, forced
// here, and the float one match the reference, on rows that are odd in number (Q6_K rows starting anywhere in a
// group of 8 blocks), widths of one block or super-block and more, and activations whose groups mix values six
// decades apart with groups of zeros (one scale per group: the small values keep 2^-24 of the group's largest).
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
  int formats = 0;
  for (HostKernels* k : {dot_path.get(), float_path.get()})
    for (const FormatTraits& t : format_table()) {
      if (!t.gpu.gemv_dot) continue;
      formats += k == dot_path.get();
      const std::vector<int64_t> n_ins =
          t.block_elems == 256 ? std::vector<int64_t>{256, 2304, 4608} : std::vector<int64_t>{32, 96, 4128};
      for (int64_t n_in : n_ins)
        for (int64_t n_out : {1, 3, 37, 257})
          for (bool wide : {false, true}) {
            const auto w = random_weights(rng_, t.format, n_out, n_in);
            const auto x = wide ? spread(n_in) : random_floats(rng_, n_in);
            std::vector<float> y(size_t(n_out), NAN);
            k->frozen_gemm(t.format, y, w, x, 1, n_out, n_in);
            EXPECT_LE(ref::max_rel_error(y.data(), ref::frozen_gemm(t.format, w.data(), x.data(), 1, n_out, n_in)),
                      kBound)
                << t.name << (k == dot_path.get() ? " integer-dot path" : " float path") << " n_out=" << n_out
                << " n_in=" << n_in << (wide ? " wide activations" : "");
          }
    }
  EXPECT_GE(formats, 3);  // Q4_0, Q4_K and Q6_K at least
}

// Products of few output tiles split over K into slices that a second pass adds in order (the HostKernels adaptor
// passes the scratch): the last slice shorter than the others at n_in = 4128 for the formats of 32-weight blocks
// (129 blocks), whole slices at 4608.
TEST_P(VulkanFormats, ForwardGemmsSplitOverKMatchReference) {
  const Format f = format();
  const int64_t T = 65, n_out = 65;
  vk::LinearKernels k(*device_);
  for (int64_t n_in : {int64_t(4128), int64_t(4608)}) {
    if (!takes_width(f, n_in)) continue;
    ASSERT_GT(k.gemm_scratch_bytes(f, T, n_out, n_in), 0u) << "n_in=" << n_in << " is not split";
    EXPECT_LE(gemm_error(*kernels_, rng_, f, T, n_out, n_in), kBound) << label(f, T, n_out, n_in);
  }
}

// Tile shapes of the tensor-core GEMM's way out (the formats that have one, where the device has it; the FP32
// kernels elsewhere): output tiles wholly inside Y, whose rows go straight to memory, beside edge tiles cut by T
// or n_out, with and without a split over K, and an n_out that is not a multiple of 4 (every tile through the
// staging path).
TEST_F(VulkanKernels, TensorCoreGemmTilesInsideAndAtTheEdgesMatchReference) {
  struct Case { int64_t T, n_out, n_in; };
  for (const FormatTraits& t : format_table()) {
    if (!t.gpu.coop_gemm) continue;
    for (const Case& c : {Case{64, 128, 256}, Case{129, 260, 4128}, Case{96, 384, 2048}, Case{128, 258, 1024}}) {
      if (!takes_width(t.format, c.n_in)) continue;
      EXPECT_LE(gemm_error(*kernels_, rng_, t.format, c.T, c.n_out, c.n_in), kBound)
          << label(t.format, c.T, c.n_out, c.n_in);
    }
  }
}

// A window of W's rows on the tensor cores (the vocab-tiled loss's logits): for a format with a tensor-core GEMM on
// a device with cooperative matrices, windows that start mid-matrix and end short of a tile match the reference for
// those rows; otherwise the call declines and records nothing.
TEST_F(VulkanKernels, TensorCoreRowWindowsMatchReferenceOrAreDeclined) {
  const int64_t T = 65, n_rows = 300;
  vk::LinearKernels k(*device_);
  for (const FormatTraits& t : format_table()) {
    const Format f = t.format;
    const bool coop = device_->coop_matrix() && t.gpu.coop_gemm;
    const int64_t n_in = width_like(f, {4128});
    const auto w_host = random_weights(rng_, f, n_rows, n_in);
    const auto x_host = random_floats(rng_, T * n_in);
    const auto w_dev = to_device_layout(f, w_host);
    vk::Buffer w(*device_, w_dev.size()), x(*device_, x_host.size() * 4), y(*device_, size_t(T * n_rows) * 4);
    w.upload(w_dev);
    x.upload(x_host);
    for (const auto& [row0, n] : {std::pair<int64_t, int64_t>{0, 128}, {128, 172}, {299, 1}}) {
      vk::Sequence s(*device_);
      s.begin();
      const bool took = k.gemm_rows_coop(f, s, y, w, x, T, n_rows, row0, n, n_in);
      s.end();
      EXPECT_EQ(took, coop) << t.name;
      EXPECT_EQ(s.dispatch_count(), took ? 1u : 0u) << t.name;
      if (!took) continue;
      s.run();
      const auto want = ref::frozen_gemm(f, w_host.data() + row0 * row_bytes(f, n_in), x_host.data(), T, n, n_in);
      EXPECT_LE(ref::max_rel_error(y.download_as<float>(size_t(T * n)).data(), want), kBound)
          << t.name << " rows from " << row0;
    }
    vk::Sequence s(*device_);
    s.begin();
    if (coop) {
      EXPECT_THROW(k.gemm_rows_coop(f, s, y, w, x, T, n_rows, 200, 101, n_in), ShapeError) << t.name;
    }
    s.end();
  }
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

// A LoRA adapter's term hs·Bᵀ added by a format's tensor-core GEMM after its main loop (lora_linear's forward),
// against the reference product plus hs·Bᵀ in doubles: tiles cut by T and n_out, products split over K (only the
// first slice adds the term), X split once per product (n_out of 4 tiles and more), ranks that are not a multiple
// of 16 up to 32. Rows of hs six decades apart and a B near 1e-5 with a row of zeros: each row of hs and of B gets
// its own power-of-two scale, and in the rows of the largest hs the term outweighs X·Wᵀ (X near 1e-4). Declined,
// with nothing recorded, for formats without a tensor-core GEMM, without tensor cores and above rank 32.
TEST_F(VulkanKernels, TensorCoreGemmAddsTheAdapterTermOrDeclines) {
  struct Case { int64_t T, n_out, n_in, r; };
  vk::LinearKernels k(*device_);
  for (const FormatTraits& t : format_table()) {
    const Format f = t.format;
    const bool coop = device_->coop_matrix() && t.gpu.coop_gemm;
    for (const Case c : {Case{64, 128, 256, 16}, Case{129, 260, 4128, 16}, Case{96, 512, 2048, 8},
                         Case{40, 130, 512, 32}, Case{65, 65, 4608, 5}, Case{512, 1024, 128, 16}}) {
      if (!takes_width(f, c.n_in)) continue;
      const auto w_host = random_weights(rng_, f, c.n_out, c.n_in);
      const auto x_host = scaled_floats(rng_, c.T * c.n_in, 1e-4f);
      const auto hs_host = decades_by_row(rng_, c.T, c.r);
      const auto b_host = small_values(rng_, c.n_out, c.r, [](int64_t n, int64_t) { return n == 3; });
      const auto w_dev = to_device_layout(f, w_host);
      vk::Buffer w(*device_, w_dev.size()), x(*device_, x_host.size() * 4), y(*device_, size_t(c.T * c.n_out) * 4);
      vk::Buffer hs(*device_, hs_host.size() * 4), b(*device_, b_host.size() * 4);
      vk::Buffer scratch(*device_, std::max<size_t>(k.gemm_scratch_bytes(f, c.T, c.n_out, c.n_in), 4));
      w.upload(w_dev);
      x.upload(x_host);
      hs.upload(hs_host);
      b.upload(b_host);
      vk::Sequence s(*device_);
      s.begin();
      const bool took = k.gemm_lora(f, s, y, w, x, c.T, c.n_out, c.n_in, &scratch, hs, b, c.r);
      s.end();
      EXPECT_EQ(took, coop) << t.name;
      EXPECT_EQ(s.dispatch_count() > 0, took) << t.name;
      if (!took) continue;
      s.run();
      auto want = ref::frozen_gemm(f, w_host.data(), x_host.data(), c.T, c.n_out, c.n_in);
      for (int64_t i = 0; i < c.T; ++i)
        for (int64_t n = 0; n < c.n_out; ++n)
          for (int64_t j = 0; j < c.r; ++j)
            want[size_t(i * c.n_out + n)] += double(hs_host[size_t(i * c.r + j)]) * b_host[size_t(n * c.r + j)];
      expect_rows_match(y.download_as<float>(size_t(c.T * c.n_out)), want, c.T, c.n_out,
                        std::string(t.name) + " T=" + std::to_string(c.T) + " n_out=" + std::to_string(c.n_out) +
                            " r=" + std::to_string(c.r));
    }
    vk::Buffer any(*device_, 1 << 20);
    vk::Sequence s(*device_);
    s.begin();
    EXPECT_FALSE(k.gemm_lora(f, s, any, any, any, 64, 128, 256, nullptr, any, any, 33)) << t.name;
    s.end();
    EXPECT_EQ(s.dispatch_count(), 0u) << t.name;
  }
}

// The backward's counterpart: dX += dY·W + dh·A by a format's tensor-core dx after its main loop (lora_linear's
// backward where the frozen product and the adapter read one input), against doubles row by row: tiles cut by T
// and n_in, products split over W's rows (only the first slice adds the term), dY split once per product or not,
// ranks 5 to 32; rows of dh six decades apart, an A near 1e-5 (one power-of-two scale per tile of A) with a zero
// column, dY near 1e-4 so that the term outweighs dY·W in some rows, and a dX that already holds values (of the
// same size). Declined, with nothing recorded, for formats without a tensor-core dx, without tensor cores and
// above rank 32.
TEST_F(VulkanKernels, TensorCoreDxAddsTheAdapterTermOrDeclines) {
  struct Case { int64_t T, n_out, n_in, r; bool scratch; };
  vk::LinearKernels k(*device_);
  for (const FormatTraits& t : format_table()) {
    const Format f = t.format;
    const bool coop = device_->coop_matrix() && t.gpu.coop_dx;
    for (const Case c : {Case{64, 128, 128, 16, true}, Case{129, 4128, 288, 16, true},
                         Case{96, 2048, 512, 8, false}, Case{40, 512, 160, 32, true}, Case{65, 256, 4096, 5, true}}) {
      if (!takes_width(f, c.n_in)) continue;
      const auto w_host = random_weights(rng_, f, c.n_out, c.n_in);
      const auto dy_host = scaled_floats(rng_, c.T * c.n_out, 1e-4f);
      const auto dx0 = scaled_floats(rng_, c.T * c.n_in, 1e-4f);
      const auto dh_host = decades_by_row(rng_, c.T, c.r);
      const auto a_host = small_values(rng_, c.r, c.n_in, [](int64_t, int64_t n) { return n == 5; });
      const auto w_dev = to_device_layout(f, w_host);
      vk::Buffer w(*device_, w_dev.size()), dy(*device_, dy_host.size() * 4), dx(*device_, dx0.size() * 4);
      vk::Buffer dh(*device_, dh_host.size() * 4), a(*device_, a_host.size() * 4);
      vk::Buffer scratch(*device_, std::max<size_t>(k.dx_scratch_bytes(f, c.T, c.n_out, c.n_in), 4));
      w.upload(w_dev);
      dy.upload(dy_host);
      dx.upload(dx0);
      dh.upload(dh_host);
      a.upload(a_host);
      vk::Sequence s(*device_);
      s.begin();
      const bool took =
          k.dx_lora(f, s, dx, w, dy, c.scratch ? &scratch : nullptr, c.T, c.n_out, c.n_in, dh, a, c.r);
      s.end();
      EXPECT_EQ(took, coop) << t.name;
      EXPECT_EQ(s.dispatch_count() > 0, took) << t.name;
      if (!took) continue;
      s.run();
      auto want = ref::frozen_dx(f, w_host.data(), dy_host.data(), dx0.data(), c.T, c.n_out, c.n_in, 0, c.n_out);
      for (int64_t i = 0; i < c.T; ++i)
        for (int64_t n = 0; n < c.n_in; ++n)
          for (int64_t j = 0; j < c.r; ++j)
            want[size_t(i * c.n_in + n)] += double(dh_host[size_t(i * c.r + j)]) * a_host[size_t(j * c.n_in + n)];
      expect_rows_match(dx.download_as<float>(size_t(c.T * c.n_in)), want, c.T, c.n_in,
                        std::string(t.name) + " T=" + std::to_string(c.T) + " n_in=" + std::to_string(c.n_in) +
                            " r=" + std::to_string(c.r));
    }
    vk::Buffer any(*device_, 1 << 20);
    vk::Sequence s(*device_);
    s.begin();
    EXPECT_FALSE(k.dx_lora(f, s, any, any, any, nullptr, 64, 128, width_like(f, {128}), any, any, 33)) << t.name;
    s.end();
    EXPECT_EQ(s.dispatch_count(), 0u) << t.name;
  }
}

// The loss's dx for a window of W's rows on the tensor cores: dX += d[T, n] · W[row0 : row0 + n], windows that
// start off a 32-row boundary and one of a single row; declined (nothing recorded) for formats without a
// tensor-core dx and without tensor cores.
TEST_F(VulkanKernels, TensorCoreDxRowWindowsMatchReferenceOrAreDeclined) {
  const int64_t T = 65, n_rows = 300;
  vk::LinearKernels k(*device_);
  for (const FormatTraits& t : format_table()) {
    const Format f = t.format;
    const bool coop = device_->coop_matrix() && t.gpu.coop_dx;
    const int64_t n_in = width_like(f, {4128});
    const auto w_host = random_weights(rng_, f, n_rows, n_in);
    const auto w_dev = to_device_layout(f, w_host);
    vk::Buffer w(*device_, w_dev.size()), dx(*device_, size_t(T * n_in) * 4);
    w.upload(w_dev);
    for (const auto& [row0, n] : {std::pair<int64_t, int64_t>{0, 128}, {128, 172}, {299, 1}}) {
      const auto d_host = random_floats(rng_, T * n), dx0 = random_floats(rng_, T * n_in);
      vk::Buffer d(*device_, d_host.size() * 4);
      vk::Buffer scratch(*device_, std::max<size_t>(k.dx_scratch_bytes(f, T, n, n_in), 4));
      d.upload(d_host);
      dx.upload(dx0);
      vk::Sequence s(*device_);
      s.begin();
      const bool took = k.dx_rows_coop(f, s, dx, w, d, scratch, T, n_rows, row0, n, n_in);
      s.end();
      EXPECT_EQ(took, coop) << t.name;
      if (!took) {
        EXPECT_EQ(s.dispatch_count(), 0u) << t.name;
        continue;
      }
      s.run();
      const auto want =
          ref::frozen_dx(f, w_host.data() + row0 * row_bytes(f, n_in), d_host.data(), dx0.data(), T, n, n_in, 0, n);
      EXPECT_LE(ref::max_rel_error(dx.download_as<float>(size_t(T * n_in)).data(), want), kBound)
          << t.name << " rows from " << row0;
    }
  }
}

// A format's tensor-core dx given a scratch too small for dY split once (only the slices' size, which for T > 1 is
// what any format without a tensor-core dx asks for): it converts dY in each workgroup instead. The FP32 dx
// elsewhere.
TEST_F(VulkanKernels, TensorCoreDxWithTheSmallerScratchMatchesReference) {
  const int64_t T = 65, n_out = 300, n_in = 1056;
  vk::LinearKernels k(*device_);
  const FormatTraits* plain = nullptr;  // a format without a tensor-core dx
  for (const FormatTraits& t : format_table())
    if (!t.gpu.coop_dx && !plain) plain = &t;
  ASSERT_NE(plain, nullptr);
  for (const FormatTraits& t : format_table()) {
    if (!t.gpu.coop_dx || !takes_width(t.format, n_in)) continue;
    const Format f = t.format;
    const auto w_host = random_weights(rng_, f, n_out, n_in);
    const auto dy_host = random_floats(rng_, T * n_out), dx0 = random_floats(rng_, T * n_in);
    const auto w_dev = to_device_layout(f, w_host);
    vk::Buffer w(*device_, w_dev.size()), dy(*device_, dy_host.size() * 4), dx(*device_, dx0.size() * 4);
    w.upload(w_dev);
    dy.upload(dy_host);
    dx.upload(dx0);
    const size_t small = k.dx_scratch_bytes(plain->format, T, n_out - 7, n_in);
    if (device_->coop_matrix()) {
      EXPECT_LT(small, k.dx_scratch_bytes(f, T, n_out - 7, n_in)) << t.name;
    }
    vk::Buffer scratch(*device_, std::max<size_t>(small, 4));
    vk::Sequence s(*device_);
    s.begin();
    k.dx(f, s, dx, w, dy, &scratch, T, n_out, n_in, 7, n_out, true);
    s.end();
    s.run();
    const auto want = ref::frozen_dx(f, w_host.data(), dy_host.data(), dx0.data(), T, n_out, n_in, 7, n_out);
    EXPECT_LE(ref::max_rel_error(dx.download_as<float>(size_t(T * n_in)).data(), want), kBound) << t.name;
  }
}

// 65 tokens x 130 rows: two 64-wide GEMM tiles each way, the second holding one token and two rows.
TEST_P(VulkanFormats, GemmTilesThatDoNotDivideMatchReference) {
  const int64_t T = 65, n_out = 130, n_in = 512;
  EXPECT_LE(gemm_error(*kernels_, rng_, format(), T, n_out, n_in), kBound) << name();
}

// The one-token dx of the formats with an f16-decode twin of its split pass (Q4_0: q4_0_dx_split_pairs.comp; Q4_K:
// q4_k_dx_split.glsl), with and without the f16 decode. Q4_0 widths of an even block count take the pairs kernel:
// 1 pair, 17 pairs (three workgroups along x, the last one partly out of range) and 65 pairs, over all rows and from
// row 7 on (dy then not read as vec4s); odd counts keep q4_0_dx_split.comp either way. Q4_K: 1, 9 and 18
// super-blocks.
TEST_F(VulkanKernels, OneTokenDxWithAndWithoutTheF16DecodeMatchesReference) {
  const auto f32_decode = make_vulkan_host_kernels(*device_, 0, vk::LinearKernels::IntegerDot::Auto, false);
  int formats = 0;
  for (HostKernels* k : {kernels_, f32_decode.get()}) {
    const std::string mode = k == kernels_ ? "default decode" : "f32 decode";
    for (const FormatTraits& t : format_table()) {
      if (!t.gpu.dx_split_f16) continue;
      formats += k == kernels_;
      const bool super = t.block_elems == 256;
      const std::vector<int64_t> n_ins = super ? std::vector<int64_t>{256, 2304, 4608}
                                               : std::vector<int64_t>{32, 64, 1088, 4128, 4160};
      const std::vector<int64_t> n_outs = super ? std::vector<int64_t>{1, 37, 1000} : std::vector<int64_t>{1, 7, 65, 1000};
      for (int64_t n_in : n_ins)
        for (int64_t n_out : n_outs) {
          const auto w = random_weights(rng_, t.format, n_out, n_in);
          const auto dy = random_floats(rng_, n_out);
          expect_dx_matches(*k, rng_, t.format, w, dy, 1, n_out, n_in, 0, mode + " " + label(t.format, 1, n_out, n_in));
          // Rows from 7 on: the pairs kernel reads dy one float at a time, not as vec4s.
          if (n_out > 7)
            expect_dx_matches(*k, rng_, t.format, w, dy, 1, n_out, n_in, 7,
                              mode + " rows 7.. " + label(t.format, 1, n_out, n_in));
        }
    }
  }
  EXPECT_GE(formats, 2);  // Q4_0 and Q4_K at least
}

// More row groups than one dispatch dimension guarantees (65535 groups of the GEMV's rows per workgroup: 2, or 4
// for F16 and Q4_K): every format's float GEMV numbers its workgroups over x and y. The rows repeat every 1009
// (tall_weights), so a row group read from the wrong place shows.
TEST_P(VulkanFormats, GemvCoversMoreThan65535RowGroups) {
  const Format f = format();
  if (!runs_every_shape(f)) GTEST_SKIP() << "one shape, run on the first format of these kernels and block size";
  const auto float_path = make_vulkan_host_kernels(*device_, 0, vk::LinearKernels::IntegerDot::Never);
  const int64_t n_out = int64_t(format_traits(f).gpu.gemv_rows) * 65535 + 11, n_in = narrowest_width(f);
  const auto w = tall_weights(rng_, f, n_out, n_in);
  const auto x = random_floats(rng_, n_in);
  std::vector<float> y(size_t(n_out), NAN);
  float_path->frozen_gemm(f, y, w, x, 1, n_out, n_in);
  EXPECT_LE(ref::max_rel_error(y.data(), ref::frozen_gemm(f, w.data(), x.data(), 1, n_out, n_in)), kBound)
      << label(f, 1, n_out, n_in);
}

// The integer-dot GEMVs (2 rows per workgroup) over more than 65535 row groups, numbered over x and y.
TEST_F(VulkanKernels, IntegerDotGemvsCoverMoreThan65535RowGroups) {
  if (!device_->integer_dot()) GTEST_SKIP() << device_->name() << " has no 8-bit integer dot products";
  const auto dot = make_vulkan_host_kernels(*device_, 0, vk::LinearKernels::IntegerDot::Always);
  const int64_t n_out = 2 * 65535 + 3;
  for (const FormatTraits& t : format_table()) {
    if (!t.gpu.gemv_dot) continue;
    const int64_t n_in = narrowest_width(t.format);
    const auto w = tall_weights(rng_, t.format, n_out, n_in);
    const auto x = random_floats(rng_, n_in);
    std::vector<float> y(size_t(n_out), NAN);
    dot->frozen_gemm(t.format, y, w, x, 1, n_out, n_in);
    EXPECT_LE(ref::max_rel_error(y.data(), ref::frozen_gemm(t.format, w.data(), x.data(), 1, n_out, n_in)), kBound)
        << t.name;
  }
}

// Widths the kernels cannot read are refused by name (the host adaptor names "<format>_gemm" and "<format>_dx"):
// F16 and BF16 rows are read in pairs, the others in whole blocks. The kernels themselves refuse buffers too small
// for the shape, and a one-token dx without its scratch, before recording anything.
TEST_P(VulkanFormats, RejectsWidthsItsKernelsCannotRead) {
  const Format f = format();
  const int64_t unit = narrowest_width(f), bad = unit > 32 ? 32 : 33;
  const std::string why = ": n_in = " + std::to_string(bad) + " is not a multiple of " + std::to_string(unit);
  std::vector<uint8_t> w(size_t(2 * row_bytes(f, unit) + 2 * 2 * bad));
  std::vector<float> x(static_cast<size_t>(bad)), y(2);
  try {
    kernels_->frozen_gemm(f, y, w, x, 1, 2, bad);
    ADD_FAILURE() << name() << ": no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(name() + "_gemm" + why), std::string::npos) << e.what();
  }
  try {
    kernels_->frozen_dx(f, x, w, y, 1, 2, bad, 0, 2, false);
    ADD_FAILURE() << name() << ": no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(name() + "_dx" + why), std::string::npos) << e.what();
  }
  const int64_t n_in = width_like(f, {32});
  vk::LinearKernels k(*device_);
  vk::Buffer small(*device_, 16), wbuf(*device_, size_t(device_weight_bytes(f, 2, n_in)));
  vk::Buffer wsmall(*device_, size_t(device_weight_bytes(f, 2, n_in) - 4));
  vk::Buffer dxbuf(*device_, size_t(n_in) * 4), xbuf(*device_, size_t(n_in) * 4);
  vk::Sequence s(*device_);
  s.begin();
  EXPECT_THROW(k.gemm(f, s, small, wbuf, small, 1, 2, n_in), ShapeError) << name();  // x needs n_in floats
  EXPECT_THROW(k.gemm(f, s, small, wsmall, xbuf, 1, 2, n_in), ShapeError) << name();  // W is 4 bytes short
  EXPECT_THROW(k.dx(f, s, dxbuf, wbuf, small, nullptr, 1, 2, n_in, 0, 2, false), ShapeError) << name();  // no scratch
  s.end();
  EXPECT_EQ(s.dispatch_count(), 0u) << name();
}

// --- The embedding and the vocab-tiled loss read tables of every format (their shaders are built per format) ------

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

// Each weight of the looked-up rows is the format's float dequantisation (GGML's dequantize_row), bit for bit.
TEST_P(VulkanFormats, EmbeddingForwardLooksUpRows) {
  const Format f = format();
  const int64_t V = 5, C = 512;
  const std::vector<int32_t> ids = {3, 0, 4, 3, -1, 9};  // out of range: clamped to 0 and V - 1
  const auto table = random_weights(rng_, f, V, C);
  const auto want = dequantize_matrix(f, table, V, C);
  const auto table_dev = to_device_layout(f, table);
  vk::Buffer y(*device_, ids.size() * C * 4), tb(*device_, table_dev.size()), idb(*device_, ids.size() * 4);
  tb.upload(table_dev);
  idb.upload(ids);
  struct { uint32_t T, C, V, format; } push{uint32_t(ids.size()), uint32_t(C), uint32_t(V), uint32_t(f)};
  run_shader(*device_, ("embedding_forward_" + name()).c_str(), y, tb, idb, push,
             {groups_of(int64_t(ids.size()) * C, 256), 1, 1});
  const auto got = y.download_as<float>(ids.size() * C);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t v = std::clamp<int64_t>(ids[i], 0, V - 1);
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i * C + c]), std::bit_cast<uint32_t>(want[size_t(v * C + c)]))
          << name() << " id=" << ids[i] << " c=" << c << ": " << got[i * C + c] << " != " << want[size_t(v * C + c)];
  }
}

// logits[T, n] = x · W[row0 : row0 + n]ᵀ and dx += d · W[row0 : row0 + n] on a vocabulary tile that is not a
// multiple of either GEMM tile (64 or 128 wide), starting at an odd row, for every output matrix format.
TEST_P(VulkanFormats, LossTilesReadTheOutputMatrixWithEitherTile) {
  const Format f = format();
  const uint32_t V = 300, C = 512, T = 5, row0 = 37, n = 130;
  struct { uint32_t M, N, k_begin, k_end, lda, ldb, accumulate, row0, format, k_slice; } push{};  // k_slice 0: no split
  for (uint32_t tile : {64u, 128u}) {
    const auto w = random_weights(rng_, f, V, C);
    const uint8_t* tile_w = w.data() + row0 * row_bytes(f, C);
    const auto x = random_floats(rng_, T * C), d = random_floats(rng_, T * n), dx0 = random_floats(rng_, T * C);
    const auto w_dev = to_device_layout(f, w);
    vk::Buffer wb(*device_, w_dev.size()), xb(*device_, x.size() * 4), db(*device_, d.size() * 4);
    vk::Buffer logits(*device_, T * n * 4), dx(*device_, dx0.size() * 4);
    wb.upload(w_dev);
    xb.upload(x);
    db.upload(d);
    dx.upload(dx0);
    push = {T, n, 0, C, C, C, 0, row0, uint32_t(f)};
    run_shader(*device_, ("linear_ce_logits_" + name()).c_str(), logits, xb, wb, push,
               {groups_of(n, tile), groups_of(T, tile), 1}, {tile, tile});
    EXPECT_LE(ref::max_rel_error(logits.download_as<float>(T * n).data(), ref::frozen_gemm(f, tile_w, x.data(), T, n, C)),
              kBound)
        << name() << " logits, tile " << tile;
    push = {T, C, 0, n, n, C, 1, row0, uint32_t(f)};
    run_shader(*device_, ("linear_ce_dx_" + name()).c_str(), dx, db, wb, push,
               {groups_of(C, tile), groups_of(T, tile), 1}, {tile, tile});
    EXPECT_LE(ref::max_rel_error(dx.download_as<float>(T * C).data(),
                                 ref::frozen_dx(f, tile_w, d.data(), dx0.data(), T, n, C, 0, n)),
              kBound)
        << name() << " dx, tile " << tile;
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
// on every side: T = 130 is one full tile and two tokens, n_out = 257 two full tiles and one row; the products
// of each format at T = 3 and 130 over the format's second width and one of about 4128 (2304 for the super-blocks),
// the dx over all rows and from row 5 on.
TEST_P(VulkanFormats, LargeGemmTilesMatchReferenceOnAwkwardShapes) {
  const Format f = format();
  const auto large = make_vulkan_host_kernels(*device_, 128);
  const int64_t n_out = 257;
  std::vector<int64_t> n_ins = {shapes_for(f).n_ins[1]}, Ts = {3, 130};
  const int64_t wide = width_like(f, {4128, 2304});
  if (wide != n_ins[0]) n_ins.push_back(wide);
  if (!runs_every_shape(f)) {  // the smallest shape
    n_ins.resize(1);
    Ts.resize(1);
  }
  for (int64_t n_in : n_ins)
    for (int64_t T : Ts) {
      const auto w = random_weights(rng_, f, n_out, n_in);
      EXPECT_LE(gemm_error(*large, rng_, f, w, T, n_out, n_in), kBound) << label(f, T, n_out, n_in);
      const auto dy = random_floats(rng_, T * n_out);
      for (int64_t j0 : {int64_t(0), int64_t(5)})
        expect_dx_matches(*large, rng_, f, w, dy, T, n_out, n_in, j0,
                          "dx from row " + std::to_string(j0) + " " + label(f, T, n_out, n_in));
    }
}

TEST_F(VulkanKernels, LargeF32GemmTilesMatchReferenceOnAwkwardShapes) {
  const auto large = make_vulkan_host_kernels(*device_, 128);
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
TEST_P(VulkanFormats, DxSplitOverRowsMatchesReference) {
  const Format f = format();
  const auto small = make_vulkan_host_kernels(*device_, 64);
  const int64_t T = 130, n_out = 1100, j0 = 5, n_in = width_like(f, {1056, 1280});
  for (HostKernels* k : {kernels_, small.get()}) {
    if (k != kernels_ && !runs_every_shape(f)) continue;  // the smallest: the default tiles alone
    const auto w = random_weights(rng_, f, n_out, n_in);
    const auto dy = random_floats(rng_, T * n_out);
    expect_dx_matches(*k, rng_, f, w, dy, T, n_out, n_in, j0, label(f, T, n_out, n_in));
  }
  EXPECT_GT(vk::LinearKernels(*device_).dx_scratch_bytes(f, T, n_out - j0, n_in), size_t(0));  // the split does apply
}

// The dx GEMM where values span many decades: dY's rows twelve, W's scales large (weights up to 300); a partial
// tile of tokens (130), a row range that starts past row 0 and ends short of the last, with and without
// accumulate. Each token's row is checked against its own largest value, so a small row cannot hide behind a
// large one.
TEST_P(VulkanFormats, DxMatchesReferenceRowByRowAcrossDecades) {
  const Format f = format();
  for (const auto& [T, n_out, n_in] : {std::array<int64_t, 3>{32, 260, width_like(f, {32})},
                                       std::array<int64_t, 3>{130, 1100, width_like(f, {1056, 1280})}})
    for (const auto& [j0, j1] : {std::pair<int64_t, int64_t>{0, n_out}, {4, n_out - 8}}) {
      const auto w = random_weights(rng_, f, n_out, n_in, 300.0f);
      auto dy = random_floats(rng_, T * n_out);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < n_out; ++j) dy[size_t(t * n_out + j)] *= float(std::pow(10.0, double(t % 13) - 6.0));
      for (bool acc : {false, true}) {
        auto dx = random_floats(rng_, T * n_in);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < n_in; ++i) dx[size_t(t * n_in + i)] *= float(std::pow(10.0, double(t % 13) - 3.0));
        const auto dx0 = dx;
        kernels_->frozen_dx(f, dx, w, dy, T, n_out, n_in, j0, j1, acc);
        const auto want = ref::frozen_dx(f, w.data(), dy.data(), acc ? dx0.data() : nullptr, T, n_out, n_in, j0, j1);
        for (int64_t t = 0; t < T; ++t) {
          const std::vector<double> row(want.begin() + t * n_in, want.begin() + (t + 1) * n_in);
          EXPECT_LE(ref::max_rel_error(dx.data() + t * n_in, row), kBound)
              << label(f, T, n_out, n_in) << " rows " << j0 << ".." << j1 << " accumulate=" << acc << " token " << t;
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
  const Format f = Format::Q4_0;
  const int64_t n_out = 65, n_in = 4128;
  const auto w_host = random_weights(rng_, f, n_out, n_in);
  const auto x_host = random_floats(rng_, n_in);
  vk::LinearKernels k(*device_);
  const auto w_dev = to_device_layout(f, w_host);
  vk::Buffer w(*device_, w_dev.size()), x(*device_, x_host.size() * 4), y(*device_, n_out * 4);
  vk::Buffer dx(*device_, n_in * 4);
  vk::Buffer scratch(*device_, k.dx_scratch_bytes(f, 1, n_out, n_in));
  w.upload(w_dev);
  x.upload(x_host);
  dx.fill_zero();
  vk::Sequence s(*device_);
  s.begin();
  k.gemm(f, s, y, w, x, 1, n_out, n_in);
  // dx += Wᵀ·y, accumulating: after n submits dx = n·Wᵀ·W·x.
  k.dx(f, s, dx, w, y, &scratch, 1, n_out, n_in, 0, n_out, true);
  s.end();
  const auto y_ref = ref::frozen_gemm(f, w_host.data(), x_host.data(), 1, n_out, n_in);
  std::vector<float> y_ref_f(y_ref.begin(), y_ref.end());
  const auto dx_one = ref::frozen_dx(f, w_host.data(), y_ref_f.data(), nullptr, 1, n_out, n_in, 0, n_out);
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
  const Format f = Format::Q4_0;
  const int64_t n_out = 65, n_in = 4128;
  const auto w_host = random_weights(rng_, f, n_out, n_in);
  const auto x_host = random_floats(rng_, n_in);
  vk::LinearKernels k(*device_);
  const auto w_dev = to_device_layout(f, w_host);
  vk::Buffer w(*device_, w_dev.size()), x0(*device_, n_in * 4), x(*device_, n_in * 4);
  vk::Buffer y1(*device_, n_out * 4), y2(*device_, n_out * 4), dx(*device_, n_in * 4);
  vk::Buffer scratch(*device_, k.dx_scratch_bytes(f, 1, n_out, n_in));
  w.upload(w_dev);
  x0.upload(x_host);
  vk::Sequence s(*device_);
  s.begin();
  s.copy(x, x0, size_t(n_in) * 4);
  s.begin_independent();
  k.gemm(f, s, y1, w, x, 1, n_out, n_in);
  k.gemm(f, s, y2, w, x, 1, n_out, n_in);
  s.end_independent();
  k.dx(f, s, dx, w, y1, &scratch, 1, n_out, n_in, 0, n_out, false);
  s.end();
  s.run();
  const auto y_ref = ref::frozen_gemm(f, w_host.data(), x_host.data(), 1, n_out, n_in);
  EXPECT_LE(ref::max_rel_error(y1.download_as<float>(n_out).data(), y_ref), kBound);
  EXPECT_LE(ref::max_rel_error(y2.download_as<float>(n_out).data(), y_ref), kBound);
  const std::vector<float> y_ref_f(y_ref.begin(), y_ref.end());
  const auto dx_ref = ref::frozen_dx(f, w_host.data(), y_ref_f.data(), nullptr, 1, n_out, n_in, 0, n_out);
  EXPECT_LE(ref::max_rel_error(dx.download_as<float>(n_in).data(), dx_ref), kBound);
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

TEST_P(VulkanFormats, RejectsBuffersOfTheWrongSize) {
  const Format f = format();
  const int64_t n_in = narrowest_width(f), want = 2 * row_bytes(f, n_in);
  std::vector<uint8_t> w(size_t(want - 1));
  std::vector<float> x(static_cast<size_t>(n_in)), y(2);
  try {
    kernels_->frozen_gemm(f, y, w, x, 1, 2, n_in);
    ADD_FAILURE() << name() << ": no error";
  } catch (const ShapeError& e) {
    const std::string why = "W has " + std::to_string(want - 1) + " bytes, expected " + std::to_string(want);
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  vk::LinearKernels k(*device_);
  vk::Buffer small(*device_, 16), wbuf(*device_, size_t(device_weight_bytes(f, 2, n_in)));
  vk::Sequence s(*device_);
  s.begin();
  if (n_in * 4 > 16) {
    EXPECT_THROW(k.gemm(f, s, small, wbuf, small, 1, 2, n_in), ShapeError) << name();  // x needs 4·n_in bytes
  }
  EXPECT_THROW(k.dx(f, s, small, wbuf, small, nullptr, 1, 2, n_in, 0, 2, false), ShapeError) << name();
  s.end();
}

TEST_P(VulkanFormats, RejectsARowRangeOutsideTheMatrix) {
  const Format f = format();
  const int64_t n_in = narrowest_width(f);
  const auto w = random_weights(rng_, f, 7, n_in);
  std::vector<float> dy(7), dx(static_cast<size_t>(n_in));
  EXPECT_THROW(kernels_->frozen_dx(f, dx, w, dy, 1, 7, n_in, 5, 8, false), ShapeError) << name();
  EXPECT_THROW(kernels_->frozen_dx(f, dx, w, dy, 1, 7, n_in, 3, 3, false), ShapeError) << name();
}

INSTANTIATE_TEST_SUITE_P(AllFormats, VulkanFormats, ::testing::ValuesIn(all_formats()),
                         [](const ::testing::TestParamInfo<Format>& info) { return std::string(format_name(info.param)); });

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
