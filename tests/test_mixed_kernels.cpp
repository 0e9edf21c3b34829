// The mixed-precision kernels (vk::LinearKernels, "Mixed precision") on whatever Vulkan device the machine has:
// their portable FP32-FMA twins on lavapipe in CI, the tensor-core kernels where the device has cooperative
// matrices. Each is held to the reference of what it computes (ref::mixed_*: the f16-rounded inputs, summed
// exactly), tightly, and to the exact product within the bound mixed precision promises.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "kernels/cpu/reference.h"
#include "kernels/formats.h"
#include "kernels/quant/f16.h"
#include "kernels/random_inputs.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/linear_kernels.h"

namespace q4t {
namespace {

// f32 sums of f16 products over at most 4608 terms, against the same products summed exactly.
constexpr double kSumBound = 1e-4;
// The mixed products against the exact ones on random weights and inputs: two f16 roundings per term (input and
// weight, 2^-11 each), which add up in a dot product like a random walk.
constexpr double kMixedBound = 4e-3;

// W as the device holds it (Q6_K regrouped).
std::vector<uint8_t> device_bytes(Format f, const std::vector<uint8_t>& w) { return to_device_layout(f, w); }

// The n_in values each format's tests use: one unit, a few, and a row longer than a K step of every tile (whole
// super-blocks for the formats of 256-weight blocks).
std::vector<int64_t> widths(Format f) {
  if (format_traits(f).block_elems == 256) return {256, 512, 2304};
  return {32, 96, 4128};
}

class MixedKernels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { device_ = vk::Device::open({-1, /*validation=*/true}).release(); }
  static void TearDownTestSuite() { delete device_; }
  void SetUp() override {
    kernels_ = std::make_unique<vk::LinearKernels>(*device_);
    kernels_->set_precision(Precision::Mixed);
    messages_before_ = device_->validation_messages().size();
  }
  // Each test answers for the validation messages that arrive while it runs (the device keeps them all).
  void TearDown() override {
    const auto msgs = device_->validation_messages();
    EXPECT_EQ(msgs.size(), messages_before_)
        << "validation: " << (msgs.size() > messages_before_ ? msgs[messages_before_] : "");
  }

  // Y = X·Wᵀ through mixed_gemm (on the device's W bytes).
  std::vector<float> gemm(Format f, const std::vector<uint8_t>& w_host, const std::vector<float>& x_host, int64_t T,
                          int64_t n_out, int64_t n_in) {
    const auto wd = device_bytes(f, w_host);
    vk::Buffer w(*device_, wd.size()), x(*device_, x_host.size() * 4), y(*device_, size_t(T * n_out) * 4);
    vk::Buffer scratch(*device_, kernels_->mixed_scratch_bytes(f, T, n_out, n_in));
    w.upload(wd);
    x.upload(x_host);
    vk::Sequence s(*device_);
    s.begin();
    kernels_->mixed_gemm(f, s, y, w, x, scratch, T, n_out, n_in);
    s.end();
    s.run();
    return y.download_as<float>(size_t(T * n_out));
  }

  // dX (+)= dY[:, j0:j1]·W[j0:j1] through mixed_dx, dX starting as dx0.
  std::vector<float> dx(Format f, const std::vector<uint8_t>& w_host, const std::vector<float>& dy_host,
                        const std::vector<float>& dx0, int64_t T, int64_t n_out, int64_t n_in, int64_t j0, int64_t j1,
                        bool accumulate) {
    const auto wd = device_bytes(f, w_host);
    vk::Buffer w(*device_, wd.size()), dy(*device_, dy_host.size() * 4), dxb(*device_, dx0.size() * 4);
    vk::Buffer scratch(*device_, kernels_->mixed_scratch_bytes(f, T, n_in, j1 - j0));
    w.upload(wd);
    dy.upload(dy_host);
    dxb.upload(dx0);
    vk::Sequence s(*device_);
    s.begin();
    kernels_->mixed_dx(f, s, dxb, w, dy, scratch, T, n_out, j0, n_in, j0, j1 - j0, accumulate);
    s.end();
    s.run();
    return dxb.download_as<float>(dx0.size());
  }

  static vk::Device* device_;
  std::unique_ptr<vk::LinearKernels> kernels_;
  std::mt19937 rng_{31};
  size_t messages_before_ = 0;
};
vk::Device* MixedKernels::device_ = nullptr;

// The same fixture, once per weight format.
class MixedFormats : public MixedKernels, public ::testing::WithParamInterface<Format> {};

// Every format's decode (wunit.glsl through decode_f16.comp, into k-panels) gives the reference's f16 weights bit
// for bit, over windows of rows that start past row 0, with the default tile and the bench's others (rows per
// workgroup that do not divide the rows, units that do not fill a tile; staged through shared memory or not).
TEST_P(MixedFormats, DecodedWeightsEqualTheReferenceBitForBit) {
  const Format f = GetParam();
  struct Tile {
    uint32_t rows;
    bool staged;
  };
  for (int64_t n_in : widths(f)) {
    const int64_t n_out = 41, row0 = 2;
    const auto w_host = random_weights(rng_, f, n_out, n_in);
    const auto wd = device_bytes(f, w_host);
    vk::Buffer w(*device_, wd.size());
    w.upload(wd);
    for (const int64_t rows : {int64_t(6), int64_t(39)})
      for (const Tile t : {Tile{0, true}, Tile{1, true}, Tile{8, true}, Tile{8, false}, Tile{128, false}}) {
        vk::Buffer out(*device_, size_t(rows * n_in) * 2);
        out.fill_zero();
        vk::Sequence s(*device_);
        s.begin();
        kernels_->decode_f16(f, s, out, 0, w, rows, n_in, row0, t.rows, t.staged);
        s.end();
        s.run();
        const auto halves = out.download_as<uint16_t>(size_t(rows * n_in));
        int64_t wrong = 0;
        std::string first;  // the first few differences, for the failure message
        for (int64_t r = 0; r < rows; ++r) {
          const auto want = ref::mixed_row(f, w_host.data(), row0 + r, n_in);
          for (int64_t i = 0; i < n_in; ++i) {
            // k-panels: panel i / 32 holds columns i / 32 · 32 .. of every row
            const double got = quant::f16_to_f32(halves[size_t((i / 32 * rows + r) * 32 + i % 32)]);
            if (got == want[size_t(i)]) continue;
            if (++wrong <= 4)
              first += " [row " + std::to_string(row0 + r) + ", " + std::to_string(i) + "]: " + std::to_string(got) +
                       " want " + std::to_string(want[size_t(i)]);
          }
        }
        EXPECT_EQ(wrong, 0) << format_name(f) << " n_in=" << n_in << " rows=" << rows << " tile rows=" << t.rows
                            << (t.staged ? " staged" : " direct") << first;
      }
  }
}

// Rows of very different size each get their own power of two: a row past f16's range (1e6), one that would flush
// to zero in f16 (1e-9), a zero row and ordinary ones, read from a column offset of wider rows. The halves times
// the factors equal the reference's rounding exactly.
TEST_F(MixedKernels, RowsToF16ScaleEachRowIntoRange) {
  struct Shape {
    int64_t K, lda, col0;  // rows read as vec4s where lda and col0 keep them on 16 bytes (the second)
  };
  const int64_t rows = 6;
  const float scales[rows] = {1.0f, 1e6f, 1e-9f, 0.0f, 3e4f, 1e-3f};
  for (const Shape sh : {Shape{70, 81, 5}, Shape{2600, 2612, 8}})
    for (const uint32_t unroll : {1u, 4u, 16u}) {
      std::vector<float> x(size_t(rows * sh.lda));
      for (int64_t m = 0; m < rows; ++m) {
        const auto r = random_floats(rng_, sh.lda, scales[m]);
        std::copy(r.begin(), r.end(), x.begin() + m * sh.lda);
      }
      x[size_t(sh.col0 + std::min<int64_t>(1500, sh.K - 3))] = 1000.0f;  // row 0's largest value, deep in the row
      vk::Buffer in(*device_, x.size() * 4), out(*device_, vk::LinearKernels::f16_rows_bytes(rows, sh.K) + 16);
      in.upload(x);
      vk::Sequence s(*device_);
      s.begin();
      const auto a = kernels_->to_f16(s, out, 16, in, rows, sh.K, sh.lda, sh.col0, unroll);
      s.end();
      s.run();
      const auto words = out.download_as<uint32_t>(out.size() / 4);
      const auto want = ref::mixed_rows(x.data(), rows, sh.K, sh.lda, sh.col0);
      for (int64_t m = 0; m < rows; ++m) {
        const float factor = std::bit_cast<float>(words[a.s_base + size_t(m)]);
        int64_t wrong = 0;
        const int64_t kp = (sh.K + 31) / 32 * 32;  // k-panels of 32 columns: panel q holds columns 32q .. of every row
        for (int64_t k = 0; k < kp; ++k) {
          const size_t word_at = (size_t(a.base) + size_t(k / 32) * 4 * rows + 4 * size_t(m)) * 4 + size_t(k % 32) / 2;
          const uint32_t word = words[word_at];
          const double h = quant::f16_to_f32(uint16_t(k % 2 == 0 ? word & 0xFFFF : word >> 16));
          if (k >= sh.K) {
            wrong += h != 0.0;  // the padding up to the GEMM's K step
            continue;
          }
          wrong += h * factor != want[size_t(m * sh.K + k)];
          wrong += !std::isfinite(h) || (x[size_t(m * sh.lda + sh.col0 + k)] != 0 && h == 0);
        }
        EXPECT_EQ(wrong, 0) << "row " << m << " of scale " << scales[m] << ", K " << sh.K << ", unroll " << unroll;
      }
    }
}

// Y = X·Wᵀ for every format on shapes whose tiles do not divide (T from the fewest tokens that take the mixed path,
// n_out from 1 row), against the f16 reference tightly and the exact product within the mixed bound.
TEST_P(MixedFormats, GemmMatchesTheF16ReferenceOnAwkwardShapes) {
  const Format f = GetParam();
  for (int64_t n_in : widths(f))
    for (int64_t n_out : {1, 63, 130})
      for (int64_t T : {32, 65}) {
        const auto w = random_weights(rng_, f, n_out, n_in);
        const auto x = random_floats(rng_, T * n_in);
        const auto y = gemm(f, w, x, T, n_out, n_in);
        const std::string what = std::string(format_name(f)) + " T=" + std::to_string(T) + " " +
                                 std::to_string(n_out) + "x" + std::to_string(n_in);
        EXPECT_LE(ref::max_rel_error(y.data(), ref::mixed_gemm(f, w.data(), x.data(), T, n_out, n_in)), kSumBound)
            << what;
        const auto exact = ref::frozen_gemm(f, w.data(), x.data(), T, n_out, n_in);
        EXPECT_LE(ref::max_rel_error(y.data(), exact), kMixedBound) << what;
      }
}

// dX (+)= dY[:, j0:j1]·W[j0:j1] over windows of W's rows that start and end off every tile edge, with and without
// accumulating into a dX that holds values.
TEST_P(MixedFormats, DxMatchesTheF16ReferenceOverRowWindows) {
  struct Window { int64_t n_out, j0, j1; };
  const Format f = GetParam();
  for (int64_t n_in : widths(f))
    for (const Window win : {Window{1, 0, 1}, Window{70, 3, 70}, Window{300, 37, 261}})
      for (bool acc : {false, true}) {
        const int64_t T = acc ? 33 : 64;
        const auto w = random_weights(rng_, f, win.n_out, n_in);
        const auto dy = random_floats(rng_, T * win.n_out);
        const auto dx0 = random_floats(rng_, T * n_in);
        const auto got = dx(f, w, dy, dx0, T, win.n_out, n_in, win.j0, win.j1, acc);
        const auto want =
            ref::mixed_dx(f, w.data(), dy.data(), acc ? dx0.data() : nullptr, T, win.n_out, n_in, win.j0, win.j1);
        EXPECT_LE(ref::max_rel_error(got.data(), want), kSumBound)
            << format_name(f) << " T=" << T << " n_in=" << n_in << " rows [" << win.j0 << ", " << win.j1
            << ") accumulate=" << acc;
      }
}

// Every tile shape the bench can name computes the same products: the forward and the dx of each format that has
// the shape (the default one every format has; the bench's others F16, Q4_0 and Q4_K), on a product whose tiles do
// not divide (on devices without cooperative matrices, the portable twin).
TEST_P(MixedFormats, EveryTileShapeMatchesTheF16Reference) {
  const int64_t T = 300, n_out = 260, n_in = 512;
  const Format f = GetParam();
  for (const std::string& v : vk::LinearKernels::mixed_variants())
    for (bool dx : {false, true}) {
      if (!kernels_->has_mixed_variant(f, dx, v)) continue;
      const auto w_host = random_weights(rng_, f, n_out, n_in);
      const auto wd = device_bytes(f, w_host);
      const int64_t K = dx ? n_out : n_in, N = dx ? n_in : n_out;
      const auto x = random_floats(rng_, T * K);
      vk::Buffer w(*device_, wd.size()), in(*device_, x.size() * 4), out(*device_, size_t(T * N) * 4);
      const size_t split = (kernels_->mixed_split_bytes(T, N, K, v) + 15) / 16 * 16;
      vk::Buffer scratch(*device_, split + vk::LinearKernels::f16_rows_bytes(T, K));
      w.upload(wd);
      in.upload(x);
      vk::Sequence s(*device_);
      s.begin();
      const auto a = kernels_->to_f16(s, scratch, split, in, T, K, K, 0);
      kernels_->mixed_product(dx, s, out, a, {f, &w}, N, n_in, false, split > 0 ? &scratch : nullptr, v);
      s.end();
      s.run();
      const auto got = out.download_as<float>(size_t(T * N));
      const auto want = dx ? ref::mixed_dx(f, w_host.data(), x.data(), nullptr, T, n_out, n_in, 0, n_out)
                           : ref::mixed_gemm(f, w_host.data(), x.data(), T, n_out, n_in);
      EXPECT_LE(ref::max_rel_error(got.data(), want), kSumBound)
          << format_name(f) << (dx ? " dx" : " gemm") << " tile '" << v << "'";
    }
}

// Products of few output tiles and a long K sum slices of K in a scratch and add them in order: the forward over
// n_in = 8192, the dx over 6000 rows of W (rows of 96 weights, or one super-block).
TEST_P(MixedFormats, ProductsSplitOverKMatchTheReference) {
  ASSERT_GT(kernels_->mixed_split_bytes(40, 64, 8192), 0u);
  ASSERT_GT(kernels_->mixed_split_bytes(48, 96, 6000), 0u);
  const Format f = GetParam();
  const auto w = random_weights(rng_, f, 64, 8192);
  const auto x = random_floats(rng_, 40 * 8192);
  EXPECT_LE(ref::max_rel_error(gemm(f, w, x, 40, 64, 8192).data(), ref::mixed_gemm(f, w.data(), x.data(), 40, 64, 8192)),
            kSumBound)
      << format_name(f);
  const int64_t n_in = format_traits(f).block_elems == 256 ? 256 : 96;
  const auto w2 = random_weights(rng_, f, 6000, n_in);
  const auto dy = random_floats(rng_, 48 * 6000);
  const std::vector<float> dx0(size_t(48 * n_in), 0.5f);
  const auto got = dx(f, w2, dy, dx0, 48, 6000, n_in, 0, 6000, true);
  EXPECT_LE(ref::max_rel_error(got.data(), ref::mixed_dx(f, w2.data(), dy.data(), dx0.data(), 48, 6000, n_in, 0, 6000)),
            kSumBound)
      << format_name(f);
}

// Inputs outside f16's range either way: activations near 1e6 (f16 overflows at 65504) and gradients near 1e-9
// (f16 flushes them to zero) give each row its product, row by row within the bounds; and a NaN in one row stays
// in that row's outputs.
TEST_F(MixedKernels, RowsOutsideF16RangeKeepTheirProducts) {
  const int64_t T = 40, n_out = 70, n_in = 96;
  const auto w = random_weights(rng_, Format::Q4_0, n_out, n_in);
  for (float scale : {1e6f, 1e-9f}) {
    auto x = random_floats(rng_, T * n_in, scale);
    for (int64_t i = 0; i < n_in; ++i) x[size_t(7 * n_in + i)] *= 1e-3f;  // one row a thousand times smaller
    const auto y = gemm(Format::Q4_0, w, x, T, n_out, n_in);
    const auto want = ref::frozen_gemm(Format::Q4_0, w.data(), x.data(), T, n_out, n_in);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> row(want.begin() + t * n_out, want.begin() + (t + 1) * n_out);
      EXPECT_LE(ref::max_rel_error(y.data() + t * n_out, row), kMixedBound) << "scale " << scale << " row " << t;
    }
    const auto dy = random_floats(rng_, T * n_out, scale);
    const std::vector<float> dx0(size_t(T * n_in), 0.0f);
    const auto got = dx(Format::Q4_0, w, dy, dx0, T, n_out, n_in, 0, n_out, false);
    const auto want_dx = ref::frozen_dx(Format::Q4_0, w.data(), dy.data(), nullptr, T, n_out, n_in, 0, n_out);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> row(want_dx.begin() + t * n_in, want_dx.begin() + (t + 1) * n_in);
      EXPECT_LE(ref::max_rel_error(got.data() + t * n_in, row), kMixedBound) << "dx scale " << scale << " row " << t;
    }
  }
  auto x = random_floats(rng_, T * n_in);
  x[size_t(5 * n_in + 3)] = NAN;
  const auto y = gemm(Format::Q4_0, w, x, T, n_out, n_in);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < n_out; ++n) EXPECT_EQ(std::isnan(y[size_t(t * n_out + n)]), t == 5) << t << " " << n;
}

// Under the mixed precision the one-token GEMVs with an integer-dot twin take the activations as 16-bit integers
// at one scale per group (int_dot.glsl, two limbs): each output within what that rounding allows of the exact
// product (Σ |w|·half a step of the input's group, plus f32 sums), on groups mixing values six decades apart, and
// tighter than 8-bit activations would be: the bound's own 2^-15 steps. Odd row counts, one block or super-block
// and more.
TEST_P(MixedFormats, OneTokenGemvsTakeSixteenBitActivations) {
  const Format f = GetParam();
  const FormatTraits& t = format_traits(f);
  if (!t.gpu.gemv_dot) GTEST_SKIP() << format_name(f) << " has no integer-dot GEMV";
  if (!device_->integer_dot()) GTEST_SKIP() << device_->name() << " has no 8-bit integer dot products";
  kernels_->set_integer_dot(vk::LinearKernels::IntegerDot::Always);
  const int64_t group = t.block_elems == 256 && t.gpu.gemv_dot_layout != 3 ? 256 : 32;  // x_limbs.comp's groups
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t n_in : widths(f))
    for (int64_t n_out : {int64_t(1), int64_t(37)})
      for (bool wide : {false, true}) {
        std::vector<float> x(static_cast<size_t>(n_in), 0.0f);
        for (size_t i = 0; i < x.size(); ++i)
          x[i] = u(rng_) * (wide && i % 29 == 0 ? 1e3f : wide && i % 3 ? 1e-3f : 1.0f);
        const auto w_host = random_weights(rng_, f, n_out, n_in);
        const auto wd = device_bytes(f, w_host);
        vk::Buffer w(*device_, wd.size()), xb(*device_, x.size() * 4), y(*device_, size_t(n_out) * 4);
        vk::Buffer scratch(*device_, kernels_->gemm_scratch_bytes(f, 1, n_out, n_in));
        w.upload(wd);
        xb.upload(x);
        vk::Sequence s(*device_);
        s.begin();
        kernels_->gemm(f, s, y, w, xb, 1, n_out, n_in, &scratch);
        s.end();
        s.run();
        const auto got = y.download_as<float>(size_t(n_out));
        const auto want = ref::frozen_gemm(f, w_host.data(), x.data(), 1, n_out, n_in);
        for (int64_t r = 0; r < n_out; ++r) {
          const auto wr = ref::frozen_row(f, w_host.data(), r, n_in);
          double bound = 0, mass = 0;
          for (int64_t g0 = 0; g0 < n_in; g0 += group) {
            double m = 0, wsum = 0;
            for (int64_t i = g0; i < g0 + group; ++i) {
              m = std::max(m, double(std::abs(x[size_t(i)])));
              wsum += std::abs(wr[size_t(i)]);
              mass += std::abs(wr[size_t(i)] * x[size_t(i)]);
            }
            bound += wsum * 0.5 * m / 32767.0;
          }
          bound += 1e-6 * mass;
          EXPECT_LE(std::abs(got[size_t(r)] - want[size_t(r)]), bound)
              << format_name(f) << " n_in=" << n_in << " n_out=" << n_out << " row " << r << (wide ? " wide" : "");
        }
      }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, MixedFormats, ::testing::ValuesIn(all_formats()),
                         [](const ::testing::TestParamInfo<Format>& info) { return std::string(format_name(info.param)); });

}  // namespace
}  // namespace q4t
