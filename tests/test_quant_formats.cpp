// Block codecs of Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS and BF16: round trips, zero and outlier
// blocks, partial blocks, float against double dequantisation. Suite QuantVsLlamaCpp: the bytes our quantizers
// write are the bytes llama.cpp's ggml_quantize_chunk writes (no importance matrix) for awkward inputs, and our
// float dequantizers are GGML's bit for bit; for these formats and for Q4_0, Q8_0, Q4_K, Q6_K and F16. It loads
// GGML from the libggml-base.so of npm's node-llama-cpp CPU prebuilt (tests/interop/install_node_llama.sh
// installs it; Q4T_LLAMA_CPP_LIB may name another libggml-base.so) and skips when there is none.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "error_of.h"
#include "kernels/formats.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/iq4.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/legacy_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/random_inputs.h"

namespace q4t::quant {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------------------
// Every format behind one interface: its row of kernels/formats.h (rows of floats to GGML's bytes and back) and
// what these tests add to it.

struct Codec {
  std::string name;           // upper case, as llama.cpp prints it ("Q4_K")
  int ggml_type;              // GGML's enum ggml_type
  std::string ggml_to_float;  // the libggml-base.so function that turns a row of this type into floats
  int64_t block_elems, block_bytes;
  void (*quantize)(uint8_t*, const float*, int64_t);
  void (*dequantize)(float*, const uint8_t*, int64_t);
  void (*dequantize_f64)(double*, const uint8_t*, int64_t);
  double max_rel_rms;  // bound on rms(dequantize(quantize(x)) − x) / rms(x) for normal x (0: not tested here)
};

// GGML's name for the float rows of a type: dequantize_row_<type> with the K-quants' K in upper case
// ("dequantize_row_q4_K"), ggml_fp16_to_fp32_row and ggml_bf16_to_fp32_row for the 16-bit floats.
std::string ggml_to_float(const FormatTraits& t) {
  std::string name = t.name;
  if (t.block_elems == 1) return "ggml_" + (name == "f16" ? std::string("fp16") : name) + "_to_fp32_row";
  if (name.ends_with("_k")) name.back() = 'K';
  return "dequantize_row_" + name;
}

// The relative rms bounds are about 1.25x what each new format measures on normal data (Q4_1 0.078, Q5_0 0.042,
// Q5_1 0.038, Q2_K 0.296, Q3_K 0.151, Q5_K 0.036, IQ4_NL 0.075, IQ4_XS 0.075, BF16 0.0017). The formats that had
// codecs before (Q4_0, Q8_0, Q4_K, Q6_K, F16) are compared with llama.cpp only (tests/test_quant.cpp has the rest).
const std::vector<Codec>& all_codecs() {
  static const std::vector<Codec> codecs = [] {
    const std::map<Format, double> bounds = {
        {Format::Q4_1, 0.10}, {Format::Q5_0, 0.053},   {Format::Q5_1, 0.048},   {Format::Q2_K, 0.37},
        {Format::Q3_K, 0.19}, {Format::Q5_K, 0.045},   {Format::IQ4_NL, 0.094}, {Format::IQ4_XS, 0.094},
        {Format::BF16, 0.0021}};
    std::vector<Codec> out;
    for (const FormatTraits& t : format_table()) {
      std::string upper = t.name;
      for (char& ch : upper) ch = char(std::toupper(uint8_t(ch)));
      const auto bound = bounds.find(t.format);
      out.push_back({upper, int(t.format), ggml_to_float(t), t.block_elems, t.block_bytes, t.quantize_row,
                     t.dequantize_row, t.dequantize_row_f64, bound == bounds.end() ? 0.0 : bound->second});
    }
    return out;
  }();
  return codecs;
}

const Codec& codec(const std::string& name) {
  for (const Codec& c : all_codecs())
    if (c.name == name) return c;
  throw std::invalid_argument("no codec " + name);
}

std::vector<uint8_t> quantize(const Codec& c, const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / size_t(c.block_elems) * size_t(c.block_bytes));
  c.quantize(out.data(), x.data(), int64_t(x.size()));
  return out;
}

std::vector<float> dequantize(const Codec& c, const std::vector<uint8_t>& bytes) {
  std::vector<float> y(bytes.size() / size_t(c.block_bytes) * size_t(c.block_elems));
  c.dequantize(y.data(), bytes.data(), int64_t(y.size()));
  return y;
}

std::vector<double> dequantize_f64(const Codec& c, const std::vector<uint8_t>& bytes) {
  std::vector<double> y(bytes.size() / size_t(c.block_bytes) * size_t(c.block_elems));
  c.dequantize_f64(y.data(), bytes.data(), int64_t(y.size()));
  return y;
}

double rel_rms_error(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); i++) {
    err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

constexpr auto& shape_error = test::error_of<ShapeError>;

std::string hex(const uint8_t* p, size_t n) {
  std::ostringstream s;
  for (size_t i = 0; i < n; i++)
    s << (i > 0 ? " " : "") << std::hex << std::setw(2) << std::setfill('0') << int(p[i]);
  return s.str();
}

// ---------------------------------------------------------------------------------------------------------------
// The new formats on their own.

class QuantFormat : public ::testing::TestWithParam<std::string> {
 protected:
  const Codec& c() const { return codec(GetParam()); }
};

TEST_P(QuantFormat, RoundTripOfNormalDataIsWithinTheFormatsBound) {
  const std::vector<float> x = normal_floats(16 * 1024, 7);
  const std::vector<float> y = dequantize(c(), quantize(c(), x));
  const double e = rel_rms_error(x, y);
  EXPECT_LT(e, c().max_rel_rms) << c().name;
  // Scaling the input scales the error alike (no format is stuck at a fixed absolute resolution here).
  std::vector<float> x_small = x;
  for (float& v : x_small) v *= 1e-3f;
  EXPECT_LT(rel_rms_error(x_small, dequantize(c(), quantize(c(), x_small))), c().max_rel_rms) << c().name;
}

TEST_P(QuantFormat, ZerosRoundTripToZeros) {
  const std::vector<float> x(512, 0.0f);
  const std::vector<uint8_t> q = quantize(c(), x);
  for (float v : dequantize(c(), q)) ASSERT_EQ(v, 0.0f) << c().name;
  for (double v : dequantize_f64(c(), q)) ASSERT_EQ(v, 0.0) << c().name;
}

// One weight of 100 among normal ones: the block's scale follows the outlier, which comes back within 1% (every
// format measures under 0.05%); the block's other weights are then coarse, but within a tenth of the outlier (half
// a 2-bit step would be 17).
TEST_P(QuantFormat, BlockWithOneHugeOutlierKeepsTheOutlier) {
  std::vector<float> x = normal_floats(512, 11);
  const size_t at = 300;
  x[at] = 100.0f;
  const std::vector<float> y = dequantize(c(), quantize(c(), x));
  EXPECT_NEAR(y[at], 100.0, 1.0) << c().name;
  for (size_t i = 0; i < x.size(); i++) {
    ASSERT_TRUE(std::isfinite(y[i])) << c().name << " weight " << i;
    EXPECT_LT(std::fabs(y[i] - x[i]), 10.0) << c().name << " weight " << i;
  }
}

TEST_P(QuantFormat, PartialBlocksAreRejectedWithActionableMessages) {
  const int64_t block = c().block_elems;
  if (block == 1) GTEST_SKIP() << "a BF16 row is any number of values";
  std::vector<float> x(size_t(2 * block));
  std::vector<uint8_t> bytes(size_t(2 * c().block_bytes));
  std::vector<double> yd(x.size());
  for (const int64_t n : {block + 1, block / 2, int64_t(-block)}) {
    const std::string want = "n = " + std::to_string(n) + " is not a multiple of " + std::to_string(block);
    std::string msg = shape_error([&] { c().quantize(bytes.data(), x.data(), n); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_NE(msg.find("quantize_row_"), std::string::npos) << msg;
    msg = shape_error([&] { c().dequantize(x.data(), bytes.data(), n); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_NE(msg.find("dequantize_row_"), std::string::npos) << msg;
    msg = shape_error([&] { c().dequantize_f64(yd.data(), bytes.data(), n); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
}

// Every format's float dequantisation is either exact (Q5_0, Q3_K, IQ4_NL, IQ4_XS, BF16: products of few-bit
// integers and an f16) or rounds once (Q4_1, Q5_1, Q2_K, Q5_K: an exact product plus or minus an exact offset),
// so it is the exact (double) value rounded to float.
TEST_P(QuantFormat, FloatDequantisationIsTheExactValueRoundedOnce) {
  std::vector<float> x = normal_floats(4096, 5);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 30.0f;
  for (size_t i = 1024; i < 1536; i++) x[i] = std::fabs(x[i]) + 2.0f;  // positive blocks: large mins
  const std::vector<uint8_t> q = quantize(c(), x);
  const std::vector<float> yf = dequantize(c(), q);
  const std::vector<double> yd = dequantize_f64(c(), q);
  int mismatches = 0;
  for (size_t i = 0; i < x.size(); i++) {
    if (std::bit_cast<uint32_t>(yf[i]) != std::bit_cast<uint32_t>(float(yd[i])) && mismatches++ < 5)
      ADD_FAILURE() << c().name << " weight " << i << ": float " << yf[i] << ", double " << yd[i];
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(NewFormats, QuantFormat,
                         ::testing::Values("Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "BF16"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Zero blocks, by GGML's arithmetic: Q5_0's d is 0/−16 = −0 (f16 0x8000) and every weight takes level 16 (fifth
// bit set, low nibble 0); IQ4_NL takes level 8 (value 1, the nearest to 0) against scale 0; IQ4_XS's d is −0/32 =
// −0 and every sub-block scale is stored as 0 + 32 (scales_h bits 10 per sub-block); the others are zero bytes.
TEST(QuantFormatBytes, ZeroBlocksAreGgmlsBytes) {
  const std::vector<float> x(256, 0.0f);
  auto expect_bytes = [&](const std::string& name, const std::vector<uint8_t>& block) {
    const std::vector<uint8_t> q = quantize(codec(name), x);
    for (size_t b = 0; b < q.size() / block.size(); b++)
      EXPECT_EQ(hex(q.data() + b * block.size(), block.size()), hex(block.data(), block.size()))
          << name << " block " << b;
  };
  expect_bytes("Q4_1", std::vector<uint8_t>(20, 0));
  expect_bytes("Q5_1", std::vector<uint8_t>(24, 0));
  expect_bytes("Q2_K", std::vector<uint8_t>(84, 0));
  expect_bytes("Q3_K", std::vector<uint8_t>(110, 0));
  expect_bytes("Q5_K", std::vector<uint8_t>(176, 0));
  std::vector<uint8_t> q5_0(22, 0);
  q5_0[1] = 0x80;
  std::fill(q5_0.begin() + 2, q5_0.begin() + 6, 0xFF);
  expect_bytes("Q5_0", q5_0);
  std::vector<uint8_t> nl(18, 0x88);
  nl[0] = nl[1] = 0;
  expect_bytes("IQ4_NL", nl);
  std::vector<uint8_t> xs(136, 0x88);
  xs[0] = 0x00;
  xs[1] = 0x80;
  xs[2] = xs[3] = 0xAA;
  std::fill(xs.begin() + 4, xs.begin() + 8, 0);
  expect_bytes("IQ4_XS", xs);
}

// Q5_0 and Q5_1 keep the fifth bit of weight j in bit j of qh (little-endian): a ramp whose upper half needs it.
TEST(QuantFormatBytes, Q5FifthBitsFollowTheWeightIndex) {
  std::array<float, 32> x;
  for (int j = 0; j < 32; j++) x[size_t(j)] = float(j);  // Q5_1: min 0, d = 1, levels j
  BlockQ5_1 b;
  quantize_row_q5_1(&b, x.data(), 32);
  EXPECT_EQ(f16_to_f32(b.d), 1.0f);
  EXPECT_EQ(f16_to_f32(b.m), 0.0f);
  EXPECT_EQ(hex(b.qh, 4), "00 00 ff ff");  // weights 16..31 have level >= 16
  for (int j = 0; j < 16; j++) EXPECT_EQ(b.qs[j], uint8_t(j | (j << 4))) << j;
  std::array<float, 32> y;
  dequantize_row_q5_1(y.data(), &b, 32);
  for (int j = 0; j < 32; j++) EXPECT_EQ(y[size_t(j)], float(j)) << j;
}

TEST(QuantFormatBytes, Q3_KScalesUnpackFromHandPackedBytes) {
  // Sub-block s gets stored scale s * 4 + 1 (0..63): low nibbles in bytes 0..7, top bits in bytes 8..11.
  uint8_t packed[12] = {};
  for (int s = 0; s < 16; s++) {
    const int ls = s * 4 + 1;
    if (s < 8)
      packed[s] = uint8_t(ls & 0xF);
    else
      packed[s - 8] |= uint8_t((ls & 0xF) << 4);
    packed[8 + s % 4] |= uint8_t((ls >> 4) << (2 * (s / 4)));
  }
  for (int s = 0; s < 16; s++) EXPECT_EQ(k3_scale(packed, s), s * 4 + 1 - 32) << s;
}

TEST(BF16, KnownValuesConvertBothWays) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);      // halfway, even neighbour below
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // halfway, even neighbour above
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // a signalling NaN comes out quiet, not inf
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0xFFC12345u)), 0xFFC1);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormals round too (not flushed): tie to even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00008000u)), 0x0000);
  for (uint32_t h : {0x0000u, 0x3F80u, 0xC2F7u, 0x0001u, 0x7F80u, 0xFF80u, 0x7F7Fu})
    EXPECT_EQ(std::bit_cast<uint32_t>(bf16_to_f32(uint16_t(h))), h << 16) << h;
  // Every bf16 that is not a NaN survives the round trip.
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7FFF) > 0x7F80) continue;
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(uint16_t(h))), h) << h;
  }
}

TEST(BF16, RowHelpersConvertUnalignedRowsBothWays) {
  const std::vector<float> x = {1.0f, -3.5f, 1e-3f, 65536.0f, 0.0f};
  std::vector<uint8_t> raw(2 * x.size() + 1);
  f32_row_to_bf16(raw.data() + 1, x.data(), int64_t(x.size()));  // an odd address
  std::vector<float> y(x.size());
  std::vector<double> yd(x.size());
  bf16_row_to_f32(y.data(), raw.data() + 1, int64_t(x.size()));
  bf16_row_to_f64(yd.data(), raw.data() + 1, int64_t(x.size()));
  for (size_t i = 0; i < x.size(); i++) {
    uint16_t h;
    std::memcpy(&h, raw.data() + 1 + 2 * i, 2);
    EXPECT_EQ(h, f32_to_bf16(x[i])) << i;
    EXPECT_EQ(y[i], bf16_to_f32(h)) << i;
    EXPECT_EQ(yd[i], double(y[i])) << i;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Against llama.cpp.

using QuantizeChunk = size_t (*)(int type, const float* src, void* dst, int64_t start, int64_t nrows, int64_t n_per_row,
                                 const float* imatrix);
using ToFloat = void (*)(const void* x, float* y, int64_t n);

// libggml-base.so, loaded once per process, or why it could not be.
struct Ggml {
  void* handle = nullptr;
  std::string path, error;
  QuantizeChunk quantize_chunk = nullptr;
};

std::string run_capture(const std::string& cmd, int* code) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    *code = -1;
    return "popen failed";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Where the library is: $Q4T_LLAMA_CPP_LIB; else the node-llama-cpp install that install_node_llama.sh reports
// (installing it if needed); else the default install directory. Empty, with *why, when none is found.
fs::path find_libggml(std::string* why) {
  if (const char* env = std::getenv("Q4T_LLAMA_CPP_LIB"); env != nullptr && *env != '\0') {
    if (fs::exists(env)) return env;
    *why = "Q4T_LLAMA_CPP_LIB names " + std::string(env) + ", which does not exist";
    return {};
  }
  const fs::path rel = "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so";
  const fs::path script = fs::path(Q4T_SOURCE_DIR) / "tests/interop/install_node_llama.sh";
  int code = 0;
  const std::string out = run_capture(std::string("'").append(script.string()).append("'"), &code);
  std::istringstream lines(out);  // the script prints the install directory last
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty()) last = line;
  if (code == 0 && !last.empty() && fs::exists(fs::path(last) / rel)) return fs::path(last) / rel;
  *why = script.string() + " failed (exit " + std::to_string(code) + "): " + out;
  if (const char* home = std::getenv("HOME"); home != nullptr) {
    const fs::path fallback = fs::path(home) / ".cache/q4tune/node-llama-cpp-3.22.1" / rel;
    if (fs::exists(fallback)) return fallback;
  }
  return {};
}

const Ggml& ggml() {
  static const Ggml g = [] {
    Ggml g;
    std::string why;
    const fs::path lib = find_libggml(&why);
    if (lib.empty()) {
      g.error = "llama.cpp's libggml-base.so was not found (" + why +
                "). Install it with tests/interop/install_node_llama.sh (needs node >= 20 and npm, and the npm "
                "registry once), or set Q4T_LLAMA_CPP_LIB to a libggml-base.so";
      return g;
    }
    g.path = lib.string();
    g.handle = dlopen(g.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (g.handle == nullptr) {
      g.error = "dlopen(" + g.path + ") failed: " + dlerror();
      return g;
    }
    g.quantize_chunk = reinterpret_cast<QuantizeChunk>(dlsym(g.handle, "ggml_quantize_chunk"));
    if (g.quantize_chunk == nullptr) g.error = g.path + " has no ggml_quantize_chunk";
    return g;
  }();
  return g;
}

// A named input of nrows rows of n_per_row weights (n_per_row a multiple of 256, so every format takes it).
struct Input {
  std::string name;
  int64_t nrows, n_per_row;
  std::vector<float> x;
};

// Rows that exercise the quantizers' corners: ordinary and heavy-tailed data, values around GGML's
// GROUP_MAX_EPS (1e-15) and scales whose f16 underflows, constant and one-signed blocks, zero blocks and
// sub-blocks between ordinary ones, a handful of nonzeros, and a wide dynamic range.
std::vector<Input> awkward_inputs() {
  std::vector<Input> in;
  auto add = [&](std::string name, int64_t nrows, int64_t n_per_row, std::vector<float> x) {
    in.push_back({std::move(name), nrows, n_per_row, std::move(x)});
  };
  add("normal 3x256", 3, 256, normal_floats(3 * 256, 101));
  add("normal 4x1024", 4, 1024, normal_floats(4 * 1024, 102));
  add("normal 2x4096", 2, 4096, normal_floats(2 * 4096, 103, 0.02f));
  {
    std::vector<float> x = normal_floats(3 * 1024, 104);
    for (size_t i = 0; i < x.size(); i += 37) x[i] *= 50.0f;
    x[100] = 1e4f;
    x[1500] = -3e3f;
    x[2049] = 700.0f;
    add("outliers 3x1024", 3, 1024, std::move(x));
  }
  {
    // 16-weight groups at scales from well below to well above 1e-15, and f16-subnormal scales.
    const float scales[] = {1e-17f, 1e-16f, 4e-16f, 9e-16f, 1e-15f, 1.1e-15f, 3e-15f, 1e-14f, 1e-10f, 1e-7f, 3e-6f};
    std::vector<float> x = normal_floats(2 * 1024, 105);
    for (size_t i = 0; i < x.size(); i++) x[i] *= scales[(i / 16) % std::size(scales)];
    add("tiny 2x1024", 2, 1024, std::move(x));
  }
  {
    std::vector<float> x(4 * 256);
    for (size_t i = 0; i < x.size(); i++) x[i] = 1e-15f * float(int(i % 7) - 3);  // amax 3e-15 per group
    add("near eps 4x256", 4, 256, std::move(x));
  }
  add("all equal 0.5 2x256", 2, 256, std::vector<float>(512, 0.5f));
  add("all equal -0.25 1x512", 1, 512, std::vector<float>(512, -0.25f));
  add("all equal 3 1x256", 1, 256, std::vector<float>(256, 3.0f));
  {
    std::vector<float> x = normal_floats(3 * 512, 106);
    for (float& v : x) v = -std::fabs(v) - 0.05f;
    add("all negative 3x512", 3, 512, std::move(x));
  }
  {
    std::vector<float> x = normal_floats(2 * 512, 107);
    for (float& v : x) v = std::fabs(v) + 0.3f;
    add("all positive 2x512", 2, 512, std::move(x));
  }
  {
    std::vector<float> x = normal_floats(2 * 2048, 108);
    for (size_t i = 0; i < x.size(); i++) {
      const size_t block = i / 32, sub = i / 16;
      if (block % 3 == 0 || sub % 11 == 5) x[i] = 0.0f;
    }
    add("zero blocks 2x2048", 2, 2048, std::move(x));
  }
  {
    std::vector<float> x(2 * 1024, 0.0f);
    std::mt19937 rng(109);
    std::uniform_int_distribution<size_t> pos(0, x.size() - 1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (int k = 0; k < 60; k++) x[pos(rng)] = normal(rng);
    add("sparse 2x1024", 2, 1024, std::move(x));
  }
  {
    std::vector<float> x = normal_floats(4 * 512, 110);
    const float row_scale[] = {1e-3f, 1.0f, 2e3f, 1e-6f};
    for (size_t i = 0; i < x.size(); i++) x[i] *= row_scale[i / 512];
    add("row scales 4x512", 4, 512, std::move(x));
  }
  {
    std::vector<float> x(2 * 768);
    std::mt19937 rng(111);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : x) v = u(rng);
    add("uniform 2x768", 2, 768, std::move(x));
  }
  {
    std::vector<float> x(512);
    for (size_t i = 0; i < x.size(); i++) x[i] = float(i) * 0.01f - 2.56f;
    add("ramp 1x512", 1, 512, std::move(x));
  }
  {
    // Values that sit on rounding boundaries: small integers and halves.
    std::vector<float> x(2 * 256);
    for (size_t i = 0; i < x.size(); i++) x[i] = 0.5f * float(int(i * 7 % 33) - 16);
    add("halves 2x256", 2, 256, std::move(x));
  }
  return in;
}

// Float edge cases for F16 and BF16: signed zeros, subnormals of both formats, halfway cases, overflow, inf, NaN.
Input special_values() {
  std::vector<float> x = {0.0f,          -0.0f,         1.0f,           -1.0f,          65504.0f,      65519.0f,
                          65520.0f,      -70000.0f,     INFINITY,       -INFINITY,      0x1p-24f,      0x1p-25f,
                          3 * 0x1p-25f,  1e-30f,        1e-40f,         -1e-42f,
                          std::bit_cast<float>(0x00018000u), std::bit_cast<float>(0x3F808000u),
                          std::bit_cast<float>(0x3F818000u), 3.4e38f,       -3.4e38f,
                          std::numeric_limits<float>::quiet_NaN(),      -std::numeric_limits<float>::quiet_NaN(),
                          1.0f + 0x1p-11f,              1.0f + 3 * 0x1p-11f,            0.1f,          -0.3f};
  x.resize(256, 0.25f);
  return {"special values 1x256", 1, 256, std::move(x)};
}

// Quantizes `in` with ggml_quantize_chunk and with ours, expects the same bytes, and expects our float
// dequantizer to turn llama.cpp's bytes into llama.cpp's floats bit for bit.
void expect_agreement(const Codec& c, const Input& in) {
  const Ggml& g = ggml();
  const auto to_float = reinterpret_cast<ToFloat>(dlsym(g.handle, c.ggml_to_float.c_str()));
  ASSERT_NE(to_float, nullptr) << g.path << " has no " << c.ggml_to_float;
  const int64_t n = in.nrows * in.n_per_row;
  const size_t row_bytes = size_t(in.n_per_row / c.block_elems * c.block_bytes);
  std::vector<uint8_t> theirs(size_t(in.nrows) * row_bytes + 64, 0xEE), ours(size_t(in.nrows) * row_bytes, 0xCD);
  const size_t written = g.quantize_chunk(c.ggml_type, in.x.data(), theirs.data(), 0, in.nrows, in.n_per_row, nullptr);
  ASSERT_EQ(written, size_t(in.nrows) * row_bytes) << c.name << " on " << in.name;
  theirs.resize(written);
  for (int64_t r = 0; r < in.nrows; r++)
    c.quantize(ours.data() + size_t(r) * row_bytes, in.x.data() + r * in.n_per_row, in.n_per_row);

  const size_t bb = size_t(c.block_bytes);
  size_t first = SIZE_MAX, blocks_differ = 0;
  for (size_t b = 0; b < ours.size() / bb; b++) {
    if (std::memcmp(ours.data() + b * bb, theirs.data() + b * bb, bb) == 0) continue;
    if (first == SIZE_MAX) first = b;
    blocks_differ++;
  }
  if (first != SIZE_MAX) {
    size_t byte = 0;
    while (ours[first * bb + byte] == theirs[first * bb + byte]) byte++;
    const int64_t w0 = int64_t(first) * c.block_elems;
    const size_t show = std::min<size_t>(bb, 48);
    ADD_FAILURE() << c.name << " on " << in.name << ": " << blocks_differ << " of " << ours.size() / bb
                  << " blocks differ from llama.cpp's. First: block " << first << " (row " << w0 / in.n_per_row
                  << ", weights " << w0 % in.n_per_row << ".." << w0 % in.n_per_row + c.block_elems - 1 << "), byte "
                  << byte << " (ours 0x" << hex(&ours[first * bb + byte], 1) << ", llama.cpp 0x"
                  << hex(&theirs[first * bb + byte], 1) << ")\n  ours:      " << hex(&ours[first * bb], show)
                  << "\n  llama.cpp: " << hex(&theirs[first * bb], show);
  }

  // Dequantise llama.cpp's bytes both ways.
  std::vector<float> y_theirs(static_cast<size_t>(n)), y_ours(static_cast<size_t>(n));
  to_float(theirs.data(), y_theirs.data(), n);
  c.dequantize(y_ours.data(), theirs.data(), n);
  size_t diff = 0, first_diff = SIZE_MAX;
  for (size_t i = 0; i < size_t(n); i++) {
    if (std::bit_cast<uint32_t>(y_ours[i]) == std::bit_cast<uint32_t>(y_theirs[i])) continue;
    if (first_diff == SIZE_MAX) first_diff = i;
    diff++;
  }
  if (first_diff != SIZE_MAX)
    ADD_FAILURE() << c.name << " on " << in.name << ": " << diff << " of " << n
                  << " dequantised weights differ from llama.cpp's; first: weight " << first_diff << ", ours "
                  << std::hexfloat << y_ours[first_diff] << ", llama.cpp " << y_theirs[first_diff];
}

class QuantVsLlamaCpp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ggml().handle == nullptr || ggml().quantize_chunk == nullptr) GTEST_SKIP() << ggml().error;
  }
  static void agree(const std::string& name) {
    const Codec& c = codec(name);
    for (const Input& in : awkward_inputs()) {
      SCOPED_TRACE(in.name);
      expect_agreement(c, in);
    }
    if (c.block_elems == 1) expect_agreement(c, special_values());
  }
};

TEST_F(QuantVsLlamaCpp, Q4_1) { agree("Q4_1"); }
TEST_F(QuantVsLlamaCpp, Q5_0) { agree("Q5_0"); }
TEST_F(QuantVsLlamaCpp, Q5_1) { agree("Q5_1"); }
TEST_F(QuantVsLlamaCpp, Q2_K) { agree("Q2_K"); }
TEST_F(QuantVsLlamaCpp, Q3_K) { agree("Q3_K"); }
TEST_F(QuantVsLlamaCpp, Q5_K) { agree("Q5_K"); }
TEST_F(QuantVsLlamaCpp, IQ4_NL) { agree("IQ4_NL"); }
TEST_F(QuantVsLlamaCpp, IQ4_XS) { agree("IQ4_XS"); }
TEST_F(QuantVsLlamaCpp, BF16) { agree("BF16"); }
TEST_F(QuantVsLlamaCpp, Q4_0) { agree("Q4_0"); }
TEST_F(QuantVsLlamaCpp, Q8_0) { agree("Q8_0"); }
TEST_F(QuantVsLlamaCpp, Q4_K) { agree("Q4_K"); }
TEST_F(QuantVsLlamaCpp, Q6_K) { agree("Q6_K"); }
TEST_F(QuantVsLlamaCpp, F16) { agree("F16"); }

// Many more random blocks than the named inputs, for the formats whose searches have the most float comparisons
// that could tip differently: normal data at several scales, 64 rows of 4096.
TEST_F(QuantVsLlamaCpp, ManyRandomBlocksOfTheSearchingFormats) {
  std::vector<float> x = normal_floats(64 * 4096, 2024);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> log_scale(-6.0f, 3.0f);
  for (size_t b = 0; b < x.size() / 256; b++) {
    const float s = std::pow(10.0f, log_scale(rng));
    for (size_t i = 256 * b; i < 256 * b + 256; i++) x[i] *= s;
  }
  const Input in{"random scales 64x4096", 64, 4096, std::move(x)};
  for (const char* name : {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q4_1", "Q5_1"}) {
    SCOPED_TRACE(name);
    expect_agreement(codec(name), in);
  }
}

}  // namespace
}  // namespace q4t::quant
