// CPU kernels of the frozen linears of every weight format (kernels/formats.h) and the LoRA f32 GEMMs against the
// double-precision reference, on awkward shapes, with every instruction set this CPU can run, and with different
// thread counts.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "error_of.h"
#include "kernels/cpu/frozen_rows.h"
#include "kernels/cpu/int_rows.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/q4_0_rows.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/threads.h"
#include "kernels/formats.h"
#include "kernels/quant/act_round.h"
#include "kernels/quant/f16.h"
#include "kernels/random_inputs.h"
#include "kernels/shapes.h"

namespace q4t::cpu {
namespace {

// Bound on ref::max_rel_error for the Q4_0 kernel sets' checks. f32 accumulation over these sizes (up to 4128
// terms) lands near 1e-6; a wrong nibble, block or scale shows up as 1e-3 or more.
constexpr double kTol = 1e-5;
// The bound of the brief, 1e-4, for the other formats: with n_out = 1 the norm-wise error is that of one dot
// product, and an unlucky one cancels (F16 at n_in = 4133: a sum of 0.36 from terms of total size ~2600, off by
// 8e-6 = 2.3e-5 relative). A wrong block, scale or tail still shows up as 1e-3 or more.
constexpr double kFrozenTol = 1e-4;

// W[n_out, n_in] in format f, quantised from N(0, 1) weights. The K-quant and IQ4 quantizers search scales per
// block or sub-block, which is slow enough to matter when every kernel set re-makes the same matrices, so each
// (format, shape, seed) of a block format is quantized once per run (F16 and BF16 only round).
std::vector<uint8_t> random_weights(Format f, int64_t n_out, int64_t n_in, uint32_t seed) {
  if (format_traits(f).block_elems == 1)
    return quantize_matrix(f, normal_floats(n_out * n_in, seed), n_out, n_in);
  static std::map<std::array<int64_t, 4>, std::vector<uint8_t>> made;
  std::vector<uint8_t>& w = made[{int64_t(f), n_out, n_in, int64_t(seed)}];
  if (w.empty()) w = quantize_matrix(f, normal_floats(n_out * n_in, seed), n_out, n_in);
  return w;
}

std::string shape_label(int64_t T, int64_t n_out, int64_t n_in) {
  return "T=" + std::to_string(T) + " n_out=" + std::to_string(n_out) + " n_in=" + std::to_string(n_in);
}

// The shapes worth testing for a format, and its bound. Formats of one weight a block (F16, BF16) take any n_in,
// so odd widths and widths below one SIMD vector are included. Blocks of 32 take one, two and 129 blocks. The
// 256-weight super-blocks take one and several, and 9 of them so that threads split an odd count; their token
// counts straddle the driver's thresholds (4: panel dx; 12: panel GEMM) and 257 output rows straddle its 256-row
// depth. The first width is the smallest, the second the next, the last the widest.
struct Shapes {
  std::vector<int64_t> n_ins, n_outs, tokens;
  double tol;
};

Shapes shapes_for(Format f) {
  const std::vector<int64_t> n_outs = {1, 7, 63, 65, 1000}, tokens = {1, 3, 17};
  const double tol = f == Format::Q4_0 ? kTol : kFrozenTol;
  switch (format_traits(f).block_elems) {
    case 1: return {{32, 64, 4128, 7, 33, 4133}, n_outs, tokens, tol};
    case 32: return {{32, 64, 4128}, n_outs, tokens, tol};
    default: return {{256, 512, 768, 2304}, {1, 3, 37, 257}, {1, 3, 4, 12, 17, 40}, tol};
  }
}

std::string isa_name(detail::Isa isa) {
  switch (isa) {
    case detail::Isa::Portable: return "portable";
    case detail::Isa::Avx2: return "avx2";
    case detail::Isa::Avx512: return "avx512";
  }
  return "unknown";
}

// Each test body runs once per kernel set (portable, AVX2, AVX-512; sets this CPU lacks are skipped) and format.
// The Q4_0 kernel set in use also picks the loops of the formats with loops of their own (kernels/cpu/frozen_rows.h:
// Q8_0, Q4_K, Q6_K, F16); the others decode through their codec whatever the set.
class FrozenKernelSets : public ::testing::TestWithParam<std::tuple<detail::Isa, Format>> {
 protected:
  void SetUp() override {
    if (!detail::q4_0_kernels_for(isa())) GTEST_SKIP() << "this CPU cannot run the kernel set";
    saved_ = detail::q4_0_kernels().isa;
    detail::use_q4_0_kernels(isa());
    switched_ = true;
  }
  void TearDown() override {
    if (switched_) detail::use_q4_0_kernels(saved_);
  }
  static detail::Isa isa() { return std::get<0>(GetParam()); }
  static Format format() { return std::get<1>(GetParam()); }
  static std::string name() { return format_name(format()); }
  // check(w, T, n_out, n_in) on every shape of the format's grid, W [n_out, n_in] made with seed
  // n_out·seed_step + n_in.
  template <typename Check>
  static void for_each_shape(int64_t seed_step, Check check) {
    const Shapes s = shapes_for(format());
    for (int64_t n_in : s.n_ins)
      for (int64_t n_out : s.n_outs) {
        const std::vector<uint8_t> w = random_weights(format(), n_out, n_in, uint32_t(n_out * seed_step + n_in));
        for (int64_t T : s.tokens) check(w, T, n_out, n_in);
      }
  }

 private:
  detail::Isa saved_ = detail::Isa::Portable;
  bool switched_ = false;
};

TEST_P(FrozenKernelSets, GemvAndGemmMatchTheDoubleReferenceOnAwkwardShapes) {
  const Format f = format();
  const double tol = shapes_for(f).tol;
  for_each_shape(7, [&](const std::vector<uint8_t>& w, int64_t T, int64_t n_out, int64_t n_in) {
    const std::vector<float> X = normal_floats(T * n_in, uint32_t(T));
    const std::vector<double> want = ref::frozen_gemm(f, w.data(), X.data(), T, n_out, n_in);
    std::vector<float> Y(T * n_out, NAN);
    frozen_gemm(f, Y, w, X, T, n_out, n_in);  // T = 1: the GEMV
    EXPECT_LE(ref::max_rel_error(Y.data(), want), tol)
        << name() << (T == 1 ? " gemv " : " gemm ") << shape_label(T, n_out, n_in);
  });
}

// Mixed precision on the CPU: below kMixedTokens tokens, the product of W with the activation rounded to 8-bit
// blocks (the double-precision reference on the rounded values); from kMixedTokens on, and wherever the CPU or the
// format has no integer loops, exactly the f32 result.
TEST_P(FrozenKernelSets, MixedProductsAreTheProductOfTheActivationRoundedAsLlamaCpp) {
  const Format f = format();
  const double tol = kTol;  // integer sums within each block: only the float sums across blocks round
  for_each_shape(7, [&](const std::vector<uint8_t>& w, int64_t T, int64_t n_out, int64_t n_in) {
    if (T > kMixedTokens) T = kMixedTokens;  // the first token count that runs in f32
    std::vector<float> X = normal_floats(T * n_in, uint32_t(T + 5));
    if (n_in >= 64) X[size_t(n_in / 2)] = 40.0f;  // one large value: its block's other values round coarsely
    std::vector<float> Y(T * n_out, NAN), Y32(T * n_out, NAN);
    frozen_gemm(f, Y, w, X, T, n_out, n_in, Precision::Mixed);
    frozen_gemm(f, Y32, w, X, T, n_out, n_in);
    if (T >= kMixedTokens || !has_mixed(f)) {
      EXPECT_EQ(std::memcmp(Y.data(), Y32.data(), Y.size() * sizeof(float)), 0)
          << name() << " mixed is not the f32 result at " << shape_label(T, n_out, n_in);
      return;
    }
    const std::vector<float> Xr = ref::act_rounded(f, X.data(), int64_t(X.size()));
    const std::vector<double> want = ref::frozen_gemm(f, w.data(), Xr.data(), T, n_out, n_in);
    EXPECT_LE(ref::max_rel_error(Y.data(), want), tol) << name() << " mixed " << shape_label(T, n_out, n_in);
    // and the rounding is visible: the f32 product is further from the rounded reference than the mixed one
    if (n_in >= 64) {
      EXPECT_GT(ref::max_rel_error(Y32.data(), want), 10 * tol) << name() << " " << shape_label(T, n_out, n_in);
    }
  });
}

// The integer loops' rounding of the activation is the scalar rule's, value for value, with its block sums; blocks
// of zeros and of ties included.
TEST_P(FrozenKernelSets, MixedRoundingIsTheScalarRuleBitForBit) {
  const Format f = format();
  const detail::IntRowKernels* k = format_traits(f).cpu_int_rows ? format_traits(f).cpu_int_rows() : nullptr;
  if (!k) GTEST_SKIP() << name() << " has no integer loops in this kernel set";
  const int64_t n = 4 * 256;
  std::vector<float> x = normal_floats(n, 11);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);            // a zero block of either size
  for (int i = 512; i < 768; i++) x[size_t(i)] = float(i % 5) - 2.5f;  // ties of the rounding
  x[800] = -3e-3f, x[801] = 3e-3f;                              // largest magnitudes of equal size
  std::vector<int8_t> q(n);
  std::vector<float> d(size_t(n / k->block_elems));
  std::vector<int16_t> bsum(n / 16);
  k->round(q.data(), d.data(), bsum.data(), x.data(), n);
  std::vector<int8_t> want(size_t(k->block_elems));
  for (int64_t b = 0; b < n / k->block_elems; b++) {
    const float* xb = x.data() + b * k->block_elems;
    const float wd = k->block_elems == 32 ? quant::round_q8_0_block(xb, want.data()) : quant::round_q8_k_block(xb, want.data());
    ASSERT_EQ(std::bit_cast<uint32_t>(d[size_t(b)]), std::bit_cast<uint32_t>(wd)) << name() << " block " << b;
    for (int64_t i = 0; i < k->block_elems; i++)
      ASSERT_EQ(q[size_t(b * k->block_elems + i)], want[size_t(i)]) << name() << " block " << b << " value " << i;
  }
  for (int64_t g = 0; g < n / 16; g++) {
    int sum = 0;
    for (int i = 0; i < 16; i++) sum += q[size_t(16 * g + i)];
    ASSERT_EQ(bsum[size_t(g)], sum) << name() << " group " << g;
  }
}

TEST_P(FrozenKernelSets, DxMatchesTheReferenceOverwritingAndAccumulating) {
  const Format f = format();
  const double tol = shapes_for(f).tol;
  for_each_shape(5, [&](const std::vector<uint8_t>& w, int64_t T, int64_t n_out, int64_t n_in) {
    const std::vector<float> dY = normal_floats(T * n_out, uint32_t(T + 10));
    const std::vector<float> dX_in = normal_floats(T * n_in, uint32_t(T + 20));
    const std::string label = name() + " " + shape_label(T, n_out, n_in);
    std::vector<float> dX(T * n_in, NAN);
    frozen_dx(f, dX, w, dY, T, n_out, n_in, 0, n_out, false);
    EXPECT_LE(ref::max_rel_error(dX.data(), ref::frozen_dx(f, w.data(), dY.data(), nullptr, T, n_out, n_in, 0, n_out)),
              tol)
        << "overwrite " << label;
    // A row range that starts and ends inside the matrix, added onto existing values.
    const int64_t j0 = n_out / 3, j1 = n_out - n_out / 4;
    dX = dX_in;
    frozen_dx(f, dX, w, dY, T, n_out, n_in, j0, j1, true);
    EXPECT_LE(
        ref::max_rel_error(dX.data(), ref::frozen_dx(f, w.data(), dY.data(), dX_in.data(), T, n_out, n_in, j0, j1)),
        tol)
        << "accumulate rows [" << j0 << ", " << j1 << ") " << label;
  });
}

// The vocab-tiled backward: the first tile overwrites, later tiles add, and the sum equals one untiled call.
TEST_P(FrozenKernelSets, DxTilesAccumulatedInTurnEqualTheUntiledResult) {
  struct Case {
    int64_t n_out, n_in, tile;
  };
  const Format f = format();
  const Shapes s = shapes_for(f);
  // Widths from the format's list: the widest, the second and the narrowest.
  for (Case c : {Case{1000, s.n_ins.back(), 300}, Case{7, s.n_ins[1], 5}, Case{65, s.n_ins[0], 64}})
    for (int64_t T : {int64_t(1), int64_t(17)}) {
      const std::vector<uint8_t> w = random_weights(f, c.n_out, c.n_in, uint32_t(c.tile));
      const std::vector<float> dY = normal_floats(T * c.n_out, uint32_t(T + 30));
      std::vector<float> untiled(T * c.n_in, NAN), tiled(T * c.n_in, NAN);
      frozen_dx(f, untiled, w, dY, T, c.n_out, c.n_in, 0, c.n_out, false);
      for (int64_t j0 = 0; j0 < c.n_out; j0 += c.tile)
        frozen_dx(f, tiled, w, dY, T, c.n_out, c.n_in, j0, std::min(j0 + c.tile, c.n_out), j0 > 0);
      const std::vector<double> want = ref::frozen_dx(f, w.data(), dY.data(), nullptr, T, c.n_out, c.n_in, 0, c.n_out);
      const std::string label = name() + " " + shape_label(T, c.n_out, c.n_in) + " tile=" + std::to_string(c.tile);
      EXPECT_LE(ref::max_rel_error(tiled.data(), want), s.tol) << label;
      EXPECT_LE(ref::max_rel_error(untiled.data(), want), s.tol) << label;
      // Q4_0's own driver: the tiles' sum is the untiled result to f32 rounding.
      if (f == Format::Q4_0) {
        const std::vector<double> untiled_d(untiled.begin(), untiled.end());
        EXPECT_LE(ref::max_rel_error(tiled.data(), untiled_d), 1e-6) << label;
      }
    }
}

// Threads split rows (GEMV, GEMM) or columns (dx). The single-token kernels keep every element's arithmetic
// order whatever the split, so they must be bit-identical; the portable set's Eigen tiles may re-block their
// sums, so the multi-token results are held to the reference bound instead.
TEST_P(FrozenKernelSets, ThreadCountDoesNotChangeTheResults) {
  const Format f = format();
  const Shapes s = shapes_for(f);
  const int64_t n_out = 1000, n_in = s.n_ins.back(), T = 17;
  const std::vector<uint8_t> w = random_weights(f, n_out, n_in, 99);
  const std::vector<float> X = normal_floats(T * n_in, 98), dY = normal_floats(T * n_out, 97);
  std::vector<std::vector<float>> y(2, std::vector<float>(n_out)), Y(2, std::vector<float>(T * n_out)),
      dX(2, std::vector<float>(T * n_in)), dx1(2, std::vector<float>(n_in));
  const int thread_counts[2] = {1, 3};
  for (int i = 0; i < 2; i++) {
    set_num_threads(thread_counts[i]);
    frozen_gemm(f, y[i], w, std::span<const float>(X).first(n_in), 1, n_out, n_in);
    frozen_gemm(f, Y[i], w, X, T, n_out, n_in);
    frozen_dx(f, dX[i], w, dY, T, n_out, n_in, 0, n_out, false);
    frozen_dx(f, dx1[i], w, std::span<const float>(dY).first(n_out), 1, n_out, n_in, 0, n_out, false);
  }
  set_num_threads(0);
  EXPECT_EQ(y[0], y[1]) << name();
  EXPECT_EQ(dx1[0], dx1[1]) << name();
  const std::vector<double> want_Y = ref::frozen_gemm(f, w.data(), X.data(), T, n_out, n_in);
  const std::vector<double> want_dX = ref::frozen_dx(f, w.data(), dY.data(), nullptr, T, n_out, n_in, 0, n_out);
  for (int i = 0; i < 2; i++) {
    const std::string label = name() + " " + std::to_string(thread_counts[i]) + " threads";
    EXPECT_LE(ref::max_rel_error(Y[i].data(), want_Y), s.tol) << label;
    EXPECT_LE(ref::max_rel_error(dX[i].data(), want_dX), s.tol) << label;
  }
}

// The row loops decode exactly as the codec's float dequantisation (GGML's), from bytes at any alignment: every
// format's loops of kernels/cpu/frozen_rows.h, and Q4_0's kernel set (its dequant). For Q4_K the last block's d
// and dmin are far apart, so that d·sc·q − dmin·m rounds in f32 and the order of the operations shows.
TEST_P(FrozenKernelSets, DecodeEqualsTheCodecBitForBit) {
  const Format f = format();
  const FormatTraits& t = format_traits(f);
  const int64_t n = 4 * 256;  // whole blocks of every format
  std::vector<uint8_t> row = random_weights(f, 1, n, 11);
  if (f == Format::Q4_K) {
    const uint16_t d = quant::f32_to_f16(1000.0f), dmin = quant::f32_to_f16(3e-3f);
    std::memcpy(row.data() + 3 * t.block_bytes, &d, 2);
    std::memcpy(row.data() + 3 * t.block_bytes + 2, &dmin, 2);
  }
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n) + 1, NAN);
  t.dequantize_row(want.data(), row.data(), n);
  std::vector<uint8_t> shifted(row.size() + 1);  // an odd address
  std::memcpy(shifted.data() + 1, row.data(), row.size());
  std::string kernels;
  if (t.cpu_rows) {
    const detail::FrozenRowKernels& k = t.cpu_rows();
    kernels = k.name;
    k.decode(got.data() + 1, shifted.data() + 1, n);
  } else {  // Q4_0: its kernel set, walking the row's blocks
    const detail::Q4_0Kernels& k = detail::q4_0_kernels();
    kernels = k.name;
    k.dequant(got.data() + 1, shifted.data() + 1, n / t.block_elems, t.block_bytes);
  }
  for (int64_t i = 0; i < n; i++)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(i) + 1]), std::bit_cast<uint32_t>(want[size_t(i)]))
        << name() << " (" << kernels << ") weight " << i << ": " << got[size_t(i) + 1] << " != " << want[size_t(i)];
}

INSTANTIATE_TEST_SUITE_P(AllKernelSets, FrozenKernelSets,
                         ::testing::Combine(::testing::Values(detail::Isa::Portable, detail::Isa::Avx2,
                                                              detail::Isa::Avx512),
                                            ::testing::ValuesIn(all_formats())),
                         [](const ::testing::TestParamInfo<std::tuple<detail::Isa, Format>>& info) {
                           return isa_name(std::get<0>(info.param)) + "_" + format_name(std::get<1>(info.param));
                         });

using GemmFn = void (*)(std::span<float>, std::span<const float>, std::span<const float>, int64_t, int64_t,
                        int64_t, bool, float);
using RefFn = std::vector<double> (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t, double);

TEST(F32Gemm, AllTranspositionsMatchTheReferenceOnOddShapes) {
  struct Variant {
    const char* name;
    GemmFn fn;
    RefFn ref;
  };
  const Variant variants[] = {{"gemm_nt", gemm_nt, ref::gemm_nt},
                              {"gemm_nn", gemm_nn, ref::gemm_nn},
                              {"gemm_tn", gemm_tn, ref::gemm_tn}};
  const int64_t dims[] = {1, 3, 17, 65};
  std::vector<std::array<int64_t, 3>> shapes;
  for (int64_t M : dims)
    for (int64_t N : dims)
      for (int64_t K : dims) shapes.push_back({M, N, K});
  shapes.push_back({130, 70, 300});  // large enough to be split across threads
  for (const Variant& v : variants)
    for (auto [M, N, K] : shapes) {
      const std::vector<float> A = normal_floats(M * K, uint32_t(M + 3 * K)),
                               B = normal_floats(K * N, uint32_t(N + 5 * K));
      const std::vector<float> C_in = normal_floats(M * N, uint32_t(M * N));
      const std::string label = std::string(v.name) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                " K=" + std::to_string(K);
      std::vector<float> C(M * N, NAN);
      v.fn(C, A, B, M, N, K, false, 1);
      EXPECT_LE(ref::max_rel_error(C.data(), v.ref(A.data(), B.data(), nullptr, M, N, K, 1)), kTol) << label;
      C = C_in;
      v.fn(C, A, B, M, N, K, true, 1);
      EXPECT_LE(ref::max_rel_error(C.data(), v.ref(A.data(), B.data(), C_in.data(), M, N, K, 1)), kTol)
          << label << " accumulate";
      C = C_in;  // C_in + alpha·A·B (LoRA's scale folded into its products)
      v.fn(C, A, B, M, N, K, true, -0.375f);
      EXPECT_LE(ref::max_rel_error(C.data(), v.ref(A.data(), B.data(), C_in.data(), M, N, K, -0.375)), kTol)
          << label << " accumulate, alpha -0.375";
    }
}

constexpr auto& shape_error = test::error_of<ShapeError>;

#define EXPECT_SHAPE_ERROR(call, text)                                    \
  do {                                                                    \
    const std::string msg_ = shape_error([&] { call; });                  \
    EXPECT_NE(msg_.find(text), std::string::npos) << "message: " << msg_; \
  } while (0)

// The shape checks of every format's kernels; the messages name the kernel ("<format>_gemv" for one token,
// "<format>_gemm", "<format>_dx") and both sizes.
class FrozenLinear : public ::testing::TestWithParam<Format> {
 protected:
  static Format format() { return GetParam(); }
  static std::string name() { return format_name(GetParam()); }
  static int64_t block() { return format_traits(GetParam()).block_elems; }
  // A valid width: 5 weights where any width goes, else two blocks.
  static int64_t width() { return block() == 1 ? 5 : 2 * block(); }
};

// Widths that are not whole blocks are refused by each entry point, naming the block size; formats of one weight a
// block take any positive width.
TEST_P(FrozenLinear, RejectsAnInputWidthThatIsNotAWholeNumberOfBlocks) {
  const Format f = format();
  if (block() == 1) {
    std::vector<uint8_t> w(3 * 2 * 5);
    std::vector<float> x(5), y(3);
    EXPECT_NO_THROW(frozen_gemm(f, y, w, x, 1, 3, 5));
    EXPECT_SHAPE_ERROR(frozen_gemm(f, y, w, x, 1, 3, 0), name() + "_gemv: n_in = 0 must be positive");
    return;
  }
  const int64_t n_in = block() + block() / 2;  // 48 or 384
  const std::string why = ": n_in = " + std::to_string(n_in) + " is not a multiple of " + std::to_string(block()) +
                          " (the " + name() + " block size)";
  std::vector<uint8_t> w(size_t(4 * row_bytes(f, 2 * block())));
  std::vector<float> x(static_cast<size_t>(3 * n_in)), y(3 * 4), dx(static_cast<size_t>(3 * n_in)), dy(3 * 4);
  EXPECT_SHAPE_ERROR(frozen_gemm(f, std::span<float>(y).first(4), w, std::span<const float>(x).first(n_in), 1, 4, n_in),
                     name() + "_gemv" + why);
  EXPECT_SHAPE_ERROR(frozen_gemm(f, y, w, x, 3, 4, n_in), name() + "_gemm" + why);
  EXPECT_SHAPE_ERROR(frozen_dx(f, dx, w, dy, 3, 4, n_in, 0, 4, false), name() + "_dx" + why);
}

TEST_P(FrozenLinear, RejectsAWeightSpanOfTheWrongSizeNamingBothSizes) {
  const Format f = format();
  const int64_t n_in = width(), want = 4 * row_bytes(f, n_in);
  std::vector<uint8_t> w(size_t(want - 1));
  std::vector<float> x(static_cast<size_t>(n_in)), y(4), X(static_cast<size_t>(3 * n_in)), Y(3 * 4), dY(3 * 4);
  const std::string why = "w has " + std::to_string(want - 1) + " bytes, expected " + std::to_string(want);
  EXPECT_SHAPE_ERROR(frozen_gemm(f, y, w, x, 1, 4, n_in), name() + "_gemv: " + why);
  EXPECT_SHAPE_ERROR(frozen_gemm(f, Y, w, X, 3, 4, n_in), name() + "_gemm: " + why);
  EXPECT_SHAPE_ERROR(frozen_dx(f, X, w, dY, 3, 4, n_in, 0, 4, false), name() + "_dx: " + why);
}

TEST_P(FrozenLinear, RejectsActivationSpansOfTheWrongSize) {
  const Format f = format();
  const int64_t n_in = width();
  const std::string ni = std::to_string(n_in), ti = std::to_string(3 * n_in);
  std::vector<uint8_t> w(size_t(4 * row_bytes(f, n_in)));
  std::vector<float> x(static_cast<size_t>(n_in)), y(4), X(static_cast<size_t>(3 * n_in)), Y(3 * 4), dY(3 * 4),
      small(2);
  EXPECT_SHAPE_ERROR(frozen_gemm(f, small, w, x, 1, 4, n_in), name() + "_gemv: y has 2 floats, expected 4");
  EXPECT_SHAPE_ERROR(frozen_gemm(f, y, w, small, 1, 4, n_in), name() + "_gemv: x has 2 floats, expected " + ni);
  EXPECT_SHAPE_ERROR(frozen_gemm(f, small, w, X, 3, 4, n_in), name() + "_gemm: Y has 2 floats, expected 12");
  EXPECT_SHAPE_ERROR(frozen_gemm(f, Y, w, small, 3, 4, n_in), name() + "_gemm: X has 2 floats, expected " + ti);
  EXPECT_SHAPE_ERROR(frozen_dx(f, small, w, dY, 3, 4, n_in, 0, 4, false), name() + "_dx: dX has 2 floats, expected " + ti);
  EXPECT_SHAPE_ERROR(frozen_dx(f, X, w, small, 3, 4, n_in, 0, 4, false), name() + "_dx: dY has 2 floats, expected 12");
}

TEST_P(FrozenLinear, RejectsARowRangeOutsideTheMatrixOrEmpty) {
  const Format f = format();
  const int64_t n_in = width();
  std::vector<uint8_t> w(size_t(4 * row_bytes(f, n_in)));
  std::vector<float> dX(static_cast<size_t>(n_in)), dY(4);
  EXPECT_SHAPE_ERROR(frozen_dx(f, dX, w, dY, 1, 4, n_in, 0, 5, true), "row range [0, 5)");
  EXPECT_SHAPE_ERROR(frozen_dx(f, dX, w, dY, 1, 4, n_in, -1, 2, true), "row range [-1, 2)");
  EXPECT_SHAPE_ERROR(frozen_dx(f, dX, w, dY, 1, 4, n_in, 2, 2, true), name() + "_dx: row range [2, 2) is empty or outside [0, 4)");
}

INSTANTIATE_TEST_SUITE_P(AllFormats, FrozenLinear, ::testing::ValuesIn(all_formats()),
                         [](const ::testing::TestParamInfo<Format>& info) { return std::string(format_name(info.param)); });

TEST(F32Gemm, RejectsEmptyDimsAndMismatchedSpans) {
  std::vector<float> A(6), B(12), C(8);
  EXPECT_SHAPE_ERROR(gemm_nn(C, A, B, 2, 4, 0, false), "must all be positive");
  EXPECT_SHAPE_ERROR(gemm_nt(C, A, B, 2, 4, 4, false), "A has 6 floats, expected 8");
  EXPECT_SHAPE_ERROR(gemm_tn(C, A, B, 2, 5, 3, false), "C has 8 floats, expected 10");
}

TEST(ParallelFor, CoversTheRangeOnceInChunksThatAreMultiplesOfTheGrain) {
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    for (int64_t n : {1, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 4, [&](int64_t b, int64_t e) {
        EXPECT_TRUE(b % 4 == 0 && (e % 4 == 0 || e == n)) << "[" << b << ", " << e << ")";
        for (int64_t i = b; i < e; i++) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; i++) EXPECT_EQ(hits[size_t(i)].load(), 1) << "index " << i << " of " << n;
    }
  }
  set_num_threads(0);
}

TEST(ParallelFor, NestedCallsRunInlineAndExceptionsReachTheCaller) {
  set_num_threads(2);
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    EXPECT_EQ(num_threads(), 2);  // callable from a chunk (the pool's lock is held meanwhile)
    parallel_for(100, 1, [&](int64_t ib, int64_t ie) {
      EXPECT_EQ(ib, 0);  // one inline chunk covering everything
      EXPECT_EQ(ie, 100);
      total += (e - b) * (ie - ib);
    });
  });
  EXPECT_EQ(total.load(), 800);
  EXPECT_THROW(parallel_for(8, 1,
                            [](int64_t b, int64_t) {
                              if (b > 0) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
  set_num_threads(0);
}

}  // namespace
}  // namespace q4t::cpu
