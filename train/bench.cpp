// q4tune bench: a copy kernel (the memory roofline) and each frozen-linear kernel (Q4_0 by default; Q8_0, F16,
// Q4_K and Q6_K on request) on model-sized shapes, in one run.
// GEMV/dx report GB/s of the bytes they must move (weights + activations) and the fraction of the copy's
// GB/s; GEMMs report TFLOPS. On a GPU, weights rotate through enough copies to exceed the last-level cache,
// so the numbers are from DRAM, not cache.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/threads.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/linear_kernels.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/device_choice.h"

namespace q4t {

std::string mixed_tile_suffixes() {
  std::vector<std::string> named;
  for (const std::string& v : vk::LinearKernels::mixed_variants())
    if (!v.empty()) named.push_back(v);
  std::string text;
  for (size_t i = 0; i < named.size(); ++i)
    text += (i == 0 ? "" : i + 1 == named.size() ? " or " : ", ") + named[i];
  return text;
}

namespace {

// The weights of a case: none, or a format of kernels/formats.h (its code).
enum class Weights : uint32_t { None = 0xFFFFFFFFu };
constexpr Weights weights_of(Format f) { return Weights(uint32_t(f)); }
Format format_of(Weights w) { return Format(uint32_t(w)); }
// Copy: the roofline. Gemv, Gemm, Dx: a format's product as training calls it (LinearKernels' entry points, at
// the bench's --precision). CoopGemm: f16_coop_gemm, the plain f16 x f16 -> f32 tensor-core GEMM (A and W f16 in
// memory; no conversion, no decode), the practical ceiling of the mixed products. MixedGemm, MixedDx: a format's
// mixed product with a named path and tile shape (kernel names <format>_mixed_gemm, <format>_decoded_dx, ...).
// Lora: the six f32 products of a LoRA adapter (rank 16) on a frozen product of the shape, as lora_linear runs them
// (lora_hs, lora_y, lora_dh, lora_db, lora_da, lora_dxa). Decode: W decoded to f16 k-panels alone, the first pass
// of a mixed product that decodes W once (<format>_decode, or <format>_decode_r<R> / _d<R> with tiles of R rows,
// staged through shared memory or stored directly), judged against the copy of the bytes it reads and writes.
// ToF16: rows_to_f16, the mixed products' other first pass (T rows of n_in activations to f16 k-panels, each row
// scaled by a power of two), judged against the copy as well.
enum class Op { Copy, Gemv, Gemm, Dx, CoopGemm, MixedGemm, MixedDx, Lora, Decode, ToF16 };

// A kernel --kernels can name (dx and the routed gemm run at T = 1 and at --tokens, 512 by default; the mixed ones
// at --tokens).
struct KernelInfo {
  std::string name;
  Weights weights;
  Op op;
  bool by_default;  // in the set run when --kernels is not given
};
// copy, <format>_gemv / _gemm / _dx of every format (Q4_0's in the default set), f16_coop_gemm and the LoRA products.
const std::vector<KernelInfo>& kernel_infos() {
  static const std::vector<KernelInfo> k = [] {
    std::vector<KernelInfo> v{{"copy", Weights::None, Op::Copy, true}};
    for (const FormatTraits& f : format_table())
      for (const auto& [suffix, op] : {std::pair{"_gemv", Op::Gemv}, {"_gemm", Op::Gemm}, {"_dx", Op::Dx}})
        v.push_back({std::string(f.name) + suffix, weights_of(f.format), op, f.format == Format::Q4_0});
    for (const FormatTraits& f : format_table())
      v.push_back({std::string(f.name) + "_decode", weights_of(f.format), Op::Decode, false});
    v.push_back({"f16_coop_gemm", weights_of(Format::F16), Op::CoopGemm, false});
    v.push_back({"rows_to_f16", Weights::None, Op::ToF16, false});
    for (const char* l : {"lora_hs", "lora_y", "lora_dh", "lora_db", "lora_da", "lora_dxa"})
      v.push_back({l, Weights::None, Op::Lora, false});
    return v;
  }();
  return k;
}
constexpr int64_t kLoraRank = 16;

// The mixed kernels by path: fused (each tile decoded in the GEMM) or decoded (W decoded to f16 rows once per
// product, then the F16 GEMM); with a tile-shape suffix of LinearKernels::mixed_variants.
const char* const kMixedPaths[] = {"mixed", "decoded"};

Weights weights_named(const std::string& f) {
  const FormatTraits* t = find_format(f);
  return t ? weights_of(t->format) : Weights::None;
}

struct Case {
  std::string kernel;
  int64_t n_out, n_in, T;
  Weights weights = Weights::None;
  Op op = Op::Copy;
  bool decoded = false;   // MixedGemm / MixedDx: through a decoded f16 copy of W
  // CoopGemm / MixedGemm / MixedDx: the tile shape's suffix ("" the default); Decode: "r<R>" or "d<R>"; ToF16: U.
  std::string variant;
};

struct Result {
  Case c;
  double us = 0, gbps = 0, tflops = 0, roofline_frac = 0, ceiling_frac = 0;
  bool has_gbps = false, has_tflops = false, has_roofline = false, has_ceiling = false;
};

const char* kDefaultShapes[] = {"4096x4096", "4096x14336", "14336x4096", "16384x16384"};
constexpr size_t kCopyBytes = size_t(512) << 20;
constexpr size_t kRotateBytes = size_t(320) << 20;  // > 2x the largest GPU last-level cache we know of

std::pair<int64_t, int64_t> parse_shape(const std::string& s) {
  const auto x = s.find('x');
  try {
    if (x != std::string::npos) {
      size_t p1 = 0, p2 = 0;
      const int64_t a = std::stoll(s.substr(0, x), &p1), b = std::stoll(s.substr(x + 1), &p2);
      if (p1 == x && p2 == s.size() - x - 1 && a > 0 && b > 0) return {a, b};
    }
  } catch (const std::exception&) {
  }
  throw std::invalid_argument("--shapes: '" + s + "' is not N_OUTxN_IN (e.g. 4096x14336)");
}

int64_t weight_row_bytes(Weights w, int64_t n_in) { return w == Weights::None ? 0 : row_bytes(format_of(w), n_in); }

// The kernel --kernels names: one of kKernels, or <format>_<mixed|decoded>_<gemm|dx>[tile], or
// f16_coop_gemm[tile].
Case kernel_case(const std::string& name) {
  for (const KernelInfo& k : kernel_infos())
    if (name == k.name) return {name, 0, 0, 0, k.weights, k.op};
  if (name.rfind("rows_to_f16_u", 0) == 0 && name.size() > 13 && name.size() <= 15 &&
      std::all_of(name.begin() + 13, name.end(), ::isdigit)) {
    const unsigned u = unsigned(std::stoul(name.substr(13)));
    if (u == 0 || u > 16) throw std::invalid_argument("--kernels: " + name + ": the loads in flight must be 1 to 16");
    return {name, 0, 0, 0, Weights::None, Op::ToF16, false, name.substr(13)};
  }
  if (const auto d = name.rfind("_decode_"); d != std::string::npos && name.size() > d + 9) {
    const char how = name[d + 8];  // r: staged through shared memory, d: stored directly
    const std::string r = name.substr(d + 9);
    const Weights w = weights_named(name.substr(0, d));
    const bool digits = r.size() <= 3 && std::all_of(r.begin(), r.end(), ::isdigit);
    if (w != Weights::None && (how == 'r' || how == 'd') && digits) {
      const unsigned rows = unsigned(std::stoul(r));
      if (rows == 0 || rows > 128 || (rows & (rows - 1)) != 0)
        throw std::invalid_argument("--kernels: " + name +
                                    ": the decode's rows per workgroup must be a power of two up to 128");
      return {name, 0, 0, 0, w, Op::Decode, false, name.substr(d + 8)};
    }
  }
  for (const std::string& t : vk::LinearKernels::mixed_variants()) {
    if (!t.empty() && name == "f16_coop_gemm" + t)
      return {name, 0, 0, 0, weights_of(Format::F16), Op::CoopGemm, false, t};
    for (const char* path : kMixedPaths)
      for (const char* op : {"gemm", "dx"}) {
        const std::string tail = std::string("_") + path + "_" + op + t;
        if (name.size() <= tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail) != 0) continue;
        const Weights w = weights_named(name.substr(0, name.size() - tail.size()));
        if (w == Weights::None || (std::string(path) == "decoded" && !t.empty())) continue;
        return {name, 0, 0, 0, w, std::string(op) == "gemm" ? Op::MixedGemm : Op::MixedDx, std::string(path) == "decoded", t};
      }
  }
  std::string known;
  for (const KernelInfo& k : kernel_infos()) known += std::string(known.empty() ? "" : ", ") + k.name;
  throw std::invalid_argument("--kernels: unknown kernel '" + name + "' (known: " + known +
                              ", <format>_mixed_gemm, <format>_mixed_dx, <format>_decoded_gemm, <format>_decoded_dx, "
                              "<format>_decode_r<R>, <format>_decode_d<R>, rows_to_f16_u<U> and f16_coop_gemm or "
                              "a mixed kernel with a tile suffix " + mixed_tile_suffixes() + ")");
}

void check_shape(Weights w, int64_t n_out, int64_t n_in) {
  if (w != Weights::None) check_gpu_frozen_linear(format_of(w), "bench", n_out, n_in, 1);
}

bool is_product(Op op) { return op == Op::Gemm || op == Op::Dx || op == Op::MixedGemm || op == Op::MixedDx; }

// The LoRA product named k at T tokens on an n_out x n_in frozen product, as autograd/ops/linear.cpp's lora_forward
// and lora_backward run it: the large operand X [rows, cols] (the frozen product's input or output), the small one,
// and the kernel (LinearKernels::lora_rows, lora_cols or lora_wide) with its layout flag.
struct LoraProduct {
  int64_t rows, cols;  // X
  char kernel;         // 'r' lora_rows, 'c' lora_cols, 'w' lora_wide
  bool flag;           // b_kr, out_rn or b_rn
};
LoraProduct lora_product(const std::string& k, int64_t T, int64_t n_out, int64_t n_in) {
  if (k == "lora_hs") return {T, n_in, 'r', false};   // hs = s·xa·Aᵀ
  if (k == "lora_y") return {T, n_out, 'w', false};   // y += hs·Bᵀ
  if (k == "lora_dh") return {T, n_out, 'r', true};   // dh = s·dy·B
  if (k == "lora_db") return {T, n_out, 'c', false};  // dB += dyᵀ·hs
  if (k == "lora_da") return {T, n_in, 'c', true};    // dA += dhᵀ·xa
  return {T, n_in, 'w', true};                        // dxa += dh·A
}

// Per shape: f16_coop_gemm first where a product of many tokens asks for its ceiling (tensor cores only), then the
// kernels as listed.
std::vector<Case> make_cases(const BenchOptions& opt, bool coop) {
  if (opt.tokens < 2) throw std::invalid_argument("--tokens: must be at least 2 (one token is the GEMV's case)");
  std::vector<std::string> kernels = opt.kernels;
  if (kernels.empty())
    for (const KernelInfo& k : kernel_infos())
      if (k.by_default) kernels.push_back(k.name);
  std::vector<Case> named;
  for (const auto& k : kernels) named.push_back(kernel_case(k));
  std::vector<std::string> shapes = opt.shapes;
  if (shapes.empty()) shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  std::vector<Case> cases;
  if (std::find(kernels.begin(), kernels.end(), "copy") != kernels.end()) cases.push_back({"copy", 0, 0, 0});
  for (const auto& s : shapes) {
    const auto [n_out, n_in] = parse_shape(s);
    const bool ceiling_listed = std::any_of(named.begin(), named.end(), [](const Case& c) { return c.kernel == "f16_coop_gemm"; });
    const bool wants_ceiling = coop && std::any_of(named.begin(), named.end(), [](const Case& c) { return is_product(c.op); });
    if (wants_ceiling && !ceiling_listed)
      cases.push_back({"f16_coop_gemm", n_out, n_in, opt.tokens, weights_of(Format::F16), Op::CoopGemm});
    for (Case c : named) {
      if (c.op == Op::Copy) continue;
      check_shape(c.weights, n_out, n_in);
      c.n_out = n_out;
      c.n_in = n_in;
      if (c.op == Op::Lora || c.op == Op::ToF16) {
        cases.push_back([&] { Case many = c; many.T = opt.tokens; return many; }());
        continue;
      }
      const bool one_token = c.op == Op::Gemv || c.op == Op::Decode, both = c.op == Op::Dx;
      if (one_token || both) cases.push_back([&] { Case one = c; one.T = 1; return one; }());
      if (!one_token) cases.push_back([&] { Case many = c; many.T = opt.tokens; return many; }());
    }
  }
  return cases;
}

// Bytes a kernel must move at least: the weights once, activations in and out (a decode: its f16 out).
double min_bytes(const Case& c) {
  if (c.op == Op::Decode)
    return double(c.n_out * weight_row_bytes(c.weights, c.n_in)) + 2.0 * double(c.n_out * c.n_in);
  if (c.op == Op::ToF16) return 6.0 * double(c.T * c.n_in);
  return double(c.n_out * weight_row_bytes(c.weights, c.n_in)) + 4.0 * double(c.T) * double(c.n_in + c.n_out);
}

void finish(Result& r, double seconds, double copy_gbps) {
  r.us = seconds * 1e6;
  if (r.c.kernel == "copy") {
    r.gbps = 2.0 * double(kCopyBytes) / seconds / 1e9;
    r.has_gbps = true;
    r.roofline_frac = 1.0;
    r.has_roofline = true;
    return;
  }
  r.gbps = min_bytes(r.c) / seconds / 1e9;
  r.has_gbps = true;
  // Memory-bound kernels (one token) are judged against the copy; GEMMs (T > 1) are compute-bound and report
  // TFLOPS instead.
  if ((r.c.T == 1 || r.c.op == Op::ToF16) && copy_gbps > 0) {
    r.roofline_frac = r.gbps / copy_gbps;
    r.has_roofline = true;
  }
  if (r.c.T > 1 && r.c.op != Op::ToF16) {
    r.tflops = 2.0 * double(r.c.T) * double(r.c.n_out) * double(r.c.n_in) / seconds / 1e12;
    r.has_tflops = true;
  }
}

void quantize(Weights kind, std::span<uint8_t> w, const std::vector<float>& f, int64_t n_out, int64_t n_in) {
  const FormatTraits& t = format_traits(format_of(kind));
  const int64_t rb = row_bytes(t.format, n_in);
  for (int64_t r = 0; r < n_out; ++r) t.quantize_row(w.data() + r * rb, f.data() + r * n_in, n_in);
}

// Uniform(-1, 1) weights in the kind's format. Rows are made in parallel, each group of rows from its own seed
// (the same bytes for any thread count): the K-quant quantisers take half a minute per 16384 x 16384 matrix on
// one core. The last matrix is kept, since consecutive cases (gemv, dx at T = 1 and T = 512) share it.
const std::vector<uint8_t>& random_weights(Weights kind, int64_t n_out, int64_t n_in) {
  static std::tuple<Weights, int64_t, int64_t> last_key{Weights::None, 0, 0};
  static std::vector<uint8_t> last;
  if (last_key == std::make_tuple(kind, n_out, n_in)) return last;
  constexpr int64_t kRowsPerSeed = 64;
  const int64_t rb = weight_row_bytes(kind, n_in);
  last.assign(size_t(n_out * rb), 0);
  cpu::parallel_for((n_out + kRowsPerSeed - 1) / kRowsPerSeed, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      const int64_t r0 = g * kRowsPerSeed, rows = std::min(kRowsPerSeed, n_out - r0);
      std::mt19937 rng(uint32_t(7 + g));
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<float> f(static_cast<size_t>(rows * n_in));
      for (float& v : f) v = u(rng);
      quantize(kind, std::span<uint8_t>(last.data() + r0 * rb, size_t(rows * rb)), f, rows, n_in);
    }
  });
  last_key = {kind, n_out, n_in};
  return last;
}

std::vector<float> random_acts(int64_t n) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// --- Vulkan: timestamps around `reps` dispatches recorded back to back ---------------------------------------

// The GPU drops its clocks while the host prepares a case (quantising a large matrix takes seconds), and
// takes a while to raise them again: keep it busy for kWarmupSeconds before timing anything.
constexpr double kWarmupSeconds = 0.3;

double time_vulkan(vk::Device& dev, double budget_s, const std::function<void(vk::Sequence&, int)>& record_one) {
  auto record = [&](vk::Sequence& s, int reps) {
    s.begin();
    s.timestamp();
    for (int i = 0; i < reps; ++i) record_one(s, i);
    s.timestamp();
    s.end();
  };
  vk::Sequence probe(dev, 2);
  record(probe, 2);
  const auto start = std::chrono::steady_clock::now();
  double one = 1e30;
  do {
    probe.run();
    one = std::min(one, probe.elapsed_ns(0, 1) * 1e-9 / 2);
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < kWarmupSeconds);

  const int reps = int(std::clamp(budget_s / 3 / std::max(one, 1e-7), 3.0, 200.0));
  vk::Sequence s(dev, 2);
  record(s, reps);
  s.run();
  double best = 1e30;
  for (int k = 0; k < 3; ++k) {
    s.run();
    best = std::min(best, s.elapsed_ns(0, 1) * 1e-9 / reps);
  }
  return best;
}

// W as the device holds it (Q6_K regrouped, kernels/shapes.h; the others as they are), in enough copies to rotate
// through more than the last-level cache.
std::vector<vk::Buffer> device_weights(vk::Device& dev, const Case& c) {
  const auto& w_ggml = random_weights(c.weights, c.n_out, c.n_in);
  std::vector<uint8_t> w_grouped;
  const bool frozen = c.weights != Weights::None;
  if (frozen) w_grouped = to_device_layout(format_of(c.weights), w_ggml);
  const std::vector<uint8_t>& w_host = frozen ? w_grouped : w_ggml;
  const size_t n_copies = std::clamp<size_t>(kRotateBytes / w_host.size() + 1, 1, 32);
  std::vector<vk::Buffer> ws;
  for (size_t i = 0; i < n_copies; ++i) {
    ws.emplace_back(dev, w_host.size());
    ws.back().upload(w_host);
  }
  return ws;
}

size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// f16_coop_gemm and the explicit mixed kernels: Y = X·Wᵀ (or dX = dY·W) at the shape's K and N, through the A rows
// pass and, on the decoded path, W's decode (both timed; f16_coop_gemm times the product alone, its A made once).
double time_mixed(vk::Device& dev, vk::LinearKernels& k, const Case& c, double budget_s) {
  const bool dx = c.op == Op::MixedDx;
  const Format f = format_of(c.weights);
  const int64_t K = dx ? c.n_out : c.n_in, N = dx ? c.n_in : c.n_out;
  const auto ws = device_weights(dev, c);
  const size_t split = align16(k.mixed_split_bytes(c.T, N, K, c.variant));
  vk::Buffer scratch(dev, split + vk::LinearKernels::f16_rows_bytes(c.T, K));
  vk::Buffer in(dev, size_t(c.T * K) * 4), out(dev, size_t(c.T * N) * 4);
  in.upload(random_acts(c.T * K));
  out.fill_zero();
  std::unique_ptr<vk::Buffer> w16;  // the decoded path's (and f16_coop_gemm's) f16 k-panels
  if (c.decoded || c.op == Op::CoopGemm) w16 = std::make_unique<vk::Buffer>(dev, size_t(c.n_out * c.n_in) * 2);
  const vk::Buffer* split_buf = split > 0 ? &scratch : nullptr;
  if (c.op == Op::CoopGemm) {
    // Both operands f16 in k-panels (the layout the GEMM reads fastest), made once.
    vk::Sequence prep(dev);
    prep.begin();
    vk::LinearKernels::F16Rows a = k.to_f16(prep, scratch, split, in, c.T, K, K, 0);
    const auto w = k.decode_f16(Format::F16, prep, *w16, 0, ws[0], c.n_out, c.n_in, 0);
    prep.end();
    prep.run();
    a.s_base = vk::LinearKernels::kNoScales;
    return time_vulkan(dev, budget_s, [&](vk::Sequence& seq, int) {
      k.mixed_product(false, seq, out, a, w, N, c.n_in, false, split_buf, c.variant);
    });
  }
  return time_vulkan(dev, budget_s, [&](vk::Sequence& seq, int i) {
    const vk::Buffer& w = ws[size_t(i) % ws.size()];
    vk::LinearKernels::MixedW wv{f, &w};
    if (c.decoded) wv = k.decode_f16(f, seq, *w16, 0, w, c.n_out, c.n_in, 0);
    const auto a = k.to_f16(seq, scratch, split, in, c.T, K, K, 0);
    k.mixed_product(dx, seq, out, a, wv, N, c.n_in, false, split_buf, c.variant);
  });
}

Result bench_vulkan_case(vk::Device& dev, vk::LinearKernels& k, const Case& c, double budget_s, double copy_gbps) {
  Result r{c};
  if (c.kernel == "copy") {
    vk::Buffer a(dev, kCopyBytes), b(dev, kCopyBytes);
    a.fill_zero();
    finish(r, time_vulkan(dev, budget_s, [&](vk::Sequence& s, int) { k.copy(s, b, a, kCopyBytes); }), 0);
    return r;
  }
  if (c.op == Op::CoopGemm || c.op == Op::MixedGemm || c.op == Op::MixedDx) {
    finish(r, time_mixed(dev, k, c, budget_s), copy_gbps);
    return r;
  }
  if (c.op == Op::ToF16) {
    vk::Buffer in(dev, size_t(c.T * c.n_in) * 4), out(dev, vk::LinearKernels::f16_rows_bytes(c.T, c.n_in));
    in.upload(random_acts(c.T * c.n_in));
    finish(r, time_vulkan(dev, budget_s, [&](vk::Sequence& seq, int) {
             k.to_f16(seq, out, 0, in, c.T, c.n_in, c.n_in, 0,
                      c.variant.empty() ? 0 : uint32_t(std::stoul(c.variant)));
           }), copy_gbps);
    return r;
  }
  if (c.op == Op::Decode) {
    const auto ws = device_weights(dev, c);
    vk::Buffer w16(dev, size_t(c.n_out * c.n_in) * 2);
    const uint32_t tile_rows = c.variant.empty() ? 0 : uint32_t(std::stoul(c.variant.substr(1)));
    const bool staged = c.variant.empty() || c.variant[0] == 'r';
    finish(r, time_vulkan(dev, budget_s, [&](vk::Sequence& seq, int i) {
             k.decode_f16(format_of(c.weights), seq, w16, 0, ws[size_t(i) % ws.size()], c.n_out, c.n_in, 0, tile_rows,
                          staged);
           }), copy_gbps);
    return r;
  }
  if (c.op == Op::Lora) {
    const LoraProduct lp = lora_product(c.kernel, c.T, c.n_out, c.n_in);
    const int64_t rank = kLoraRank, big = lp.rows * lp.cols, small = lp.cols * rank;
    const int64_t outs = lp.kernel == 'c' ? small : lp.kernel == 'r' ? lp.rows * rank : big;
    vk::Buffer x(dev, size_t(big) * 4), h(dev, size_t(lp.rows * rank) * 4), b(dev, size_t(small) * 4);
    vk::Buffer o(dev, size_t(outs) * 4);
    x.upload(random_acts(big));
    h.upload(random_acts(lp.rows * rank));
    b.upload(random_acts(small));
    o.fill_zero();
    vk::Buffer split(dev, std::max<size_t>({4, vk::LinearKernels::lora_cols_scratch_bytes(lp.rows, lp.cols, rank),
                                            vk::LinearKernels::lora_rows_scratch_bytes(lp.rows, lp.cols, rank)}));
    finish(r, time_vulkan(dev, budget_s, [&](vk::Sequence& seq, int) {
             if (lp.kernel == 'r') k.lora_rows(seq, o, x, b, lp.rows, lp.cols, lp.cols, rank, lp.flag, false, 0.5f, &split);
             if (lp.kernel == 'c') k.lora_cols(seq, o, x, h, lp.rows, lp.cols, lp.cols, rank, lp.flag, true, 1.0f, &split);
             if (lp.kernel == 'w') k.lora_wide(seq, o, h, b, lp.rows, lp.cols, rank, lp.flag, true, 1.0f);
           }), copy_gbps);
    // Its bytes: the large operand once (read and written for the wide products), the small ones once.
    r.gbps = (4.0 * double(big) * (lp.kernel == 'w' ? 2 : 1) + 4.0 * double(small + lp.rows * rank)) / (r.us * 1e-6) / 1e9;
    r.has_tflops = false;
    return r;
  }
  const auto ws = device_weights(dev, c);
  const bool dx = c.op == Op::Dx;
  const int64_t in_elems = c.T * (dx ? c.n_out : c.n_in);
  const int64_t out_elems = c.T * (dx ? c.n_in : c.n_out);
  vk::Buffer in(dev, size_t(in_elems) * 4), out(dev, size_t(out_elems) * 4);
  in.upload(random_acts(in_elems));
  out.fill_zero();
  vk::Buffer scratch(dev, std::max<size_t>(4, k.frozen_scratch_bytes(format_of(c.weights), c.T, c.n_out, c.n_in)));
  const double s = time_vulkan(dev, budget_s, [&](vk::Sequence& seq, int i) {
    const vk::Buffer& w = ws[size_t(i) % ws.size()];
    if (dx)
      k.dx(format_of(c.weights), seq, out, w, in, &scratch, c.T, c.n_out, c.n_in, 0, c.n_out, false);
    else
      k.gemm(format_of(c.weights), seq, out, w, in, c.T, c.n_out, c.n_in, &scratch);
  });
  finish(r, s, copy_gbps);
  return r;
}

// --- CPU: wall clock over repeated calls ---------------------------------------------------------------------

double time_cpu(double budget_s, const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  fn();  // warm-up: page-in, thread start
  double best = 1e30, spent = 0;
  int runs = 0;
  while (runs < 3 || (spent < budget_s && runs < 1000)) {
    const auto t0 = clock::now();
    fn();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, dt);
    spent += dt;
    ++runs;
  }
  return best;
}

Result bench_cpu_case(const Case& c, double budget_s, double copy_gbps, Precision precision) {
  Result r{c};
  if (c.kernel == "copy") {
    std::vector<char> a(kCopyBytes, 1), b(kCopyBytes, 0);
    const double s = time_cpu(budget_s, [&] {
      cpu::parallel_for(int64_t(kCopyBytes), 1 << 20, [&](int64_t lo, int64_t hi) {
        std::memcpy(b.data() + lo, a.data() + lo, size_t(hi - lo));
      });
    });
    finish(r, s, 0);
    return r;
  }
  const auto& w = random_weights(c.weights, c.n_out, c.n_in);
  const bool dx = c.op == Op::Dx;
  const auto in = random_acts(c.T * (dx ? c.n_out : c.n_in));
  std::vector<float> out(size_t(c.T * (dx ? c.n_in : c.n_out)));
  const double s = time_cpu(budget_s, [&] {
    if (dx)
      cpu::frozen_dx(format_of(c.weights), out, w, in, c.T, c.n_out, c.n_in, 0, c.n_out, false);
    else
      cpu::frozen_gemm(format_of(c.weights), out, w, in, c.T, c.n_out, c.n_in, precision);
  });
  finish(r, s, copy_gbps);
  return r;
}

std::string format_row(const Result& r) {
  char buf[256];
  const std::string shape = r.c.kernel == "copy" ? std::to_string(kCopyBytes >> 20) + " MiB"
                                                 : std::to_string(r.c.n_out) + "x" + std::to_string(r.c.n_in);
  char tflops[32] = "-", frac[32] = "-";
  if (r.has_tflops) std::snprintf(tflops, sizeof tflops, "%.2f", r.tflops);
  if (r.has_roofline) std::snprintf(frac, sizeof frac, "%.1f%%", 100.0 * r.roofline_frac);
  std::snprintf(buf, sizeof buf, "%-22s %-12s T=%-4lld %11.1f us %9.1f GB/s %7s TFLOPS %7s of copy",
                r.c.kernel.c_str(), shape.c_str(), (long long)r.c.T, r.us, r.gbps, tflops, frac);
  std::string row = buf;
  if (r.has_ceiling) {
    std::snprintf(buf, sizeof buf, " %6.1f%% of f16_coop_gemm", 100.0 * r.ceiling_frac);
    row += buf;
  }
  return row;
}

nlohmann::json to_json(const Result& r, const std::string& device) {
  nlohmann::json j;
  j["kernel"] = r.c.kernel;
  j["n_out"] = r.c.n_out;
  j["n_in"] = r.c.n_in;
  j["T"] = r.c.T;
  j["us"] = r.us;
  j["gbps"] = r.has_gbps ? nlohmann::json(r.gbps) : nlohmann::json(nullptr);
  j["tflops"] = r.has_tflops ? nlohmann::json(r.tflops) : nlohmann::json(nullptr);
  j["roofline_frac"] = r.has_roofline ? nlohmann::json(r.roofline_frac) : nlohmann::json(nullptr);
  j["ceiling_frac"] = r.has_ceiling ? nlohmann::json(r.ceiling_frac) : nlohmann::json(nullptr);
  j["device"] = device;
  return j;
}

}  // namespace

BenchJson::BenchJson(const std::string& path) : path_(path) {
  if (path_.empty()) return;
  file_.open(path_ + ".tmp");
  if (!file_) throw std::runtime_error("--json: cannot write " + path_ + ".tmp");
}

void BenchJson::write(const nlohmann::json& rows) {
  if (path_.empty()) return;
  file_ << rows.dump(2) << "\n";
  file_.close();
  if (!file_ || std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0)
    throw std::runtime_error("--json: cannot write " + path_);
}

int run_bench(const DeviceChoice& dev, const BenchOptions& opt, std::ostream& out) {
  const bool coop = !dev.is_cpu() && dev.vulkan->coop_matrix();
  std::vector<Case> cases = make_cases(opt, coop);
  if (dev.is_cpu())
    for (const Case& c : cases)
      if (c.op == Op::CoopGemm || c.op == Op::MixedGemm || c.op == Op::MixedDx || c.op == Op::Decode ||
          c.op == Op::ToF16)
        throw std::invalid_argument("--kernels: " + c.kernel + " runs on Vulkan devices only");
  // The roofline is always measured in the same run, first, even when --kernels leaves copy out.
  const bool copy_listed = !cases.empty() && cases.front().kernel == "copy";
  if (!copy_listed) cases.insert(cases.begin(), {"copy", 0, 0, 0});
  BenchJson json(opt.json_path);
  out << "bench on " << dev.name();
  if (dev.is_cpu()) {
    out << " (" << cpu::num_threads() << " threads)";
    if (opt.precision == Precision::Mixed) {
      if (!cpu::has_mixed(Format::Q4_0))
        throw std::invalid_argument("--precision mixed: this CPU's kernels have no integer loops (they need AVX2)");
      out << " (mixed: products under " << cpu::kMixedTokens
          << " tokens round the activation to 8-bit blocks and sum in integers)";
    }
  }
  if (!dev.is_cpu()) {
    out << (!dev.vulkan->coop_matrix()      ? " (no cooperative matrices: every GEMM on FP32 FMAs)"
            : dev.vulkan->coop_matrix_khr() ? " (GEMMs on tensor cores: VK_NV_cooperative_matrix, the mixed ones "
                                              "VK_KHR_cooperative_matrix)"
                                            : " (GEMMs on tensor cores: VK_NV_cooperative_matrix)");
    if (dev.vulkan->integer_dot())
      out << " (GEMVs of 2^25 weights and more on 8-bit integer dot products, activations in "
          << (opt.precision == Precision::Mixed ? "16" : "24") << "-bit limbs)";
    if (dev.vulkan->float16()) out << " (Q4_0 and Q4_K one-token dx decoding through f16 pairs)";
    out << " (" << dev.vulkan->properties().limits.maxComputeSharedMemorySize / 1024 << " KiB of shared memory per workgroup)";
  }
  out << "\n";

  std::unique_ptr<vk::LinearKernels> kernels;
  if (!dev.is_cpu()) {
    kernels = std::make_unique<vk::LinearKernels>(*dev.vulkan);
    kernels->set_precision(opt.precision);
  }
  double copy_gbps = 0;
  std::map<std::pair<int64_t, int64_t>, double> ceiling;  // f16_coop_gemm's TFLOPS per shape, this run
  nlohmann::json rows = nlohmann::json::array();
  for (const Case& c : cases) {
    Result r = dev.is_cpu() ? bench_cpu_case(c, opt.seconds_per_case, copy_gbps, opt.precision)
                            : bench_vulkan_case(*dev.vulkan, *kernels, c, opt.seconds_per_case, copy_gbps);
    if (c.kernel == "copy") copy_gbps = r.gbps;
    const auto shape = std::make_pair(c.n_out, c.n_in);
    if (c.kernel == "f16_coop_gemm") ceiling[shape] = r.tflops;
    if (r.has_tflops && c.kernel != "f16_coop_gemm" && ceiling.count(shape)) {
      r.ceiling_frac = r.tflops / ceiling[shape];
      r.has_ceiling = true;
    }
    out << format_row(r) << std::endl;
    rows.push_back(to_json(r, dev.name()));
  }
  json.write(rows);
  return 0;
}

Command add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench",
                                 "Benchmark the copy roofline and the Q4_0 kernels (GEMV, GEMM at --tokens, dx at "
                                 "T=1 and at --tokens) on model-sized shapes");
  const auto dev = add_device_flags(cmd, /*with_precision=*/false);
  cmd->add_option("--kernels", o->kernels, "comma-separated subset of copy,q4_0_gemv,q4_0_gemm,q4_0_dx (the default set) and "
                  "<format>_gemv, <format>_gemm, <format>_dx for every other format (" + format_list() + "); "
                  "f16_coop_gemm (the plain f16 tensor-core GEMM: the ceiling each product at --tokens is compared "
                  "with); lora_hs, lora_y, lora_dh, lora_db, lora_da, lora_dxa (a rank-16 adapter's products); <format>_mixed_gemm, <format>_mixed_dx (each tile decoded in the GEMM) and "
                  "<format>_decoded_gemm, <format>_decoded_dx (W decoded to f16 first), <format>_decode (that decode "
                  "alone; _r<R>, _d<R>: R rows per workgroup, staged through shared memory or not), "
                  "rows_to_f16[_u<U>] (--tokens rows of N_IN activations to f16, the products' other first pass; U "
                  "loads in flight), f16_coop_gemm and the <format>_mixed_* kernels with a tile suffix " +
                  mixed_tile_suffixes() + " (Vulkan only)")
      ->delimiter(',');
  cmd->add_option_function<std::string>(
         "--precision", [o](const std::string& v) { o->precision = parse_precision(v, "--precision"); },
         "f32 or mixed: on Vulkan, the numerics of the gemm and dx kernels at --tokens, and of the one-token "
         "GEMVs' activations (24-bit or 16-bit integers); on the CPU, mixed rounds the activation of the GEMVs "
         "(and of gemms under 12 tokens) to 8-bit blocks and sums in integers (default f32)");
  cmd->add_option("--shapes", o->shapes,
                  "comma-separated N_OUTxN_IN shapes (default 4096x4096,4096x14336,14336x4096,16384x16384)")
      ->delimiter(',');
  cmd->add_option("--json", o->json_path, "also write the results as a JSON array to this file");
  cmd->add_option("--tokens", o->tokens, "tokens (T) of the GEMM and dx cases")->capture_default_str();
  cmd->add_option("--seconds", o->seconds_per_case, "time budget per case")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();
  set_examples(cmd, "  q4tune bench --kernels copy,q4_k_gemv,q4_k_gemm --shapes 4096x4096 --precision mixed");
  const Command train = add_bench_train(*cmd);
  return {cmd, [o, dev, train] {
            if (!*train.cmd) return run_bench(dev->open(), *o, std::cout);
            if (!o->kernels.empty() || !o->shapes.empty() || !o->json_path.empty())
              throw std::invalid_argument("bench train: give its options after `train` (--kernels and --shapes belong to the kernel bench)");
            return train.run();
          }};
}

}  // namespace q4t
