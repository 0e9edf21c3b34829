// q4tune's model forward against llama.cpp itself, the reference implementation of GGUF models, run through
// npm's node-llama-cpp CPU prebuilt (install_node_llama.sh installs it, llama_ref.mjs drives it).
// For each architecture (llama, qwen2, qwen3, gemma2, gemma3, phi3; RoPE scaling variants) x output (tied, untied) x weight type (q4_0, f32, and the mixes
// llama-quantize writes: Q4_K_M, and Q4_0 with a Q6_K output matrix): q4tune init-model (and q4tune quantize)
// writes a random model, and the logits at every position of a random id sequence, from q4tune on the CPU and
// on Vulkan, must agree with llama.cpp's: max_v |q4tune - llama.cpp| <= 1e-3 * max_v |llama.cpp| per position.
// The same holds with a random GGUF LoRA adapter applied by both. By default a covering subset of the variants
// runs (kCoveringSubset; without an adapter, every variant with options of its own too); Q4T_FULL_MATRIX=1 runs
// them all.
//
// Quantized models: llama.cpp's CPU matmuls round the activations to Q8_0 before a Q4_0 (or Q8_0) dot product
// and to Q8_K before a Q4_K or Q6_K one (ggml's vec_dot_type), which moves these small random models' logits by a few percent of their max; q4tune
// multiplies f32 activations by the exactly dequantized weights. So the 1e-3 comparison runs llama.cpp on an
// "exact" copy of the model: every quantized matmul weight dequantized to F32 by this file's own decoder (from
// ggml-common.h's block layouts), token_embd.weight kept quantized so that llama.cpp's own decoder (its row
// lookup dequantizes exactly) checks the block layout, and for a tied model an F32 output.weight holding the
// dequantized token_embd (the same model, untied). llama.cpp on the original quantized file is compared with
// `q4tune logits --llama-cpp-numerics`, which rounds the activations the same way. That agrees to ~5e-7 until an
// activation sits on a rounding boundary and the two sides' last-bit differences round it to neighbouring Q8_0
// steps; one such step moves the logits by up to ~1e-2 of their max, and through the keys and values every
// later position. So that comparison is held to kRoundingFlipTolerance, which a misread block layout (1.9) breaks
// by far, and the positions within 1e-3 are reported.
// Needs node >= 20 and npm, and the npm registry the first time; ctest label "interop".
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "interop_util.h"
#include "work_dir.h"

namespace fs = std::filesystem;
namespace gguf = q4t::gguf;

namespace {

using namespace q4t::interop;

constexpr int kSeqLen = 40;          // ids per sequence
constexpr double kTolerance = 1e-3;  // of the position's largest |llama.cpp logit|
constexpr double kRoundingFlipTolerance = 0.05;

struct Agreement {
  double worst_ratio = 0;  // max over positions of max_v |got - want| / max_v |want|
  int worst_position = -1;
  int within_tolerance = 0;  // positions whose ratio is <= kTolerance
};

Agreement compare(const Logits& got, const Logits& want) {
  Agreement a;
  for (size_t p = 0; p < want.size(); ++p) {
    double diff = 0, scale = 0;
    for (size_t v = 0; v < want[p].size(); ++v) {
      diff = std::max(diff, std::abs(got[p][v] - want[p][v]));
      scale = std::max(scale, std::abs(want[p][v]));
    }
    const double ratio = diff / scale;
    a.within_tolerance += ratio <= kTolerance ? 1 : 0;
    if (!(ratio <= a.worst_ratio)) {  // NaN wins too
      a.worst_ratio = ratio;
      a.worst_position = int(p);
    }
  }
  return a;
}

// ---- The exact-arithmetic copy of a quantized model (see the top of the file) ----

float half_to_float(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(float(mantissa), -24);  // zero and subnormals
  else if (exponent == 31)
    magnitude = mantissa ? NAN : INFINITY;
  else
    magnitude = std::ldexp(float(mantissa | 0x400), exponent - 25);
  return sign ? -magnitude : magnitude;
}

uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

// Q4_0 block (18 bytes, 32 weights): f16 d; u8 qs[16]; weight j<16 = ((qs[j] & 0xF) - 8)·d, j>=16 = ((qs[j-16] >> 4) - 8)·d.
// Q8_0 block (34 bytes, 32 weights): f16 d; i8 qs[32]; weight j = qs[j]·d. F16: one half per weight.
// Q4_K block (144 bytes, 256 weights): f16 d; f16 dmin; u8 sm[12]; u8 qs[128]. Sub-block s (32 weights) has a
// 6-bit scale and min: s < 4: sm[s] & 63 and sm[s+4] & 63; s >= 4: (sm[s+4] & 15) | (sm[s-4] >> 6) << 4 and
// (sm[s+4] >> 4) | (sm[s] >> 6) << 4. Its quants are the low (s even) or high (s odd) nibbles of qs[32·(s/2) ...];
// weight = d·scale·q − dmin·min.
// Q6_K block (210 bytes, 256 weights): u8 ql[128]; u8 qh[64]; i8 sc[16]; f16 d. Weight i: half h = i / 128,
// k = i % 128, l = k % 32, quarter g = k / 32; low 4 bits: ql[64h + l + 32·(g & 1)], low nibble for g < 2, high
// for g >= 2; high 2 bits: (qh[32h + l] >> 2g) & 3; weight = d·sc[8h + g·2 + l/16]·(q − 32).
std::vector<float> ggml_dequantize(const gguf::TensorInfo& t);

std::vector<float> dequantize(const gguf::TensorInfo& t) {
  int64_t n = 1;
  for (int64_t d : t.ne) n *= d;
  std::vector<float> w(size_t(n), 0.0f);
  const uint8_t* p = t.data;
  switch (t.type) {
    case gguf::GgmlType::Q4_0:
      for (int64_t b = 0; b < n / 32; ++b, p += 18) {
        const float d = half_to_float(load_u16(p));
        for (int j = 0; j < 16; ++j) {
          w[size_t(b * 32 + j)] = float((p[2 + j] & 0xF) - 8) * d;
          w[size_t(b * 32 + j + 16)] = float((p[2 + j] >> 4) - 8) * d;
        }
      }
      break;
    case gguf::GgmlType::Q8_0:
      for (int64_t b = 0; b < n / 32; ++b, p += 34) {
        const float d = half_to_float(load_u16(p));
        for (int j = 0; j < 32; ++j) w[size_t(b * 32 + j)] = float(int8_t(p[2 + j])) * d;
      }
      break;
    case gguf::GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) w[size_t(i)] = half_to_float(load_u16(p + 2 * i));
      break;
    case gguf::GgmlType::Q4_K:
      for (int64_t b = 0; b < n / 256; ++b, p += 144) {
        const float d = half_to_float(load_u16(p)), dmin = half_to_float(load_u16(p + 2));
        const uint8_t *sm = p + 4, *qs = p + 16;
        for (int sub = 0; sub < 8; ++sub) {
          const int scale = sub < 4 ? sm[sub] & 63 : (sm[sub + 4] & 15) | ((sm[sub - 4] >> 6) << 4);
          const int min = sub < 4 ? sm[sub + 4] & 63 : (sm[sub + 4] >> 4) | ((sm[sub] >> 6) << 4);
          for (int l = 0; l < 32; ++l) {
            const int q = (qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15;
            w[size_t(b * 256 + sub * 32 + l)] = d * float(scale) * float(q) - dmin * float(min);
          }
        }
      }
      break;
    case gguf::GgmlType::Q6_K:
      for (int64_t b = 0; b < n / 256; ++b, p += 210) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
        const float d = half_to_float(load_u16(p + 208));
        for (int i = 0; i < 256; ++i) {
          const int h = i / 128, k = i % 128, l = k % 32, g = k / 32;
          const int lo = (ql[64 * h + l + 32 * (g & 1)] >> (g >= 2 ? 4 : 0)) & 15;
          const int hi = (qh[32 * h + l] >> (2 * g)) & 3;
          w[size_t(b * 256 + i)] = d * float(sc[8 * h + 2 * g + l / 16]) * float((lo | (hi << 4)) - 32);
        }
      }
      break;
    default:
      return ggml_dequantize(t);  // the other formats: llama.cpp's own dequantizer
  }
  return w;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Writes the exact copy of `model` to `out`; false (nothing written) when the model has no quantized tensor.
bool write_exact_copy(const fs::path& model, const fs::path& out) {
  const auto f = gguf::File::open(model.string());
  const bool quantized = std::any_of(f->tensors().begin(), f->tensors().end(),
                                     [](const gguf::TensorInfo& t) { return t.type != gguf::GgmlType::F32; });
  if (!quantized) return false;
  gguf::Writer w;
  for (const auto& [key, value] : f->metadata()) w.set(key, value);
  // gemma2 reads token_embd as its output matrix and refuses an output.weight: its token_embd is dequantized too.
  const bool embd_is_output = f->get_string("general.architecture") == "gemma2";
  for (const gguf::TensorInfo& t : f->tensors()) {
    if (t.type == gguf::GgmlType::F32 || (t.name == "token_embd.weight" && !embd_is_output))
      w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
    else
      w.add_tensor(t.name, t.ne, gguf::GgmlType::F32, f32_bytes(dequantize(t)));
  }
  const gguf::TensorInfo* embd = f->tensor("token_embd.weight");
  if (!f->tensor("output.weight") && embd && embd->type != gguf::GgmlType::F32 && !embd_is_output)
    w.add_tensor("output.weight", embd->ne, gguf::GgmlType::F32, f32_bytes(dequantize(*embd)));
  w.write(out.string());
  return true;
}

// A rank-4 adapter on every attention and MLP projection, A and B both random (a trained B is not zero), written
// in the GGUF LoRA layout llama.cpp loads: <base>.lora_a ne = [n_in, r], <base>.lora_b ne = [r, n_out].
void write_random_adapter(const fs::path& model_path, const fs::path& out, uint32_t seed) {
  constexpr int64_t r = 4;
  constexpr float alpha = 8;
  const auto model = gguf::File::open(model_path.string());
  const std::string arch = model->get_string("general.architecture");
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str(arch));
  w.set("general.type", gguf::Value::str("adapter"));
  w.set("adapter.type", gguf::Value::str("lora"));
  w.set("adapter.lora.alpha", gguf::Value::f32(alpha));
  std::mt19937 rng(seed);  // mt19937 itself is the same everywhere; the <random> distributions are not
  auto random_f32 = [&](int64_t n) {  // uniform in [-0.1, 0.1)
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(0.2 * (double(rng()) / 4294967296.0 - 0.5));
    return f32_bytes(v);
  };
  const uint64_t n_layers = model->get_uint(arch + ".block_count");
  for (uint64_t l = 0; l < n_layers; ++l) {
    int found = 0;  // the seven, or phi3's four with attn_qkv and a fused ffn_up
    for (const char* proj : {"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      const std::string base = "blk." + std::to_string(l) + "." + proj + ".weight";
      const gguf::TensorInfo* t = model->tensor(base);
      if (!t) continue;
      ++found;
      const int64_t n_in = t->ne[0], n_out = t->ne[1];
      w.add_tensor(base + ".lora_a", {n_in, r}, gguf::GgmlType::F32, random_f32(n_in * r));
      w.add_tensor(base + ".lora_b", {r, n_out}, gguf::GgmlType::F32, random_f32(r * n_out));
    }
    ASSERT_GE(found, 4) << "layer " << l << " has too few projections";
  }
  w.write(out.string());
}

// ---- The test ----

// Where install_node_llama.sh put node-llama-cpp, or why it could not; filled once per process.
struct NodeLlama {
  fs::path dir;
  std::string error;
};
NodeLlama g_node_llama;

// A tensor of a format this file has no decoder of, dequantized by llama.cpp's own row function
// (dequantize_row_<type> or ggml_bf16_to_fp32_row of the prebuilt's libggml-base, through dlopen).
std::vector<float> ggml_dequantize(const gguf::TensorInfo& t) {
  static void* lib = [] {
    const fs::path so = fs::path(g_node_llama.dir) / "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so";
    void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) throw std::runtime_error(std::string("dlopen ") + so.string() + ": " + dlerror());
    return h;
  }();
  const std::string type = gguf::type_name(t.type);
  const std::string symbol = type == "bf16" ? "ggml_bf16_to_fp32_row" : "dequantize_row_" + type;
  using RowFn = void (*)(const void*, float*, int64_t);
  const auto fn = reinterpret_cast<RowFn>(dlsym(lib, symbol.c_str()));
  if (!fn) throw std::runtime_error(t.name + ": llama.cpp has no " + symbol);
  int64_t n = 1;
  for (int64_t d : t.ne) n *= d;
  std::vector<float> w(static_cast<size_t>(n), 0.0f);
  fn(t.data, w.data(), n);
  return w;
}

struct Variant {
  const char* arch;
  bool tied;
  // init-model's --type, or "q4_0_quantize": an f32 model converted by `q4tune quantize --type q4_0`, which writes
  // the output matrix as Q6_K as llama-quantize does.
  const char* type;
  uint32_t seed;  // of init-model, the ids and the adapter
  const char* extra = "";  // more init-model options (the architecture's own, RoPE scaling)
  const char* tag = "";    // names them in the test's name
  bool train = true;       // also run AdapterTrainedByQ4tuneTrainMatchesLlamaCpp
  std::string name() const {
    return std::string(arch) + (tied ? "_tied_" : "_untied_") + type + (*tag ? std::string("_") + tag : "");
  }
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name(); }

class LlamaCppAgreement : public ::testing::TestWithParam<Variant> {
 protected:
  // Under ctest the install already ran as the fixture test interop.install_node_llama; this is then instant.
  static void SetUpTestSuite() {
    if (!g_node_llama.dir.empty() || !g_node_llama.error.empty()) return;
    const CmdResult r = run(quoted(fs::path(Q4T_INTEROP_DIR) / "install_node_llama.sh"));
    std::string last_line = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
    last_line = last_line.substr(last_line.find_last_of('\n') + 1);
    if (r.code != 0 || last_line.empty())
      g_node_llama.error = "install_node_llama.sh failed (exit " + std::to_string(r.code) + "):\n" + r.out;
    else
      g_node_llama.dir = last_line;
  }

  void SetUp() override {
    ASSERT_TRUE(g_node_llama.error.empty()) << g_node_llama.error;
    dir_ = fresh_work_dir("q4t-interop");
  }

  void TearDown() override { remove_unless_failed(dir_); }

  fs::path init_model(uint32_t seed) {
    const Variant& v = GetParam();
    const fs::path model = dir_ / "m.gguf";
    const std::string type = v.type;
    const bool quantize = type == "q4_0_quantize";
    // The k-quants need rows of whole 256-weight super-blocks; 4 layers give Q4_K_M both Q4_K and Q6_K layers.
    const bool k_quants = type != "q4_0" && type != "f32";
    const std::string shape = k_quants ? " --dim 256 --ff 512 --layers 4 --heads 4 --kv-heads 2" : "";
    const fs::path written = quantize ? dir_ / "m-f32.gguf" : model;
    CmdResult r = run(std::string(Q4TUNE_BIN) + " init-model --arch " + v.arch + " --type " +
                      (quantize ? "f32" : type) + shape + " " + v.extra + (v.tied ? " --tied" : "") + " --seed " +
                      std::to_string(seed) + " --out " + quoted(written));
    EXPECT_EQ(r.code, 0) << r.out;
    if (quantize) {
      r = run(std::string(Q4TUNE_BIN) + " quantize " + quoted(written) + " " + quoted(model) + " --type q4_0");
      EXPECT_EQ(r.code, 0) << r.out;
    }
    return model;
  }

  // kSeqLen ids drawn uniformly from [3, n_vocab): no <unk>, <s> or </s>, whose handling is not the point here.
  fs::path write_ids(const fs::path& model, uint32_t seed) {
    const auto f = gguf::File::open(model.string());
    const int64_t n_vocab = int64_t(f->get_array("tokenizer.ggml.tokens", gguf::ValueType::STRING).size());
    const uint64_t n_ctx = f->get_uint(f->get_string("general.architecture") + ".context_length");
    EXPECT_GE(n_ctx, uint64_t(kSeqLen)) << "init-model's default context is shorter than the test sequence";
    std::mt19937 rng(seed);
    std::vector<int64_t> ids(kSeqLen);
    for (auto& t : ids) t = 3 + int64_t(rng() % uint32_t(n_vocab - 3));
    const fs::path file = dir_ / "ids.json";
    std::ofstream(file) << nlohmann::json(ids).dump();
    return file;
  }

  Logits q4tune_logits(const fs::path& model, const fs::path& ids, const std::string& device,
                       const std::string& adapter_args, const std::string& extra = "") {
    const fs::path out = dir_ / ("q4tune_" + device + ".json");
    const CmdResult r = run(std::string(Q4TUNE_BIN) + " logits " + quoted(model) + " --ids-file " + quoted(ids) +
                            " --device " + device + adapter_args + extra + " --out " + quoted(out));
    EXPECT_EQ(r.code, 0) << r.out;
    return r.code == 0 ? read_logits(out) : Logits{};
  }

  // llama.cpp's logits of each model, all in one run of llama_ref.mjs.
  std::vector<Logits> llama_cpp_logits(const std::vector<fs::path>& models, const fs::path& ids,
                                       const std::string& lora_args) {
    std::string cmd = "node " + quoted(fs::path(Q4T_INTEROP_DIR) / "llama_ref.mjs") + " --node-llama " +
                      quoted(g_node_llama.dir);
    std::vector<fs::path> outs;
    for (const fs::path& model : models) {
      outs.push_back(dir_ / ("llama_cpp_" + model.stem().string() + ".json"));
      cmd += (outs.size() > 1 ? " --and --model " : " --model ") + quoted(model) + " --ids-file " + quoted(ids) +
             lora_args + " --out " + quoted(outs.back());
    }
    const CmdResult r = run(cmd);
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<Logits> got;
    for (const fs::path& out : outs) got.push_back(r.code == 0 ? read_logits(out) : Logits{});
    return got;
  }

  // The whole comparison for one model, with or without an adapter (scale 0.75).
  void check_agreement(const fs::path& model, const fs::path& ids, const fs::path& adapter) {
    const std::string label = GetParam().name() + (adapter.empty() ? "" : "+lora");
    const std::string scale = "0.75";
    const std::string lora_args = adapter.empty() ? "" : " --lora " + quoted(adapter) + " --lora-scale " + scale;
    const std::string adapter_args =
        adapter.empty() ? "" : " --adapter " + quoted(adapter) + " --adapter-scale " + scale;

    const fs::path exact = dir_ / "exact.gguf";
    const bool quantized = write_exact_copy(model, exact);
    // llama.cpp on the exact copy and (quantized) on the file itself.
    const std::vector<Logits> ref =
        llama_cpp_logits(quantized ? std::vector<fs::path>{exact, model} : std::vector<fs::path>{model}, ids, lora_args);
    const Logits& want = ref[0];
    const Logits cpu = q4tune_logits(model, ids, "cpu", adapter_args);
    const Logits vulkan = q4tune_logits(model, ids, "vulkan", adapter_args);
    ASSERT_FALSE(HasFailure());
    ASSERT_EQ(want.size(), size_t(kSeqLen));
    for (const Logits* got : {&cpu, &vulkan}) {
      ASSERT_EQ(got->size(), want.size());
      for (size_t p = 0; p < got->size(); ++p) ASSERT_EQ((*got)[p].size(), want[0].size()) << "position " << p;
    }

    const Agreement a_cpu = compare(cpu, want), a_vk = compare(vulkan, want);
    std::printf("%-24s worst max|q4tune - llama.cpp| / max|llama.cpp| over %d positions: cpu %.3g (position %d), "
                "vulkan %.3g (position %d)\n",
                label.c_str(), kSeqLen, a_cpu.worst_ratio, a_cpu.worst_position, a_vk.worst_ratio,
                a_vk.worst_position);
    EXPECT_LE(a_cpu.worst_ratio, kTolerance) << "cpu, position " << a_cpu.worst_position;
    EXPECT_LE(a_vk.worst_ratio, kTolerance) << "vulkan, position " << a_vk.worst_position;

    if (quantized) {
      // llama.cpp on the quantized file itself, against q4tune rounding the activations as llama.cpp does.
      const Logits& rounded = ref[1];
      const std::string numerics = " --llama-cpp-numerics";
      const Logits cpu_r = q4tune_logits(model, ids, "cpu", adapter_args, numerics);
      const Logits vk_r = q4tune_logits(model, ids, "vulkan", adapter_args, numerics);
      ASSERT_EQ(rounded.size(), want.size());
      ASSERT_EQ(cpu_r.size(), want.size());
      ASSERT_EQ(vk_r.size(), want.size());
      const Agreement r_cpu = compare(cpu_r, rounded), r_vk = compare(vk_r, rounded), plain = compare(cpu, rounded);
      std::printf("%-24s on the quantized file itself with --llama-cpp-numerics: within 1e-3 at %d/%d (cpu) and "
                  "%d/%d (vulkan) positions, worst cpu %.3g, vulkan %.3g; without it (f32 activations) cpu %.3g\n",
                  label.c_str(), r_cpu.within_tolerance, kSeqLen, r_vk.within_tolerance, kSeqLen, r_cpu.worst_ratio,
                  r_vk.worst_ratio, plain.worst_ratio);
      for (const Agreement* a : {&r_cpu, &r_vk})
        EXPECT_LE(a->worst_ratio, kRoundingFlipTolerance) << "position " << a->worst_position;
    }
  }

  fs::path dir_;
};

TEST_P(LlamaCppAgreement, LogitsMatchLlamaCppAtEveryPosition) {
  const uint32_t seed = GetParam().seed;
  const fs::path model = init_model(seed);
  ASSERT_FALSE(HasFailure());
  check_agreement(model, write_ids(model, seed), {});
}

// The adapter tests, on a smaller default set of variants than the test without one (default_variants).
class LlamaCppAgreementWithAdapter : public LlamaCppAgreement {};

TEST_P(LlamaCppAgreementWithAdapter, LogitsWithALoraAdapterMatchLlamaCpp) {
  const uint32_t seed = GetParam().seed + 100;
  const fs::path model = init_model(seed);
  ASSERT_FALSE(HasFailure());
  const fs::path adapter = dir_ / "adapter.gguf";
  write_random_adapter(model, adapter, seed);
  ASSERT_FALSE(HasFailure());
  check_agreement(model, write_ids(model, seed), adapter);
}

// An adapter trained by `q4tune train` (30 steps on the demo data, so B is far from its zero start), exported
// as adapter.gguf, applied by llama.cpp: the same logits as q4tune's forward with it.
TEST_P(LlamaCppAgreementWithAdapter, AdapterTrainedByQ4tuneTrainMatchesLlamaCpp) {
  if (!GetParam().train) GTEST_SKIP() << "trained once per architecture and weight type, not for every RoPE variant";
  const uint32_t seed = GetParam().seed + 200;
  const fs::path model = init_model(seed);
  ASSERT_FALSE(HasFailure());
  const fs::path run_dir = dir_ / "run";
  const CmdResult t = run(std::string(Q4TUNE_BIN) + " train --model " + quoted(model) + " --data " +
                          quoted(fs::path(Q4T_SOURCE_DIR) / "configs" / "demo.jsonl") + " --out " + quoted(run_dir) +
                          " --device cpu --steps 30 --seq-len 64 --pack --batch-size 2 --lr 1e-2 --lora-rank 8"
                          " --lora-alpha 12 --seed " + std::to_string(seed));
  ASSERT_EQ(t.code, 0) << t.out;
  const fs::path adapter = run_dir / "adapter.gguf", ids = write_ids(model, seed);
  // The training moved the adapter: it changes the logits far beyond the tolerance.
  double moved = 0;
  {
    const Logits base = q4tune_logits(model, ids, "cpu", "");
    const Logits adapted = q4tune_logits(model, ids, "cpu", " --adapter " + quoted(adapter));
    ASSERT_EQ(base.size(), adapted.size());
    moved = compare(base, adapted).worst_ratio;
  }
  EXPECT_GT(moved, 10 * kTolerance);
  check_agreement(model, ids, adapter);
}

// Every variant; Q4T_FULL_MATRIX=1 instantiates them all.
const std::vector<Variant> kAllVariants = {
    Variant{"llama", false, "q4_0", 1}, Variant{"llama", true, "q4_0", 2},
    Variant{"llama", false, "f32", 3}, Variant{"llama", true, "f32", 4},
    Variant{"qwen2", false, "q4_0", 5}, Variant{"qwen2", true, "q4_0", 6},
    Variant{"qwen2", false, "f32", 7}, Variant{"qwen2", true, "f32", 8},
    Variant{"llama", false, "q4_k_m", 9}, Variant{"llama", true, "q4_k_m", 10},
    Variant{"qwen2", false, "q4_k_m", 11},
    Variant{"llama", false, "q4_0_quantize", 12},
    Variant{"qwen2", true, "q4_0_quantize", 13},
    // The other mixes llama-quantize writes (init-model writes each).
    Variant{"llama", false, "q5_k_m", 14}, Variant{"qwen2", true, "q5_k_s", 15},
    Variant{"llama", true, "q3_k_m", 16}, Variant{"qwen2", false, "q2_k", 17},
    Variant{"llama", false, "iq4_xs", 18}, Variant{"qwen2", false, "q4_1", 19},
    Variant{"llama", true, "q5_0", 20}, Variant{"qwen2", false, "bf16", 21},
    // qwen3 (q/k norms, a head size other than dim / heads), and RoPE scaling: llama 3.1's rope_freqs.weight,
    // linear and YaRN.
    Variant{"qwen3", false, "q4_0", 22, "--head-dim 24", "hd24"},
    Variant{"qwen3", true, "q4_k_m", 23},
    Variant{"qwen3", false, "f32", 24, "--rope-scaling yarn:8", "yarn8", false},
    Variant{"llama", false, "f32", 25, "--rope-freqs", "ropefreqs", false},
    Variant{"llama", true, "q4_0", 26, "--rope-scaling yarn:4", "yarn4", false},
    Variant{"qwen2", false, "f32", 27, "--rope-scaling linear:4", "linear4", false},
    // gemma2 (soft-capped scores and logits, every other layer local) and gemma3 (q/k norms, the local layers'
    // own RoPE base), windows shorter than the 40 positions.
    Variant{"gemma2", true, "q4_0", 28, "--attn-softcap 2 --final-softcap 3 --sliding-window 7", "caps"},
    Variant{"gemma2", true, "q4_k_m", 29},
    Variant{"gemma3", false, "q4_0", 30, "--swa-pattern 2 --sliding-window 9", "swa2"},
    Variant{"gemma3", true, "f32", 31,
            "--layers 3 --head-dim 32 --final-softcap 5 --sliding-window 5 "
            "--swa-pattern 3 --rope-scaling linear:8 --rope-base 1000000",
            "linear8", false},
    // phi3: fused attn_qkv and gate-up ffn_up, LoRA on them; LongRoPE's long factors (llama.cpp's context, 256
    // after its padding, exceeds the original 32) and short ones (original 256, context 1024).
    Variant{"phi3", false, "q4_0", 32},
    Variant{"phi3", true, "q4_k_m", 33, "--longrope 32", "longrope_long", false},
    Variant{"phi3", false, "f32", 34, "--longrope 256 --context-length 1024", "longrope_short", false},
    // partial rotary (phi-4-mini rotates 3/4 of each head), with LongRoPE
    Variant{"phi3", true, "q4_0", 35, "--rope-dims 12 --longrope 32", "partial", false},
    Variant{"gemma3", false, "f32", 36, "--rope-dims 10 --swa-pattern 2 --sliding-window 9", "partial", false}};

// The default run's covering subset: every architecture, weight type, tied and untied output, and the
// `q4tune quantize` path of kAllVariants meet each of the three tests (so all of them train). The test without an
// adapter also runs the variants with options of their own (default_variants); the rest (other pairings, and those
// variants with an adapter) run with Q4T_FULL_MATRIX=1.
constexpr std::array<const char*, 14> kCoveringSubset = {
    // the only variant of its weight type
    "llama_untied_q5_k_m", "qwen2_tied_q5_k_s", "llama_tied_q3_k_m", "qwen2_untied_q2_k", "llama_untied_iq4_xs",
    "qwen2_untied_q4_1", "llama_tied_q5_0", "qwen2_untied_bf16",
    "llama_untied_q4_0_quantize",  // quantize's path, with its Q6_K output matrix (untied)
    "qwen2_tied_f32",              // f32: the cheapest of those that train
    // one per remaining architecture, carrying Q4_K_M and Q4_0; gemma2 with its soft-caps and a short window
    "qwen3_tied_q4_k_m", "gemma2_tied_q4_0_caps", "gemma3_untied_q4_0_swa2", "phi3_untied_q4_0"};

// Q4T_FULL_MATRIX=1 in the environment when the tests are listed and run (ctest lists them as it starts:
// tests/interop/CMakeLists.txt).
bool full_matrix() {
  const char* v = std::getenv("Q4T_FULL_MATRIX");
  return v && std::string(v) == "1";
}

bool in_covering_subset(const Variant& v) {
  return std::find(kCoveringSubset.begin(), kCoveringSubset.end(), v.name()) != kCoveringSubset.end();
}

// The covering subset; without an adapter also every variant with init-model options of its own (RoPE scaling
// and partial rotary, qwen3's head size).
std::vector<Variant> default_variants(bool adapter) {
  std::vector<Variant> subset;
  std::copy_if(kAllVariants.begin(), kAllVariants.end(), std::back_inserter(subset),
               [&](const Variant& v) { return in_covering_subset(v) || (!adapter && *v.extra); });
  return subset;
}

std::vector<Variant> instantiated_variants(bool adapter) {
  return full_matrix() ? kAllVariants : default_variants(adapter);
}

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name(); }
INSTANTIATE_TEST_SUITE_P(AllVariants, LlamaCppAgreement, ::testing::ValuesIn(instantiated_variants(false)),
                         variant_name);
INSTANTIATE_TEST_SUITE_P(AllVariants, LlamaCppAgreementWithAdapter, ::testing::ValuesIn(instantiated_variants(true)),
                         variant_name);

// The subset names variants that exist; each of kAllVariants' architectures, weight types and outputs appears in
// it with train set; and the test without an adapter runs every RoPE variant (scaling, rope_freqs, LongRoPE,
// partial rotary, another base) and every other head size by default.
TEST(AgreementMatrix, DefaultSubsetCoversEveryAxisInEachTest) {
  using Axes = std::array<std::set<std::string>, 3>;
  auto axes = [](const Variant& v) { return std::array<std::string, 3>{v.arch, v.type, v.tied ? "tied" : "untied"}; };
  Axes all, covered;
  for (const Variant& v : kAllVariants) {
    const auto a = axes(v);
    for (size_t i = 0; i < a.size(); ++i) {
      all[i].insert(a[i]);
      if (in_covering_subset(v) && v.train) covered[i].insert(a[i]);
    }
  }
  for (const char* name : kCoveringSubset) {
    const auto is = [&](const Variant& v) { return v.name() == name; };
    EXPECT_TRUE(std::any_of(kAllVariants.begin(), kAllVariants.end(), is)) << name << " is no variant";
  }
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(covered[i], all[i]);
  const std::vector<Variant> no_adapter = default_variants(false);
  for (const Variant& v : kAllVariants) {
    const std::string extra = v.extra;
    if (extra.find("rope") == std::string::npos && extra.find("--head-dim") == std::string::npos) continue;
    const auto is = [&](const Variant& d) { return d.name() == v.name(); };
    EXPECT_TRUE(std::any_of(no_adapter.begin(), no_adapter.end(), is)) << v.name() << " is not run without an adapter";
  }
}

}  // namespace
