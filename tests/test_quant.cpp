// Block codecs: software f16 against the F16C instructions; Q4_0, Q8_0, Q4_K and Q6_K against hand-computed GGML
// blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "kernels/formats.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/random_inputs.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace q4t::quant {
namespace {

constexpr auto& shape_error = test::error_of<ShapeError>;

// x quantized into whole blocks of format f (Block: its struct) and dequantised again in float.
template <typename Block>
std::pair<std::vector<Block>, std::vector<float>> round_trip(Format f, const std::vector<float>& x) {
  const FormatTraits& t = format_traits(f);
  std::vector<Block> blocks(x.size() / size_t(t.block_elems));
  std::vector<float> y(x.size());
  t.quantize_row(reinterpret_cast<uint8_t*>(blocks.data()), x.data(), int64_t(x.size()));
  t.dequantize_row(y.data(), reinterpret_cast<const uint8_t*>(blocks.data()), int64_t(x.size()));
  return {std::move(blocks), std::move(y)};
}

// Whole blocks of format f dequantised in float and in double.
template <typename Block>
std::pair<std::vector<float>, std::vector<double>> dequantise_both_ways(Format f, const std::vector<Block>& blocks) {
  const FormatTraits& t = format_traits(f);
  const int64_t n = int64_t(blocks.size()) * t.block_elems;
  std::vector<float> yf(static_cast<size_t>(n));
  std::vector<double> yd(static_cast<size_t>(n));
  t.dequantize_row(yf.data(), reinterpret_cast<const uint8_t*>(blocks.data()), n);
  t.dequantize_row_f64(yd.data(), reinterpret_cast<const uint8_t*>(blocks.data()), n);
  return {std::move(yf), std::move(yd)};
}

// 64 blocks of N(0, 3) weights in format f: the double dequantisation of weight j of a block is exactly
// level(block, j)·d, and the float one is that same value.
template <typename Block, typename Level>
void expect_level_times_scale(Format f, uint32_t seed, Level level) {
  const auto [blocks, yf] = round_trip<Block>(f, normal_floats(32 * 64, seed, 3.0f));
  const std::vector<double> yd = dequantise_both_ways(f, blocks).second;
  for (size_t i = 0; i < yd.size(); i++) {
    EXPECT_EQ(yd[i], double(level(blocks[i / 32], int(i % 32))) * double(f16_to_f32(blocks[i / 32].d))) << i;
    EXPECT_EQ(double(yf[i]), yd[i]) << i;
  }
}

// quantize_matrix of W [n_out, n_in] in format f writes each row's blocks right after the previous row's.
void expect_rows_back_to_back(Format f, const std::vector<float>& w, int64_t n_out, int64_t n_in) {
  const FormatTraits& t = format_traits(f);
  const std::vector<uint8_t> out = quantize_matrix(f, w, n_out, n_in);
  const size_t row = size_t(row_bytes(f, n_in));
  ASSERT_EQ(out.size(), size_t(n_out) * row) << t.name;
  for (int64_t r = 0; r < n_out; r++) {
    std::vector<uint8_t> alone(row);
    t.quantize_row(alone.data(), w.data() + r * n_in, n_in);
    EXPECT_EQ(std::memcmp(out.data() + size_t(r) * row, alone.data(), row), 0) << t.name << " row " << r;
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The hardware conversions GGML uses on x86 (GGML_FP16_TO_FP32 / GGML_FP32_TO_FP16 with F16C).
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) { return _cvtss_sh(f, 0); }

bool cpu_has_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
}
#else
float hw_f16_to_f32(uint16_t) { return 0.0f; }
uint16_t hw_f32_to_f16(float) { return 0; }
bool cpu_has_f16c() { return false; }
#endif

TEST(F16, KnownValuesConvertBothWays) {
  const std::array<std::pair<uint16_t, float>, 9> known = {{{0x0000, 0.0f},
                                                            {0x8000, -0.0f},
                                                            {0x3C00, 1.0f},
                                                            {0xC000, -2.0f},
                                                            {0x7BFF, 65504.0f},
                                                            {0x0400, 0x1p-14f},
                                                            {0x0001, 0x1p-24f},
                                                            {0x03FF, 1023 * 0x1p-24f},
                                                            {0x7C00, INFINITY}}};
  for (auto [h, f] : known) {
    EXPECT_EQ(std::bit_cast<uint32_t>(f16_to_f32(h)), std::bit_cast<uint32_t>(f)) << "half 0x" << std::hex << h;
    EXPECT_EQ(f32_to_f16(f), h) << "float " << f;
  }
}

TEST(F16, RoundsToNearestEvenAtTheEdges) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);      // halfway, even neighbour below
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);  // halfway, even neighbour above
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);             // below the overflow midpoint
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);             // the midpoint rounds to even: inf
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);             // half the smallest subnormal: to even (0)
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);  // 1.5 subnormal units: to even (2)
  EXPECT_EQ(f32_to_f16(-1e-10f), 0x8000);       // underflow keeps the sign
}

TEST(F16, EveryHalfConvertsToFloatExactlyAsF16CDoes) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "CPU has no F16C";
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    const uint32_t got = std::bit_cast<uint32_t>(f16_to_f32(uint16_t(h)));
    const uint32_t want = std::bit_cast<uint32_t>(hw_f16_to_f32(uint16_t(h)));
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "half 0x" << h << ": 0x" << got << " != 0x" << want;
  }
  EXPECT_EQ(mismatches, 0);
}

// Every half value and the floats either side of every rounding midpoint, all sign/zero/inf/NaN edge
// cases, and two million random bit patterns.
std::vector<uint32_t> float_edge_and_random_bits() {
  std::vector<uint32_t> v;
  for (uint32_t h = 0; h < 0x7C00; h++) {
    const uint32_t f = std::bit_cast<uint32_t>(f16_to_f32(uint16_t(h)));
    const uint32_t mid = std::bit_cast<uint32_t>((f16_to_f32(uint16_t(h)) + f16_to_f32(uint16_t(h + 1))) / 2);
    for (uint32_t b : {f, f + 1, f - 1, mid, mid - 1, mid + 1}) {
      v.push_back(b);
      v.push_back(b | 0x80000000u);
    }
  }
  for (uint32_t b : {0x00000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x7F800000u, 0x7F800001u,
                     0x7FC00000u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0x7FA00000u, 0x7F802000u}) {
    v.push_back(b);
    v.push_back(b | 0x80000000u);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; i++) v.push_back(uint32_t(rng()));
  return v;
}

TEST(F16, FloatsRoundToHalfExactlyAsF16CDoes) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "CPU has no F16C";
  int mismatches = 0;
  for (uint32_t b : float_edge_and_random_bits()) {
    const uint16_t got = f32_to_f16(std::bit_cast<float>(b)), want = hw_f32_to_f16(std::bit_cast<float>(b));
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "float bits 0x" << b << ": 0x" << got << " != 0x" << want;
  }
  EXPECT_EQ(mismatches, 0);
}

std::array<uint8_t, 18> quantize_block(const std::array<float, 32>& x) {
  BlockQ4_0 block;
  quantize_row_q4_0(&block, x.data(), 32);
  std::array<uint8_t, 18> bytes;
  std::memcpy(bytes.data(), &block, sizeof block);
  return bytes;
}

using Bytes = std::array<uint8_t, 18>;

// x = 0..31: max = 31, d = -3.875 (f16 0xC3C0), q = trunc(8.5 - 8j/31): j = 0,1 -> 8; 2..5 -> 7; 6..9 -> 6;
// 10..13 -> 5; 14..17 -> 4; 18..21 -> 3; 22..25 -> 2; 26..29 -> 1; 30, 31 -> 0. qs[j] = q[j] | q[j+16] << 4.
TEST(Q4_0, RampBlockQuantizesToHandComputedBytes) {
  std::array<float, 32> x;
  for (int j = 0; j < 32; j++) x[j] = float(j);
  const Bytes want = {0xC0, 0xC3, 0x48, 0x48, 0x37, 0x37, 0x37, 0x37, 0x26,
                      0x26, 0x26, 0x26, 0x15, 0x15, 0x15, 0x15, 0x04, 0x04};
  EXPECT_EQ(quantize_block(x), want);
}

// x = j - 24: the largest magnitude is -24, so d = +3 (f16 0x4200) and -24 maps to q = 0; q = trunc(j/3 + 0.5),
// so the positive end (+7) only reaches q = 10, i.e. +6.
TEST(Q4_0, BlockWithNegativeMaxQuantizesToHandComputedBytes) {
  std::array<float, 32> x;
  for (int j = 0; j < 32; j++) x[j] = float(j - 24);
  const Bytes want = {0x00, 0x42, 0x50, 0x60, 0x61, 0x61, 0x71, 0x72, 0x72,
                      0x82, 0x83, 0x83, 0x93, 0x94, 0x94, 0xA4, 0xA5, 0xA5};
  EXPECT_EQ(quantize_block(x), want);
}

// max = 0 gives d = 0 / -8 = -0.0 (f16 0x8000, as GGML writes it), id = 0, and every q = trunc(8.5) = 8.
TEST(Q4_0, AllZeroBlockHasNegativeZeroScaleAndMidpointNibbles) {
  std::array<float, 32> x{};
  Bytes want;
  want.fill(0x88);
  want[0] = 0x00;
  want[1] = 0x80;
  EXPECT_EQ(quantize_block(x), want);
}

// +5 (j = 3) and -5 (j = 10) tie on magnitude; the first wins, so d = 5 / -8 = -0.625 (f16 0xB900) and
// id = -1.6: 1.0 -> trunc(6.9) = 6, +5 -> 0, -5 -> 16 clamped to 15, -2.5 -> 12, 0 -> 8.
TEST(Q4_0, TieOnMagnitudeKeepsTheFirstValue) {
  std::array<float, 32> x;
  x.fill(1.0f);
  x[3] = 5.0f;
  x[10] = -5.0f;
  x[20] = -2.5f;
  x[31] = 0.0f;
  const Bytes want = {0x00, 0xB9, 0x66, 0x66, 0x66, 0x60, 0xC6, 0x66, 0x66,
                      0x66, 0x66, 0x66, 0x6F, 0x66, 0x66, 0x66, 0x66, 0x86};
  EXPECT_EQ(quantize_block(x), want);
}

// With d = max / -8 in f32 and d16 its stored f16: q is x/d rounded to nearest (|x/d - (q-8)| <= 1/2) unless
// x/d > 7.5 on the side opposite the max, where q clamps at 15 (|x/d - 7| <= 1). Dequantising with d16 adds
// |q - 8|·|d - d16| <= 8|d - d16|. The 1e-6·|d| covers the f32 rounding of x·(1/d).
TEST(Q4_0, RoundTripErrorStaysWithinHalfAStepPlusScaleRounding) {
  const int64_t n = 32 * 4096;
  std::vector<float> x = normal_floats(n, 3);
  for (int64_t i = 0; i < n; i += 97) x[i] *= 50.0f;  // outliers, so some blocks have one dominant value
  const auto [blocks, y] = round_trip<BlockQ4_0>(Format::Q4_0, x);
  int clamped = 0;
  for (int64_t b = 0; b < n / 32; b++) {
    float max = 0.0f;
    for (int j = 0; j < 32; j++)
      if (std::fabs(x[b * 32 + j]) > std::fabs(max)) max = x[b * 32 + j];
    const float d = max / -8.0f, d16 = f16_to_f32(blocks[b].d);
    for (int j = 0; j < 32; j++) {
      const double xi = x[b * 32 + j];
      const bool clamps = xi / d > 7.5;
      clamped += clamps;
      const double bound =
          (clamps ? 1.0 : 0.5) * std::fabs(d) + 8 * std::fabs(double(d) - d16) + 1e-6 * std::fabs(d);
      ASSERT_LE(std::fabs(xi - y[b * 32 + j]), bound) << "block " << b << " element " << j;
    }
  }
  EXPECT_GT(clamped, 0) << "the fixture should exercise the clamp at q = 15";
}

// Weight j of a block has level q_j − 8, q_j its nibble (low nibbles first).
TEST(Q4_0, DequantisesExactlyInFloatAndDouble) {
  expect_level_times_scale<BlockQ4_0>(Format::Q4_0, 5, [](const BlockQ4_0& b, int j) {
    return (j < 16 ? b.qs[j] & 0xF : b.qs[j - 16] >> 4) - 8;
  });
}

TEST(Q4_0, MatrixQuantizerWritesRowsOfBlocksBackToBack) {
  std::vector<float> w(3 * 64);
  for (size_t i = 0; i < w.size(); i++) w[i] = std::sin(float(i));
  expect_rows_back_to_back(Format::Q4_0, w, 3, 64);
}

// The matrix quantizer and the row codecs of the two 32-weight formats name what is wrong with a size.
TEST(Q4_0AndQ8_0, QuantizersRejectBadSizesWithActionableMessages) {
  std::vector<float> w(2 * 64);
  std::vector<uint8_t> bytes(2 * 68);
  for (Format f : {Format::Q4_0, Format::Q8_0}) {
    const FormatTraits& t = format_traits(f);
    std::string msg = shape_error([&] { quantize_matrix(f, w, 2, 48); });
    EXPECT_NE(msg.find("n_in = 48 is not a multiple of 32 (the " + std::string(t.name) + " block size)"),
              std::string::npos)
        << msg;
    msg = shape_error([&] { quantize_matrix(f, std::span<const float>(w).first(100), 2, 64); });
    EXPECT_NE(msg.find("quantize: W has 100 floats, expected 128"), std::string::npos) << msg;
    msg = shape_error([&] { t.quantize_row(bytes.data(), w.data(), 40); });
    EXPECT_NE(msg.find("multiple of 32"), std::string::npos) << msg;
    msg = shape_error([&] { t.dequantize_row(w.data(), bytes.data(), 40); });
    EXPECT_NE(msg.find("multiple of 32"), std::string::npos) << msg;
  }
}

TEST(F16, RowHelpersConvertUnalignedRowsBothWays) {
  const float values[5] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 0.1f};
  std::vector<uint8_t> bytes(1 + 2 * 5);  // one byte of offset: the row starts at an odd address
  f32_row_to_f16(bytes.data() + 1, values, 5);
  for (int i = 0; i < 5; i++) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 1 + 2 * i, sizeof h);
    EXPECT_EQ(h, f32_to_f16(values[i])) << i;
  }
  float f[5];
  double d[5];
  f16_row_to_f32(f, bytes.data() + 1, 5);
  f16_row_to_f64(d, bytes.data() + 1, 5);
  for (int i = 0; i < 5; i++) {
    EXPECT_EQ(f[i], i == 4 ? f16_to_f32(0x2E66) : values[i]) << i;  // 0.1 rounds to the half 0x2E66
    EXPECT_EQ(d[i], double(f[i])) << i;
  }
}

using Q8Bytes = std::array<uint8_t, 34>;

Q8Bytes quantize_q8_block(const std::array<float, 32>& x) {
  BlockQ8_0 block;
  quantize_row_q8_0(&block, x.data(), 32);
  Q8Bytes bytes;
  std::memcpy(bytes.data(), &block, sizeof block);
  return bytes;
}

// The 34 bytes of a block: d (f16, little-endian), then each q as a two's-complement byte.
Q8Bytes q8_block_bytes(uint16_t d, const std::array<int, 32>& q) {
  Q8Bytes b;
  b[0] = uint8_t(d & 0xFF);
  b[1] = uint8_t(d >> 8);
  for (int j = 0; j < 32; j++) b[2 + j] = uint8_t(int8_t(q[j]));
  return b;
}

// amax = 127 makes d = 1 (f16 0x3C00) and 1/d = 1, so q = roundf(x): halves round away from zero (2.5 -> 3,
// -0.5 -> -1), unlike round-to-even.
TEST(Q8_0, UnitScaleBlockRoundsHalvesAwayFromZero) {
  std::array<float, 32> x{};
  const float head[8] = {127.0f, -127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 1.49f, -1.51f};
  std::copy(head, head + 8, x.begin());
  std::array<int, 32> q{};
  const int qhead[8] = {127, -127, 3, -3, 1, -1, 1, -2};
  std::copy(qhead, qhead + 8, q.begin());
  const Q8Bytes want = q8_block_bytes(0x3C00, q);
  EXPECT_EQ(want[2], 0x7F);
  EXPECT_EQ(want[3], 0x81);
  EXPECT_EQ(quantize_q8_block(x), want);
}

// x = j - 16: amax = 16, d = 16/127 = 2^-3 · 1.00787..., stored as f16 2^-3 · (1 + 8/1024) = 0x3008, and
// 1/d = 127/16 = 7.9375 exactly in f32. q = round(7.9375 (j - 16)); the multiples of 8 land on ±63.5 and go
// to ±64, e.g. j = 8 -> -64, j = 9 -> round(-55.5625) = -56, j = 25 -> round(71.4375) = 71.
TEST(Q8_0, RampBlockQuantizesToHandComputedBytes) {
  std::array<float, 32> x;
  for (int j = 0; j < 32; j++) x[j] = float(j - 16);
  const std::array<int, 32> q = {-127, -119, -111, -103, -95, -87, -79, -71, -64, -56, -48, -40, -32, -24, -16, -8,
                                 0,    8,    16,   24,   32,  40,  48,  56,  64,  71,  79,  87,  95,  103, 111, 119};
  EXPECT_EQ(quantize_q8_block(x), q8_block_bytes(0x3008, q));
}

// 32 values `all`, but `one` at index i.
template <typename T>
std::array<T, 32> all_but_one(T all, int i, T one) {
  std::array<T, 32> v;
  v.fill(all);
  v[size_t(i)] = one;
  return v;
}

// amax = |-3| = 3: d = 3/127 = 2^-6 · 1.51181 -> f16 mantissa round(0.51181 · 1024) = 524, so 0x2400 | 524 =
// 0x260C; 1/d = 42.33, so 1 -> 42 and the largest magnitude, -3, -> -127.
TEST(Q8_0, NegativeLargestValueMapsToMinus127) {
  EXPECT_EQ(quantize_q8_block(all_but_one(1.0f, 5, -3.0f)), q8_block_bytes(0x260C, all_but_one(42, 5, -127)));
}

// d = 1/127 is not a half: stored as 2^-7 · (1 + 8/1024) = 0x2008, while q uses the f32 d: 0.1 · 127 = 12.7 -> 13.
TEST(Q8_0, ScaleIsRoundedToF16OnlyForStorage) {
  EXPECT_EQ(quantize_q8_block(all_but_one(0.1f, 31, -1.0f)), q8_block_bytes(0x2008, all_but_one(13, 31, -127)));
}

// amax = 0: d = +0 (f16 0x0000), 1/d is taken as 0, every q = 0.
TEST(Q8_0, AllZeroBlockIsAllZeroBytes) {
  Q8Bytes want;
  want.fill(0);
  EXPECT_EQ(quantize_q8_block({}), want);
}

// q = round(x/d) with |x/d| <= 127, so |x - q·d| <= d/2; dequantising with the stored d16 adds
// |q|·|d - d16| <= 127|d - d16|. The 1e-6·d covers the f32 rounding of x·(1/d).
TEST(Q8_0, RoundTripErrorStaysWithinHalfAStepPlusScaleRounding) {
  const int64_t n = 32 * 4096;
  std::vector<float> x = normal_floats(n, 4);
  for (int64_t i = 0; i < n; i += 89) x[i] *= 40.0f;
  const auto [blocks, y] = round_trip<BlockQ8_0>(Format::Q8_0, x);
  for (int64_t b = 0; b < n / 32; b++) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const double d = amax / 127.0f, d16 = f16_to_f32(blocks[b].d);
    for (int j = 0; j < 32; j++) {
      const double bound = 0.5 * d + 127 * std::fabs(d - d16) + 1e-6 * d;
      ASSERT_LE(std::fabs(double(x[b * 32 + j]) - y[b * 32 + j]), bound) << "block " << b << " element " << j;
    }
  }
}

// Weight j of a block has level qs[j].
TEST(Q8_0, DequantisesExactlyInFloatAndDouble) {
  expect_level_times_scale<BlockQ8_0>(Format::Q8_0, 6, [](const BlockQ8_0& b, int j) { return int(b.qs[j]); });
}

TEST(Q8_0, MatrixQuantizerWritesRowsOfBlocksBackToBack) {
  std::vector<float> w(3 * 64);
  for (size_t i = 0; i < w.size(); i++) w[i] = std::cos(float(i));
  expect_rows_back_to_back(Format::Q8_0, w, 3, 64);
}


// --- Q4_K and Q6_K ----------------------------------------------------------------------------------------------

// (sc, m) = (63, 7), (1, 63), (16, 20), (17, 47), (32, 16), (48, 3), (62, 33), (5, 63), packed by hand:
// bytes 0-3 = sc0..3 | (sc4..7 >> 4) << 6, bytes 4-7 = m0..3 | (m4..7 >> 4) << 6,
// bytes 8-11 = (sc4..7 & 15) | (m4..7 & 15) << 4.
constexpr uint8_t kSc[8] = {63, 1, 16, 17, 32, 48, 62, 5}, kM[8] = {7, 63, 20, 47, 16, 3, 33, 63};
constexpr uint8_t kPackedScales[12] = {0xBF, 0xC1, 0xD0, 0x11, 0x47, 0x3F, 0x94, 0xEF, 0x00, 0x30, 0x1E, 0xF5};

TEST(Q4_K, ScaleMinUnpacksHandPackedBytesForAllEightSubBlocks) {
  for (int j = 0; j < 8; j++) {
    uint8_t sc = 0, m = 0;
    k4_scale_min(kPackedScales, j, &sc, &m);
    EXPECT_EQ(int(sc), int(kSc[j])) << "sub-block " << j;
    EXPECT_EQ(int(m), int(kM[j])) << "sub-block " << j;
  }
}

// Sub-block j holds sc_j·p − m_j for levels p = l % 16: the fit is exact with scale sc_j and min m_j, the largest
// of each is 63, so d = dmin = 1 and the stored 6-bit values are sc_j and m_j themselves, packed as above.
TEST(Q4_K, QuantizerPacksTheScalesAndMinsThatScaleMinUnpacks) {
  std::array<float, 256> x;
  for (int j = 0; j < 8; j++)
    for (int l = 0; l < 32; l++) x[32 * j + l] = float(kSc[j]) * float(l % 16) - float(kM[j]);
  BlockQ4_K block;
  quantize_row_q4_k(&block, x.data(), 256);
  EXPECT_EQ(block.d, 0x3C00);
  EXPECT_EQ(block.dmin, 0x3C00);
  EXPECT_EQ(std::memcmp(block.scales, kPackedScales, 12), 0);
  for (int j = 0; j < 8; j++) {
    uint8_t sc = 0, m = 0;
    k4_scale_min(block.scales, j, &sc, &m);
    EXPECT_EQ(int(sc), int(kSc[j])) << "sub-block " << j;
    EXPECT_EQ(int(m), int(kM[j])) << "sub-block " << j;
  }
  std::array<float, 256> y;
  dequantize_row_q4_k(y.data(), &block, 256);
  for (int i = 0; i < 256; i++) EXPECT_EQ(y[size_t(i)], x[size_t(i)]) << "weight " << i;
}

// d = 0.5 (f16 0x3800), dmin = 0.25 (0x3400), the scales above; weight 32j + l = 0.5·sc_j·q − 0.25·m_j. Chunk c
// of qs (32 bytes) holds sub-block 2c in its low nibbles and 2c + 1 in its high nibbles.
TEST(Q4_K, HandBuiltBlockDequantisesToHandComputedValues) {
  BlockQ4_K block{};
  block.d = 0x3800;
  block.dmin = 0x3400;
  std::memcpy(block.scales, kPackedScales, 12);
  block.qs[0] = 0x3A;       // sub-block 0 weight 0: q = 10; sub-block 1 weight 0: q = 3
  block.qs[31] = 0xF0;      // sub-block 0 weight 31: 0; sub-block 1 weight 31: 15
  block.qs[64 + 5] = 0x7C;  // sub-block 4 weight 5: 12; sub-block 5 weight 5: 7
  block.qs[96 + 31] = 0xE1;  // sub-block 6 weight 31: 1; sub-block 7 weight 31: 14
  std::array<float, 256> y;
  dequantize_row_q4_k(y.data(), &block, 256);
  EXPECT_EQ(y[0], 313.25f);         // 0.5·63·10 − 0.25·7
  EXPECT_EQ(y[32], -14.25f);        // 0.5·1·3 − 0.25·63
  EXPECT_EQ(y[31], -1.75f);         // 0.5·63·0 − 0.25·7
  EXPECT_EQ(y[63], -8.25f);         // 0.5·1·15 − 0.25·63
  EXPECT_EQ(y[128 + 5], 188.0f);    // 0.5·32·12 − 0.25·16
  EXPECT_EQ(y[160 + 5], 167.25f);   // 0.5·48·7 − 0.25·3
  EXPECT_EQ(y[192 + 31], 22.75f);   // 0.5·62·1 − 0.25·33
  EXPECT_EQ(y[224 + 31], 19.25f);   // 0.5·5·14 − 0.25·63
  EXPECT_EQ(y[96], -11.75f);        // q = 0 in sub-block 3: −0.25·47
  EXPECT_EQ(y[128 + 6], -4.0f);     // q = 0 in sub-block 4: −0.25·16
}

// d = 0.5; half h, lane l: weights 128h + l, +32, +64, +96 take the low/high nibbles of ql[64h + l] and
// ql[64h + l + 32] and bit pairs 0-1, 2-3, 4-5, 6-7 of qh[32h + l]; their scales are scales[8h + l/16 + 0, 2, 4, 6].
TEST(Q6_K, HandBuiltBlockDequantisesToHandComputedValues) {
  BlockQ6_K block{};
  const int8_t scales[16] = {1, -2, 3, -4, 5, -6, 7, -8, 10, -20, 30, -40, 50, -60, 127, -128};
  std::memcpy(block.scales, scales, 16);
  block.d = 0x3800;
  // h = 0, l = 3: q = 5 | 0<<4, 12 | 1<<4, 10 | 2<<4, 3 | 3<<4 = 5, 28, 42, 51 -> q − 32 = −27, −4, 10, 19.
  block.ql[3] = 0xA5;
  block.ql[35] = 0x3C;
  block.qh[3] = 0xE4;
  // h = 1, l = 20: q = 15 | 3<<4, 0 | 2<<4, 0 | 1<<4, 15 | 0<<4 = 63, 32, 16, 15 -> 31, 0, −16, −17.
  block.ql[64 + 20] = 0x0F;
  block.ql[64 + 52] = 0xF0;
  block.qh[32 + 20] = 0x1B;
  std::array<float, 256> y;
  dequantize_row_q6_k(y.data(), &block, 256);
  EXPECT_EQ(y[3], -13.5f);         // 0.5·1·(−27)
  EXPECT_EQ(y[35], -6.0f);         // 0.5·3·(−4)
  EXPECT_EQ(y[67], 25.0f);         // 0.5·5·10
  EXPECT_EQ(y[99], 66.5f);         // 0.5·7·19
  EXPECT_EQ(y[128 + 20], -310.0f);  // 0.5·(−20)·31
  EXPECT_EQ(y[128 + 52], 0.0f);     // 0.5·(−40)·0
  EXPECT_EQ(y[128 + 84], 480.0f);   // 0.5·(−60)·(−16)
  EXPECT_EQ(y[128 + 116], 1088.0f);  // 0.5·(−128)·(−17)
  EXPECT_EQ(y[0], -16.0f);          // all bits 0: q − 32 = −32, scale 1
  EXPECT_EQ(y[16], 32.0f);          // scale −2
  EXPECT_EQ(y[128 + 127], 2048.0f);  // scale −128 (lane 31 of half 1, +96)
}

// A random finite f16 of either sign with any exponent, so that d·sc·q and dmin·m differ widely in size.
uint16_t random_half(std::mt19937& rng) {
  const uint16_t h = uint16_t(rng() & 0xFFFF);
  return (h & 0x7C00) == 0x7C00 ? uint16_t(h ^ 0x4000) : h;  // inf/NaN exponent -> a finite one
}

// n blocks of random bytes; the caller then makes their f16 scales finite (random_half).
template <typename Block>
std::vector<Block> random_blocks(std::mt19937& rng, size_t n) {
  std::vector<Block> blocks(n);
  auto* bytes = reinterpret_cast<uint8_t*>(blocks.data());
  for (size_t i = 0; i < n * sizeof(Block); i++) bytes[i] = uint8_t(rng());
  return blocks;
}

// The double dequantisation is exact; the float one evaluates (d·sc)·q − dmin·m, whose product is exact in f32,
// so it must equal the exact value rounded once (and the exact value itself whenever that fits in a float).
TEST(Q4_K, FloatDequantisationIsTheExactValueRoundedOnce) {
  std::mt19937 rng(21);
  std::vector<BlockQ4_K> blocks = random_blocks<BlockQ4_K>(rng, 64);
  for (BlockQ4_K& b : blocks) {
    b.d = random_half(rng);
    b.dmin = random_half(rng);
  }
  blocks[0].dmin = blocks[0].d;  // one block with equal scales, where most values are exact
  const auto [yf, yd] = dequantise_both_ways(Format::Q4_K, blocks);
  const int64_t n = int64_t(yd.size());
  int exact = 0, rounded = 0;
  for (int64_t i = 0; i < n; i++) {
    const BlockQ4_K& b = blocks[size_t(i / 256)];
    const int j = int(i % 256 / 32), l = int(i % 32);
    uint8_t sc, m;
    k4_scale_min(b.scales, j, &sc, &m);
    const int q = (b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
    ASSERT_EQ(yd[size_t(i)], double(f16_to_f32(b.d)) * sc * q - double(f16_to_f32(b.dmin)) * m) << i;
    ASSERT_EQ(yf[size_t(i)], float(yd[size_t(i)])) << i;
    (double(float(yd[size_t(i)])) == yd[size_t(i)] ? exact : rounded)++;
  }
  EXPECT_GT(exact, 0);
  EXPECT_GT(rounded, 0) << "the fixture should include values that do not fit in a float";
}

// d·scale·(q − 32) has at most 11 + 8 + 6 significant bits, so the float dequantisation is exact.
TEST(Q6_K, DequantisesExactlyInFloatAndDouble) {
  std::mt19937 rng(22);
  std::vector<BlockQ6_K> blocks = random_blocks<BlockQ6_K>(rng, 64);
  for (BlockQ6_K& b : blocks) b.d = random_half(rng);
  const auto [yf, yd] = dequantise_both_ways(Format::Q6_K, blocks);
  const int64_t n = int64_t(yd.size());
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(double(yf[size_t(i)]), yd[size_t(i)]) << i;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / double(v.size()));
}

double rms_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / double(a.size()));
}

// On N(0, 1) weights with 1% outliers, relative to the RMS of the data: 4-bit Q4_0 lands near 0.15, Q4_K (a scale
// and a min per 32 weights, fitted by search) near 0.10, and 6-bit Q6_K near 0.033.
TEST(KQuants, RoundTripErrorIsSmallerThanQ4_0sAndQ6_KsMuchSmaller) {
  const int64_t n = 256 * 256;
  std::vector<float> x = normal_floats(n, 23);
  for (int64_t i = 0; i < n; i += 101) x[size_t(i)] *= 20.0f;
  const std::vector<float> y4_0 = round_trip<BlockQ4_0>(Format::Q4_0, x).second,
                           y4_k = round_trip<BlockQ4_K>(Format::Q4_K, x).second,
                           y6_k = round_trip<BlockQ6_K>(Format::Q6_K, x).second;
  const double e4_0 = rms_difference(x, y4_0) / rms(x), e4_k = rms_difference(x, y4_k) / rms(x),
               e6_k = rms_difference(x, y6_k) / rms(x);
  EXPECT_LT(e4_0, 0.16);
  EXPECT_LT(e4_k, 0.75 * e4_0);
  EXPECT_LT(e6_k, 0.4 * e4_k);
}

TEST(KQuants, AllZeroBlocksAreAllZeroBytesAndDequantiseToZero) {
  const std::array<float, 256> x{};
  BlockQ4_K q4;
  BlockQ6_K q6;
  std::memset(&q4, 0xAB, sizeof q4);
  std::memset(&q6, 0xAB, sizeof q6);
  quantize_row_q4_k(&q4, x.data(), 256);
  quantize_row_q6_k(&q6, x.data(), 256);
  const std::array<uint8_t, 210> zeros{};
  EXPECT_EQ(std::memcmp(&q4, zeros.data(), sizeof q4), 0);
  EXPECT_EQ(std::memcmp(&q6, zeros.data(), sizeof q6), 0);
  std::array<float, 256> y4, y6;
  dequantize_row_q4_k(y4.data(), &q4, 256);
  dequantize_row_q6_k(y6.data(), &q6, 256);
  for (int i = 0; i < 256; i++) {
    EXPECT_EQ(y4[size_t(i)], 0.0f) << i;
    EXPECT_EQ(y6[size_t(i)], 0.0f) << i;
  }
}

// Values up to 8e-15 give sub-block scales near 2.5e-16, below GGML's GROUP_MAX_EPS (1e-15): GGML writes the
// whole block as zeros rather than quants against a scale that rounds to 0 in f16.
TEST(Q6_K, BlockWhoseScalesAreAllBelowTheEpsilonIsAllZeroBytes) {
  std::array<float, 256> x;
  for (int i = 0; i < 256; i++) x[size_t(i)] = 1e-15f * float(i % 16 - 8);
  BlockQ6_K q6;
  quantize_row_q6_k(&q6, x.data(), 256);
  const std::array<uint8_t, 210> zeros{};
  EXPECT_EQ(std::memcmp(&q6, zeros.data(), sizeof q6), 0);
}

TEST(KQuants, MatrixQuantizersWriteRowsOfBlocksBackToBack) {
  std::vector<float> w(3 * 512);
  for (size_t i = 0; i < w.size(); i++) w[i] = std::sin(0.37f * float(i));
  expect_rows_back_to_back(Format::Q4_K, w, 3, 512);
  expect_rows_back_to_back(Format::Q6_K, w, 3, 512);
}

// The Vulkan layout of Q6_K (kernels/shapes.h): 13 blocks take two groups of 8, the second with 3 zero blocks;
// block i's first 208 bytes sit at 1680·(i / 8) + 208·(i % 8) and its d at 1680·(i / 8) + 1664 + 2·(i % 8);
// converting back gives GGML's bytes.
TEST(Q6_K, DeviceLayoutGroupsEightBlocksAndConvertsBack) {
  const int64_t n = 13;
  std::vector<float> w(size_t(n) * 256);
  for (size_t i = 0; i < w.size(); i++) w[i] = std::cos(0.11f * float(i)) * float(1 + i % 7);
  std::vector<uint8_t> ggml(size_t(n) * 210);
  ggml = quantize_matrix(Format::Q6_K, w, 1, n * 256);
  const std::vector<uint8_t> dev = q6_k_to_device(ggml);
  ASSERT_EQ(dev.size(), 2u * 1680u);
  EXPECT_EQ(int64_t(dev.size()), q6_k_device_bytes(1, n * 256));
  EXPECT_EQ(q6_k_device_bytes(n, 256), q6_k_device_bytes(1, n * 256));
  EXPECT_EQ(q6_k_device_bytes(4, 512), 1680);
  for (size_t i = 0; i < size_t(n); i++) {
    const uint8_t* group = dev.data() + i / 8 * 1680;
    EXPECT_EQ(std::memcmp(group + 208 * (i % 8), ggml.data() + 210 * i, 208), 0) << "block " << i;
    EXPECT_EQ(std::memcmp(group + 1664 + 2 * (i % 8), ggml.data() + 210 * i + 208, 2), 0) << "block " << i;
  }
  for (size_t i = size_t(n); i < 16; i++) {
    const uint8_t* group = dev.data() + 1680;
    EXPECT_TRUE(std::all_of(group + 208 * (i % 8), group + 208 * (i % 8 + 1), [](uint8_t b) { return b == 0; }));
    EXPECT_EQ(group[1664 + 2 * (i % 8)] | group[1665 + 2 * (i % 8)], 0);
  }
  EXPECT_EQ(q6_k_from_device(dev, n), ggml);
  EXPECT_EQ(q6_k_from_device(dev, 5), std::vector<uint8_t>(ggml.begin(), ggml.begin() + 5 * 210));
  EXPECT_NE(shape_error([&] { q6_k_to_device(std::span<const uint8_t>(ggml).first(300)); })
                .find("q6_k_to_device: 300 bytes are not whole 210-byte Q6_K blocks"),
            std::string::npos);
  EXPECT_NE(shape_error([&] { q6_k_from_device(std::span<const uint8_t>(dev).first(1680), 9); })
                .find("q6_k_from_device: 1680 bytes cannot hold 9 grouped Q6_K blocks"),
            std::string::npos);
}

TEST(KQuants, RejectBadSizesWithActionableMessages) {
  std::vector<float> w(2 * 256);
  std::vector<uint8_t> out4(2 * 144), out6(2 * 210);
  std::string msg = shape_error([&] { out4 = quantize_matrix(Format::Q4_K, std::span<const float>(w).first(64), 2, 32); });
  EXPECT_NE(msg.find("quantize: n_in = 32 is not a multiple of 256 (the q4_k block size)"), std::string::npos)
      << msg;
  msg = shape_error([&] { out6 = quantize_matrix(Format::Q6_K, std::span<const float>(w).first(500), 2, 256); });
  EXPECT_NE(msg.find("quantize: W has 500 floats, expected 512"), std::string::npos) << msg;
  BlockQ4_K q4;
  BlockQ6_K q6;
  msg = shape_error([&] { quantize_row_q4_k(&q4, w.data(), 300); });
  EXPECT_NE(msg.find("n = 300 is not a multiple of 256"), std::string::npos) << msg;
  msg = shape_error([&] { dequantize_row_q6_k(w.data(), &q6, 128); });
  EXPECT_NE(msg.find("dequantize_row_q6_k: n = 128 is not a multiple of 256"), std::string::npos) << msg;
}

}  // namespace
}  // namespace q4t::quant
