// CPU kernels of the frozen Q4_0, Q8_0, Q4_K, Q6_K and F16 linears and the LoRA f32 GEMMs against the
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
#include <vector>

#include "kernels/cpu/frozen_rows.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/q4_0_rows.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/threads.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/shapes.h"

namespace q4t::cpu {
namespace {

// Bound on ref::max_rel_error for every kernel check. f32 accumulation over these sizes (up to 4128 terms)
// lands near 1e-6; a wrong nibble, block or scale shows up as 1e-3 or more.
constexpr double kTol = 1e-5;

const int64_t kNIn[] = {32, 64, 4128};
const int64_t kNOut[] = {1, 7, 63, 65, 1000};
const int64_t kTokens[] = {1, 3, 17};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// W[n_out, n_in] quantised from N(0, 1) weights.
std::vector<uint8_t> random_q4_0(int64_t n_out, int64_t n_in, uint32_t seed) {
  std::vector<uint8_t> w(n_out * q4_0_row_bytes(n_in));
  quant::quantize_q4_0(w, random_floats(n_out * n_in, seed), n_out, n_in);
  return w;
}

std::string shape_label(int64_t T, int64_t n_out, int64_t n_in) {
  return "T=" + std::to_string(T) + " n_out=" + std::to_string(n_out) + " n_in=" + std::to_string(n_in);
}

// Each test body runs once per kernel set (portable, AVX2, AVX-512); sets this CPU lacks are skipped.
class Q4_0KernelSets : public ::testing::TestWithParam<detail::Isa> {
 protected:
  void SetUp() override {
    if (!detail::q4_0_kernels_for(GetParam())) GTEST_SKIP() << "this CPU cannot run the kernel set";
    saved_ = detail::q4_0_kernels().isa;
    detail::use_q4_0_kernels(GetParam());
    switched_ = true;
  }
  void TearDown() override {
    if (switched_) detail::use_q4_0_kernels(saved_);
  }

 private:
  detail::Isa saved_ = detail::Isa::Portable;
  bool switched_ = false;
};

TEST_P(Q4_0KernelSets, GemvAndGemmMatchTheDoubleReferenceOnAwkwardShapes) {
  for (int64_t n_in : kNIn)
    for (int64_t n_out : kNOut) {
      const std::vector<uint8_t> w = random_q4_0(n_out, n_in, uint32_t(n_out * 7 + n_in));
      for (int64_t T : kTokens) {
        const std::vector<float> X = random_floats(T * n_in, uint32_t(T));
        const std::vector<double> want = ref::q4_0_gemm(w.data(), X.data(), T, n_out, n_in);
        std::vector<float> Y(T * n_out, NAN);
        q4_0_gemm(Y, w, X, T, n_out, n_in);
        EXPECT_LE(ref::max_rel_error(Y.data(), want), kTol) << "gemm " << shape_label(T, n_out, n_in);
        if (T == 1) {
          std::vector<float> y(n_out, NAN);
          q4_0_gemv(y, w, X, n_out, n_in);
          EXPECT_LE(ref::max_rel_error(y.data(), want), kTol) << "gemv " << shape_label(T, n_out, n_in);
        }
      }
    }
}

TEST_P(Q4_0KernelSets, DxMatchesTheReferenceOverwritingAndAccumulating) {
  for (int64_t n_in : kNIn)
    for (int64_t n_out : kNOut) {
      const std::vector<uint8_t> w = random_q4_0(n_out, n_in, uint32_t(n_out * 5 + n_in));
      for (int64_t T : kTokens) {
        const std::vector<float> dY = random_floats(T * n_out, uint32_t(T + 10));
        const std::vector<float> dX_in = random_floats(T * n_in, uint32_t(T + 20));
        std::vector<float> dX(T * n_in, NAN);
        q4_0_dx(dX, w, dY, T, n_out, n_in, 0, n_out, false);
        EXPECT_LE(
            ref::max_rel_error(dX.data(), ref::q4_0_dx(w.data(), dY.data(), nullptr, T, n_out, n_in, 0, n_out)),
            kTol)
            << "overwrite " << shape_label(T, n_out, n_in);
        // A row range that starts and ends inside the matrix, added onto existing values.
        const int64_t j0 = n_out / 3, j1 = n_out - n_out / 4;
        dX = dX_in;
        q4_0_dx(dX, w, dY, T, n_out, n_in, j0, j1, true);
        EXPECT_LE(ref::max_rel_error(dX.data(),
                                     ref::q4_0_dx(w.data(), dY.data(), dX_in.data(), T, n_out, n_in, j0, j1)),
                  kTol)
            << "accumulate rows [" << j0 << ", " << j1 << ") " << shape_label(T, n_out, n_in);
      }
    }
}

// The vocab-tiled backward: the first tile overwrites, later tiles add, and the sum equals one untiled call.
TEST_P(Q4_0KernelSets, DxTilesAccumulatedInTurnEqualTheUntiledResult) {
  struct Case {
    int64_t n_out, n_in, tile;
  };
  for (Case c : {Case{1000, 4128, 300}, Case{7, 64, 5}, Case{65, 32, 64}})
    for (int64_t T : {int64_t(1), int64_t(17)}) {
      const std::vector<uint8_t> w = random_q4_0(c.n_out, c.n_in, uint32_t(c.tile));
      const std::vector<float> dY = random_floats(T * c.n_out, uint32_t(T + 30));
      std::vector<float> untiled(T * c.n_in, NAN), tiled(T * c.n_in, NAN);
      q4_0_dx(untiled, w, dY, T, c.n_out, c.n_in, 0, c.n_out, false);
      for (int64_t j0 = 0; j0 < c.n_out; j0 += c.tile)
        q4_0_dx(tiled, w, dY, T, c.n_out, c.n_in, j0, std::min(j0 + c.tile, c.n_out), j0 > 0);
      const std::vector<double> want =
          ref::q4_0_dx(w.data(), dY.data(), nullptr, T, c.n_out, c.n_in, 0, c.n_out);
      const std::string label = shape_label(T, c.n_out, c.n_in) + " tile=" + std::to_string(c.tile);
      EXPECT_LE(ref::max_rel_error(tiled.data(), want), kTol) << label;
      EXPECT_LE(ref::max_rel_error(untiled.data(), want), kTol) << label;
      const std::vector<double> untiled_d(untiled.begin(), untiled.end());
      EXPECT_LE(ref::max_rel_error(tiled.data(), untiled_d), 1e-6) << label;
    }
}

// Threads split rows (GEMV, GEMM) or columns (dx). The single-token kernels keep every element's arithmetic
// order whatever the split, so they must be bit-identical; the portable set's Eigen tiles may re-block their
// sums, so the multi-token results are held to the reference bound instead.
TEST_P(Q4_0KernelSets, ThreadCountDoesNotChangeTheResults) {
  const int64_t n_out = 1000, n_in = 4128, T = 17;
  const std::vector<uint8_t> w = random_q4_0(n_out, n_in, 99);
  const std::vector<float> X = random_floats(T * n_in, 98), dY = random_floats(T * n_out, 97);
  std::vector<std::vector<float>> y(2, std::vector<float>(n_out)), Y(2, std::vector<float>(T * n_out)),
      dX(2, std::vector<float>(T * n_in)), dx1(2, std::vector<float>(n_in));
  const int thread_counts[2] = {1, 3};
  for (int i = 0; i < 2; i++) {
    set_num_threads(thread_counts[i]);
    q4_0_gemv(y[i], w, std::span<const float>(X).first(n_in), n_out, n_in);
    q4_0_gemm(Y[i], w, X, T, n_out, n_in);
    q4_0_dx(dX[i], w, dY, T, n_out, n_in, 0, n_out, false);
    q4_0_dx(dx1[i], w, std::span<const float>(dY).first(n_out), 1, n_out, n_in, 0, n_out, false);
  }
  set_num_threads(0);
  EXPECT_EQ(y[0], y[1]);
  EXPECT_EQ(dx1[0], dx1[1]);
  const std::vector<double> want_Y = ref::q4_0_gemm(w.data(), X.data(), T, n_out, n_in);
  const std::vector<double> want_dX = ref::q4_0_dx(w.data(), dY.data(), nullptr, T, n_out, n_in, 0, n_out);
  for (int i = 0; i < 2; i++) {
    EXPECT_LE(ref::max_rel_error(Y[i].data(), want_Y), kTol) << thread_counts[i] << " threads";
    EXPECT_LE(ref::max_rel_error(dX[i].data(), want_dX), kTol) << thread_counts[i] << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(AllKernelSets, Q4_0KernelSets,
                         ::testing::Values(detail::Isa::Portable, detail::Isa::Avx2, detail::Isa::Avx512),
                         [](const ::testing::TestParamInfo<detail::Isa>& info) {
                           switch (info.param) {
                             case detail::Isa::Portable: return std::string("portable");
                             case detail::Isa::Avx2: return std::string("avx2");
                             case detail::Isa::Avx512: return std::string("avx512");
                           }
                           return std::string("unknown");
                         });

// --- Q8_0, Q4_K, Q6_K and F16: the same checks, once per format ---------------------------------------------

std::vector<uint8_t> random_q8_0(int64_t n_out, int64_t n_in, uint32_t seed) {
  std::vector<uint8_t> w(n_out * q8_0_row_bytes(n_in));
  quant::quantize_q8_0(w, random_floats(n_out * n_in, seed), n_out, n_in);
  return w;
}

std::vector<uint8_t> random_f16(int64_t n_out, int64_t n_in, uint32_t seed) {
  std::vector<uint8_t> w(n_out * f16_row_bytes(n_in));
  quant::f32_row_to_f16(w.data(), random_floats(n_out * n_in, seed).data(), n_out * n_in);
  return w;
}

// The K-quant quantizers search scales per sub-block, which is slow enough to matter when every kernel set
// re-makes the same matrices, so each (format, shape, seed) is quantized once per run.
template <void (*Quantize)(std::span<uint8_t>, std::span<const float>, int64_t, int64_t),
          int64_t (*RowBytes)(int64_t)>
std::vector<uint8_t> random_k_quant(int64_t n_out, int64_t n_in, uint32_t seed) {
  static std::map<std::array<int64_t, 3>, std::vector<uint8_t>> made;
  std::vector<uint8_t>& w = made[{n_out, n_in, int64_t(seed)}];
  if (w.empty()) {
    w.resize(size_t(n_out * RowBytes(n_in)));
    Quantize(w, random_floats(n_out * n_in, seed), n_out, n_in);
  }
  return w;
}
const auto random_q4_k = random_k_quant<quant::quantize_q4_k, q4_k_row_bytes>;
const auto random_q6_k = random_k_quant<quant::quantize_q6_k, q6_k_row_bytes>;

// A frozen weight format as these tests see it: how to make W, its kernels, its references, and the shapes
// worth testing. F16 takes any n_in, so odd widths and widths below one SIMD vector are included. The K-quants
// take multiples of 256 (one and several super-blocks, and 9 of them so that threads split an odd count); their
// token counts straddle the driver's thresholds (4: panel dx; 12: panel GEMM) and 257 output rows straddle its
// 256-row depth.
struct FrozenFormat {
  const char* name;
  std::vector<uint8_t> (*make)(int64_t, int64_t, uint32_t);
  decltype(&q8_0_gemv) gemv;
  decltype(&q8_0_gemm) gemm;
  decltype(&q8_0_dx) dx;
  decltype(&ref::q8_0_gemm) ref_gemm;
  decltype(&ref::q8_0_dx) ref_dx;
  std::vector<int64_t> n_ins, n_outs, tokens;
};

const std::vector<int64_t> kNOuts(std::begin(kNOut), std::end(kNOut));
const std::vector<int64_t> kTokenCounts(std::begin(kTokens), std::end(kTokens));
const std::vector<int64_t> kKNIns = {256, 512, 768, 2304}, kKNOuts = {1, 3, 37, 257},
                           kKTokens = {1, 3, 4, 12, 17, 40};

const FrozenFormat kFrozenFormats[] = {
    {"q8_0", random_q8_0, q8_0_gemv, q8_0_gemm, q8_0_dx, ref::q8_0_gemm, ref::q8_0_dx, {32, 64, 4128}, kNOuts,
     kTokenCounts},
    {"f16", random_f16, f16_gemv, f16_gemm, f16_dx, ref::f16_gemm, ref::f16_dx, {32, 64, 4128, 7, 33, 4133}, kNOuts,
     kTokenCounts},
    {"q4_k", random_q4_k, q4_k_gemv, q4_k_gemm, q4_k_dx, ref::q4_k_gemm, ref::q4_k_dx, kKNIns, kKNOuts, kKTokens},
    {"q6_k", random_q6_k, q6_k_gemv, q6_k_gemm, q6_k_dx, ref::q6_k_gemm, ref::q6_k_dx, kKNIns, kKNOuts, kKTokens},
};

// The Q4_0 fixture's kernel sets also pick the Q8_0, Q4_K, Q6_K and F16 loops (kernels/cpu/frozen_rows.h).
class FrozenKernelSets : public Q4_0KernelSets {};

// The bound of the brief, 1e-4, rather than kTol: with n_out = 1 the norm-wise error is that of one dot product,
// and an unlucky one cancels (F16 at n_in = 4133: a sum of 0.36 from terms of total size ~2600, off by 8e-6 =
// 2.3e-5 relative). A wrong block, scale or tail still shows up as 1e-3 or more.
constexpr double kFrozenTol = 1e-4;

TEST_P(FrozenKernelSets, GemvAndGemmMatchTheDoubleReferenceOnAwkwardShapes) {
  for (const FrozenFormat& f : kFrozenFormats)
    for (int64_t n_in : f.n_ins)
      for (int64_t n_out : f.n_outs) {
        const std::vector<uint8_t> w = f.make(n_out, n_in, uint32_t(n_out * 7 + n_in));
        for (int64_t T : f.tokens) {
          const std::vector<float> X = random_floats(T * n_in, uint32_t(T));
          const std::vector<double> want = f.ref_gemm(w.data(), X.data(), T, n_out, n_in);
          std::vector<float> Y(T * n_out, NAN);
          f.gemm(Y, w, X, T, n_out, n_in);
          EXPECT_LE(ref::max_rel_error(Y.data(), want), kFrozenTol)
              << f.name << " gemm " << shape_label(T, n_out, n_in);
          if (T == 1) {
            std::vector<float> y(n_out, NAN);
            f.gemv(y, w, X, n_out, n_in);
            EXPECT_LE(ref::max_rel_error(y.data(), want), kFrozenTol)
                << f.name << " gemv " << shape_label(T, n_out, n_in);
          }
        }
      }
}

TEST_P(FrozenKernelSets, DxMatchesTheReferenceOverwritingAndAccumulating) {
  for (const FrozenFormat& f : kFrozenFormats)
    for (int64_t n_in : f.n_ins)
      for (int64_t n_out : f.n_outs) {
        const std::vector<uint8_t> w = f.make(n_out, n_in, uint32_t(n_out * 5 + n_in));
        for (int64_t T : f.tokens) {
          const std::vector<float> dY = random_floats(T * n_out, uint32_t(T + 10));
          const std::vector<float> dX_in = random_floats(T * n_in, uint32_t(T + 20));
          const std::string label = std::string(f.name) + " " + shape_label(T, n_out, n_in);
          std::vector<float> dX(T * n_in, NAN);
          f.dx(dX, w, dY, T, n_out, n_in, 0, n_out, false);
          EXPECT_LE(ref::max_rel_error(dX.data(), f.ref_dx(w.data(), dY.data(), nullptr, T, n_out, n_in, 0, n_out)),
                    kFrozenTol)
              << "overwrite " << label;
          const int64_t j0 = n_out / 3, j1 = n_out - n_out / 4;
          dX = dX_in;
          f.dx(dX, w, dY, T, n_out, n_in, j0, j1, true);
          EXPECT_LE(
              ref::max_rel_error(dX.data(), f.ref_dx(w.data(), dY.data(), dX_in.data(), T, n_out, n_in, j0, j1)),
              kFrozenTol)
              << "accumulate rows [" << j0 << ", " << j1 << ") " << label;
        }
      }
}

TEST_P(FrozenKernelSets, DxTilesAccumulatedInTurnEqualTheUntiledResult) {
  struct Case {
    int64_t n_out, n_in, tile;
  };
  // Widths from the format's list: the widest, the second and the narrowest.
  for (const FrozenFormat& f : kFrozenFormats)
    for (Case c : {Case{1000, f.n_ins.back(), 300}, Case{7, f.n_ins[1], 5}, Case{65, f.n_ins[0], 64}})
      for (int64_t T : {int64_t(1), int64_t(17)}) {
        const std::vector<uint8_t> w = f.make(c.n_out, c.n_in, uint32_t(c.tile));
        const std::vector<float> dY = random_floats(T * c.n_out, uint32_t(T + 30));
        std::vector<float> untiled(T * c.n_in, NAN), tiled(T * c.n_in, NAN);
        f.dx(untiled, w, dY, T, c.n_out, c.n_in, 0, c.n_out, false);
        for (int64_t j0 = 0; j0 < c.n_out; j0 += c.tile)
          f.dx(tiled, w, dY, T, c.n_out, c.n_in, j0, std::min(j0 + c.tile, c.n_out), j0 > 0);
        const std::vector<double> want = f.ref_dx(w.data(), dY.data(), nullptr, T, c.n_out, c.n_in, 0, c.n_out);
        const std::string label =
            std::string(f.name) + " " + shape_label(T, c.n_out, c.n_in) + " tile=" + std::to_string(c.tile);
        EXPECT_LE(ref::max_rel_error(tiled.data(), want), kFrozenTol) << label;
        EXPECT_LE(ref::max_rel_error(untiled.data(), want), kFrozenTol) << label;
      }
}

// As for Q4_0: the one-token kernels are bit-identical for any split; the multi-token ones meet the bound.
TEST_P(FrozenKernelSets, ThreadCountDoesNotChangeTheResults) {
  for (const FrozenFormat& f : kFrozenFormats) {
    const int64_t n_out = 1000, n_in = f.n_ins.back(), T = 17;
    const std::vector<uint8_t> w = f.make(n_out, n_in, 99);
    const std::vector<float> X = random_floats(T * n_in, 98), dY = random_floats(T * n_out, 97);
    std::vector<std::vector<float>> y(2, std::vector<float>(n_out)), Y(2, std::vector<float>(T * n_out)),
        dX(2, std::vector<float>(T * n_in)), dx1(2, std::vector<float>(n_in));
    const int thread_counts[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
      set_num_threads(thread_counts[i]);
      f.gemv(y[i], w, std::span<const float>(X).first(n_in), n_out, n_in);
      f.gemm(Y[i], w, X, T, n_out, n_in);
      f.dx(dX[i], w, dY, T, n_out, n_in, 0, n_out, false);
      f.dx(dx1[i], w, std::span<const float>(dY).first(n_out), 1, n_out, n_in, 0, n_out, false);
    }
    set_num_threads(0);
    EXPECT_EQ(y[0], y[1]) << f.name;
    EXPECT_EQ(dx1[0], dx1[1]) << f.name;
    const std::vector<double> want_Y = f.ref_gemm(w.data(), X.data(), T, n_out, n_in);
    const std::vector<double> want_dX = f.ref_dx(w.data(), dY.data(), nullptr, T, n_out, n_in, 0, n_out);
    for (int i = 0; i < 2; i++) {
      const std::string label = std::string(f.name) + " " + std::to_string(thread_counts[i]) + " threads";
      EXPECT_LE(ref::max_rel_error(Y[i].data(), want_Y), kFrozenTol) << label;
      EXPECT_LE(ref::max_rel_error(dX[i].data(), want_dX), kFrozenTol) << label;
    }
  }
}

// The K-quant row loops decode exactly as the codec's float dequantisation (GGML's), from bytes at any alignment.
// The last block's d and dmin are far apart, so that d·sc·q − dmin·m rounds in f32 and the order of the
// operations shows.
template <typename Block, void (*Dequantize)(float*, const Block*, int64_t)>
void expect_decode_matches_codec(const detail::FrozenRowKernels& k, const std::vector<uint8_t>& row,
                                 int64_t n) {
  std::vector<Block> blocks(size_t(n / kQK_KBlockElems));
  std::memcpy(blocks.data(), row.data(), row.size());
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n) + 1, NAN);
  Dequantize(want.data(), blocks.data(), n);
  std::vector<uint8_t> shifted(row.size() + 1);  // an odd address
  std::memcpy(shifted.data() + 1, row.data(), row.size());
  k.decode(got.data() + 1, shifted.data() + 1, n);
  for (int64_t i = 0; i < n; i++)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(i) + 1]), std::bit_cast<uint32_t>(want[size_t(i)]))
        << k.name << " weight " << i << ": " << got[size_t(i) + 1] << " != " << want[size_t(i)];
}

TEST_P(FrozenKernelSets, KQuantDecodeEqualsTheCodecBitForBit) {
  const int64_t n = 4 * kQK_KBlockElems;
  std::vector<uint8_t> q4 = random_q4_k(1, n, 11), q6 = random_q6_k(1, n, 12);
  const uint16_t d = quant::f32_to_f16(1000.0f), dmin = quant::f32_to_f16(3e-3f);
  std::memcpy(q4.data() + 3 * kQ4_KBlockBytes, &d, 2);
  std::memcpy(q4.data() + 3 * kQ4_KBlockBytes + 2, &dmin, 2);
  expect_decode_matches_codec<quant::BlockQ4_K, quant::dequantize_row_q4_k>(detail::q4_k_row_kernels(), q4, n);
  expect_decode_matches_codec<quant::BlockQ6_K, quant::dequantize_row_q6_k>(detail::q6_k_row_kernels(), q6, n);
}

std::string isa_name(const ::testing::TestParamInfo<detail::Isa>& info) {
  switch (info.param) {
    case detail::Isa::Portable: return "portable";
    case detail::Isa::Avx2: return "avx2";
    case detail::Isa::Avx512: return "avx512";
  }
  return "unknown";
}

INSTANTIATE_TEST_SUITE_P(AllKernelSets, FrozenKernelSets,
                         ::testing::Values(detail::Isa::Portable, detail::Isa::Avx2, detail::Isa::Avx512), isa_name);

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
      const std::vector<float> A = random_floats(M * K, uint32_t(M + 3 * K)),
                               B = random_floats(K * N, uint32_t(N + 5 * K));
      const std::vector<float> C_in = random_floats(M * N, uint32_t(M * N));
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

std::string shape_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "(no ShapeError thrown)";
}

#define EXPECT_SHAPE_ERROR(call, text)                                    \
  do {                                                                    \
    const std::string msg_ = shape_error([&] { call; });                  \
    EXPECT_NE(msg_.find(text), std::string::npos) << "message: " << msg_; \
  } while (0)

TEST(Q4_0Linear, RejectsAnInputWidthThatIsNotAMultipleOf32) {
  std::vector<uint8_t> w(4 * 27);
  std::vector<float> x(48), y(4), dx(48), dy(4);
  EXPECT_SHAPE_ERROR(q4_0_gemv(y, w, x, 4, 48), "multiple of 32");
  EXPECT_SHAPE_ERROR(q4_0_gemm(y, w, x, 1, 4, 48), "multiple of 32");
  EXPECT_SHAPE_ERROR(q4_0_dx(dx, w, dy, 1, 4, 48, 0, 4, false), "multiple of 32");
}

TEST(Q4_0Linear, RejectsAWeightSpanOfTheWrongSizeNamingBothSizes) {
  std::vector<uint8_t> w(4 * 36 - 1);
  std::vector<float> x(64), y(4), X(3 * 64), Y(3 * 4), dY(3 * 4);
  EXPECT_SHAPE_ERROR(q4_0_gemv(y, w, x, 4, 64), "w has 143 bytes, expected 144");
  EXPECT_SHAPE_ERROR(q4_0_gemm(Y, w, X, 3, 4, 64), "w has 143 bytes, expected 144");
  EXPECT_SHAPE_ERROR(q4_0_dx(X, w, dY, 3, 4, 64, 0, 4, false), "w has 143 bytes, expected 144");
}

TEST(Q4_0Linear, RejectsActivationSpansOfTheWrongSize) {
  std::vector<uint8_t> w(4 * 36);
  std::vector<float> x(64), y(4), X(3 * 64), Y(3 * 4), dY(3 * 4), small(5);
  EXPECT_SHAPE_ERROR(q4_0_gemv(small, w, x, 4, 64), "y has 5 floats, expected 4");
  EXPECT_SHAPE_ERROR(q4_0_gemv(y, w, small, 4, 64), "x has 5 floats, expected 64");
  EXPECT_SHAPE_ERROR(q4_0_gemm(small, w, X, 3, 4, 64), "Y has 5 floats, expected 12");
  EXPECT_SHAPE_ERROR(q4_0_gemm(Y, w, small, 3, 4, 64), "X has 5 floats, expected 192");
  EXPECT_SHAPE_ERROR(q4_0_dx(small, w, dY, 3, 4, 64, 0, 4, false), "dX has 5 floats, expected 192");
  EXPECT_SHAPE_ERROR(q4_0_dx(X, w, small, 3, 4, 64, 0, 4, false), "dY has 5 floats, expected 12");
}

TEST(Q4_0Linear, RejectsARowRangeOutsideTheMatrixOrEmpty) {
  std::vector<uint8_t> w(4 * 36);
  std::vector<float> dX(64), dY(4);
  EXPECT_SHAPE_ERROR(q4_0_dx(dX, w, dY, 1, 4, 64, 0, 5, true), "row range [0, 5)");
  EXPECT_SHAPE_ERROR(q4_0_dx(dX, w, dY, 1, 4, 64, -1, 2, true), "row range [-1, 2)");
  EXPECT_SHAPE_ERROR(q4_0_dx(dX, w, dY, 1, 4, 64, 2, 2, true), "is empty or outside [0, 4)");
}

TEST(Q8_0Linear, RejectsBadWidthsSpansAndRowRangesNamingTheSizes) {
  std::vector<uint8_t> w(4 * 68);
  std::vector<float> x(64), y(4), X(3 * 64), dY(3 * 4), small(5);
  EXPECT_SHAPE_ERROR(q8_0_gemv(y, w, std::span<const float>(x).first(48), 4, 48),
                     "n_in = 48 is not a multiple of 32 (the Q8_0 block size)");
  EXPECT_SHAPE_ERROR(q8_0_gemm(y, std::span<const uint8_t>(w).first(271), x, 1, 4, 64),
                     "w has 271 bytes, expected 272");
  EXPECT_SHAPE_ERROR(q8_0_gemv(small, w, x, 4, 64), "y has 5 floats, expected 4");
  EXPECT_SHAPE_ERROR(q8_0_dx(X, w, small, 3, 4, 64, 0, 4, false), "dY has 5 floats, expected 12");
  EXPECT_SHAPE_ERROR(q8_0_dx(X, w, dY, 3, 4, 64, 3, 3, true), "row range [3, 3)");
}

TEST(KQuantLinear, RejectsWidthsThatAreNotAMultipleOf256AndSpansOfTheWrongSize) {
  std::vector<uint8_t> w4(2 * 144), w6(2 * 210);
  std::vector<float> x(256), y(2), dX(256), small(5);
  const std::span<const float> x32 = std::span<const float>(x).first(32);
  EXPECT_SHAPE_ERROR(q4_k_gemv(y, w4, x32, 2, 32),
                     "q4_k_gemv: n_in = 32 is not a multiple of 256 (the Q4_K block size)");
  EXPECT_SHAPE_ERROR(q6_k_gemm(y, w6, x32, 1, 2, 32),
                     "q6_k_gemm: n_in = 32 is not a multiple of 256 (the Q6_K block size)");
  EXPECT_SHAPE_ERROR(q4_k_dx(std::span<float>(dX).first(32), w4, y, 1, 2, 32, 0, 2, false),
                     "q4_k_dx: n_in = 32 is not a multiple of 256");
  EXPECT_SHAPE_ERROR(q4_k_gemm(y, std::span<const uint8_t>(w4).first(287), x, 1, 2, 256),
                     "w has 287 bytes, expected 288");
  EXPECT_SHAPE_ERROR(q6_k_gemv(y, std::span<const uint8_t>(w6).first(419), x, 2, 256), "w has 419 bytes, expected 420");
  EXPECT_SHAPE_ERROR(q6_k_gemv(small, w6, x, 2, 256), "y has 5 floats, expected 2");
  EXPECT_SHAPE_ERROR(q4_k_dx(dX, w4, small, 1, 2, 256, 0, 2, false), "dY has 5 floats, expected 2");
  EXPECT_SHAPE_ERROR(q6_k_dx(dX, w6, y, 1, 2, 256, 1, 3, true), "row range [1, 3)");
}

TEST(F16Linear, AcceptsAnyWidthAndRejectsSpansOfTheWrongSize) {
  std::vector<uint8_t> w(3 * 2 * 5);
  std::vector<float> x(5), y(3), dx(5), small(2);
  EXPECT_NO_THROW(f16_gemv(y, w, x, 3, 5));
  EXPECT_SHAPE_ERROR(f16_gemm(y, std::span<const uint8_t>(w).first(29), x, 1, 3, 5), "w has 29 bytes, expected 30");
  EXPECT_SHAPE_ERROR(f16_gemv(y, w, small, 3, 5), "x has 2 floats, expected 5");
  EXPECT_SHAPE_ERROR(f16_dx(small, w, y, 1, 3, 5, 0, 3, false), "dX has 2 floats, expected 5");
  EXPECT_SHAPE_ERROR(f16_dx(dx, w, y, 1, 3, 5, 0, 4, false), "row range [0, 4)");
  EXPECT_SHAPE_ERROR(f16_gemv(y, w, x, 3, 0), "n_in = 0 must be positive");
}

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
