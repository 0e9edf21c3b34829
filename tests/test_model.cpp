// The llama-family model over GGUF weights: whole-model gradient checks for the LoRA parameters of every target
// (llama, qwen2, qwen3, gemma3, phi3), the memory of a loaded model (quantized weights stay quantized), and bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>
#include <map>
#include <sstream>

#include "autograd/gradcheck.h"
#include "kernels/shapes.h"
#include "malformed_gguf.h"
#include "train/commands.h"
#include "train/model/model.h"
#include "scratch_dir.h"

namespace q4t::model {
namespace {

namespace fs = std::filesystem;

std::string temp_dir() { return test::process_scratch_dir("q4t_test_model_"); }

std::string tiny_model(const std::string& arch, const std::string& type, bool tied) {
  const std::string path = temp_dir() + "/" + arch + "_" + type + (tied ? "_tied" : "") + ".gguf";
  if (!fs::exists(path)) {
    InitModelOptions o;
    o.arch = arch;
    o.type = type;
    o.tied = tied || arch == "gemma2";  // gemma2 always reads token_embd as its output
    o.out = path;
    o.dim = 32, o.layers = 1, o.heads = 2, o.kv_heads = 1, o.ff = 64, o.ctx = 64;
    o.sliding_window = 3, o.swa_pattern = 2, o.attn_softcap = 2, o.final_softcap = 3;  // gemma: a local layer
    std::ostringstream sink;
    run_init_model(o, sink);
  }
  return path;
}

// init-model's llama of weight type `type` (its file type, such as q4_k_m) with 2 heads, 1 KV head, ff = 256 and
// a context of 64; returns its path.
std::string small_model(const std::string& type, int64_t dim, int64_t layers, bool tied = false) {
  InitModelOptions o;
  o.type = type;
  o.tied = tied;
  o.dim = dim, o.layers = layers, o.heads = 2, o.kv_heads = 1, o.ff = 256, o.ctx = 64;
  o.out = temp_dir() + "/" + type + "_" + std::to_string(dim) + "x" + std::to_string(layers) + (tied ? "_tied" : "") +
          ".gguf";
  std::ostringstream sink;
  run_init_model(o, sink);
  return o.out;
}

// Logits of a one-layer model with random (non-zero) LoRA A and B on all seven targets; the parameters are the
// adapters only (the weights are frozen).
ag::GradcheckCase model_case(const std::string& arch, bool tied) {
  const std::string path = tiny_model(arch, "q4_0", tied);
  auto models = std::make_shared<std::map<ag::Backend*, std::unique_ptr<Model>>>();
  return {"model " + arch + (tied ? " tied" : ""), [path, models](ag::Graph& g, std::mt19937& r) {
            auto& m = (*models)[&g.backend()];
            if (!m) m = Model::load(path, g.backend());
            static thread_local std::unique_ptr<ModelGraph> keep;
            keep = std::make_unique<ModelGraph>(*m, g);
            for (const std::string& t : lora_targets(m->config())) {
              const std::string name = target_tensor_name(0, t);
              ag::Var w = keep->weight(name);
              ag::Var a = ag::random_param(g, r, {2, w.shape()[1]}, name + ".lora_a", -0.5, 0.5);
              ag::Var b = ag::random_param(g, r, {w.shape()[0], 2}, name + ".lora_b", -0.5, 0.5);
              keep->set_adapter(name, ag::LoraLinear(w, a, b, 1.5));
            }
            return keep->logits(ag::ids_constant(g, {1, 70, 200, 3, 258}, "ids"), 2);
          }};
}

class ModelGradients : public ::testing::TestWithParam<std::pair<std::string, bool>> {};

TEST_P(ModelGradients, LoraGradientsOfEveryTargetMatchFiniteDifferences) {
  auto dev = vk::Device::open({-1, false});
  auto cpu32 = ag::Backend::cpu(ag::DType::F32);
  auto vulkan = ag::Backend::vulkan(*dev);
  const auto c = model_case(GetParam().first, GetParam().second);
  const ag::GradcheckResult r = ag::run_gradcheck(c, {cpu32.get(), vulkan.get()});
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_GE(r.fd_points, (GetParam().first == "phi3" ? 8 : 14) * 10) << "every target's A and B should be probed";
  EXPECT_LE(r.fd_error, c.fd_bound);
  for (const auto& b : r.backends) {
    EXPECT_LE(b.forward_error, c.device_bound) << b.backend;
    EXPECT_LE(b.backward_error, c.device_bound) << b.backend;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelGradients,
                         ::testing::Values(std::pair{std::string("llama"), false}, std::pair{std::string("llama"), true},
                                           std::pair{std::string("qwen2"), false}, std::pair{std::string("qwen3"), true},
                                           std::pair{std::string("gemma3"), false}, std::pair{std::string("phi3"), false}));

TEST(ModelPacking, PackedExamplesGetTheLogitsTheyGetAlone) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma2", "phi3"}) {
    auto be = ag::Backend::cpu(ag::DType::F64);
    auto m = Model::load(tiny_model(arch, "q4_0", false), *be);
    const std::vector<int32_t> a = {1, 70, 200, 3}, b = {1, 9, 120, 250, 33};
    std::vector<int32_t> row = a, seg(a.size(), 1);
    row.insert(row.end(), b.begin(), b.end());
    seg.insert(seg.end(), b.size(), 2);
    auto logits_of = [&](const std::vector<int32_t>& ids, const std::vector<int32_t>* segments) {
      ag::Graph g(*be);
      ModelGraph mg(*m, g);
      ag::Var idv = ag::ids_constant(g, ids, "ids");
      ag::Var out = segments ? mg.logits(idv, ag::ids_constant(g, *segments, "segments")) : mg.logits(idv);
      g.forward();
      return be->to_host(out.value());
    };
    const auto packed = logits_of(row, &seg), alone_a = logits_of(a, nullptr), alone_b = logits_of(b, nullptr);
    const size_t V = size_t(m->config().n_vocab);
    double worst = 0;
    for (size_t i = 0; i < alone_a.size(); ++i) worst = std::max(worst, std::abs(packed[i] - alone_a[i]));
    for (size_t i = 0; i < alone_b.size(); ++i) worst = std::max(worst, std::abs(packed[a.size() * V + i] - alone_b[i]));
    // RoPE depends only on distances, so b's later absolute positions change nothing beyond rounding.
    EXPECT_LE(worst, 1e-9) << arch;
    // Without the segments, b would see a: the test can fail.
    const auto unmasked = logits_of(row, nullptr);
    EXPECT_GT(std::abs(unmasked[a.size() * V] - alone_b[0]), 1e-6) << arch;
  }
}

TEST(ModelMemory, LoadingKeepsQuantizedWeightsQuantizedWithNoExtraCopy) {
  auto dev = vk::Device::open({-1, false});
  auto be = ag::Backend::vulkan(*dev);
  const std::string path = tiny_model("llama", "q4_0", false);
  auto f = gguf::File::open(path);
  int64_t file_bytes = 0;
  for (const auto& t : f->tensors()) file_bytes += int64_t(t.bytes);
  const int64_t before = dev->bytes_allocated();
  dev->reset_peak();
  auto m = Model::load(path, *be);
  const int64_t used = dev->bytes_allocated() - before, peak = dev->peak_bytes_allocated() - before;
  // Device buffers are rounded up to whole words: at most 3 bytes per tensor.
  EXPECT_GE(used, file_bytes);
  EXPECT_LE(used, file_bytes + 4 * int64_t(f->tensors().size()));
  EXPECT_EQ(peak, used) << "a temporary device copy existed while loading";
  for (const auto& t : f->tensors()) {
    if (t.ne.size() != 2) continue;
    EXPECT_EQ(m->weight(t.name).dtype(), ag::frozen_dtype(Format::Q4_0)) << t.name;
    EXPECT_EQ(m->weight(t.name).bytes(), t.bytes) << t.name;
  }
  EXPECT_EQ(m->weight_bytes(), file_bytes);
}

TEST(ModelFiles, EveryMalformedFileIsOneClearErrorFromTheLoader) {
  auto be = ag::Backend::cpu();
  const auto cases = test::write_malformed_ggufs(temp_dir() + "/malformed");
  ASSERT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    try {
      Model::load(c.path, *be);
      ADD_FAILURE() << c.name << ": loaded";
    } catch (const gguf::FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expected_error_substring), std::string::npos)
          << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.path), std::string::npos) << c.name << ": " << e.what();
    }
  }
}

// A copy of a valid model with one key set (or a tensor added): the loader's one error must name `expect`.
void expect_refused(const std::string& name, const std::string& key, gguf::Value v, const std::string& extra_tensor,
                    const std::vector<std::string>& expect, const std::string& arch = "llama") {
  const auto f = gguf::File::open(tiny_model(arch, "f32", false));
  gguf::Writer w;
  for (const auto& [k, value] : f->metadata()) w.set(k, value);
  if (!key.empty()) w.set(key, v);
  for (const gguf::TensorInfo& t : f->tensors())
    w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
  if (!extra_tensor.empty()) w.add_tensor(extra_tensor, {8}, gguf::GgmlType::F32, std::vector<uint8_t>(32, 0));
  const std::string path = temp_dir() + "/refused_" + name + ".gguf";
  w.write(path);
  auto be = ag::Backend::cpu();
  try {
    Model::load(path, *be);
    ADD_FAILURE() << name << ": loaded";
  } catch (const gguf::FormatError& e) {
    for (const std::string& s : expect) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << name << ": " << e.what();
  }
}

// phi3's fused projections: q, k or v adapt attn_qkv and gate or up the fused ffn_up; an unfused model has no qkv.
TEST(ModelTargets, FusedProjectionsTakeTheirPartsNamesAndOthersAreRefusedByName) {
  auto be = ag::Backend::cpu();
  auto phi3 = Model::load(tiny_model("phi3", "f32", false), *be);
  EXPECT_EQ(lora_targets(phi3->config()), (std::vector<std::string>{"qkv", "o", "gate_up", "down"}));
  EXPECT_EQ(resolve_targets(phi3->config(), {"v", "q", "up", "down"}), (std::vector<std::string>{"qkv", "gate_up", "down"}));
  auto llama = Model::load(tiny_model("llama", "f32", false), *be);
  EXPECT_EQ(resolve_targets(llama->config(), {"down", "q"}), (std::vector<std::string>{"q", "down"}));
  try {
    resolve_targets(llama->config(), {"qkv"});
    ADD_FAILURE() << "qkv resolved for llama";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'qkv' is not a projection of this llama model (its targets: q, k, v, o, gate, up, down)"),
              std::string::npos) << e.what();
  }
}

TEST(ModelFiles, AnUnsupportedArchitectureKeyOrTensorIsOneErrorNamingIt) {
  expect_refused("arch", "general.architecture", gguf::Value::str("gemma4"), "",
                 {"general.architecture", "'gemma4' is not supported", "supported: llama, qwen2, qwen3, gemma2, gemma3, phi3"});
  expect_refused("scaling", "llama.rope.scaling.type", gguf::Value::str("longrope"), "",
                 {"llama.rope.scaling.type", "'longrope'", "supported: none, linear, yarn"});
  expect_refused("value_length", "llama.attention.value_length", gguf::Value::u32(8), "",
                 {"llama.attention.value_length", "differs from attention.key_length"});
  expect_refused("tensor", "", {}, "blk.0.post_attention_norm.weight", {"blk.0.post_attention_norm.weight", "not supported"});
  expect_refused("rope_freqs_qwen2", "", {}, "rope_freqs.weight", {"rope_freqs.weight", "'qwen2'"}, "qwen2");
  expect_refused("partial_rotary", "llama.rope.dimension_count", gguf::Value::u32(8), "",
                 {"llama.rope.dimension_count", "partial rotary is not supported for llama"});
  expect_refused("rope_freqs_zero", "", {}, "rope_freqs.weight", {"rope_freqs.weight", "not positive"});
}

TEST(ModelFiles, EveryWeightTypeLoadsAndStaysInItsStoredType) {
  auto be = ag::Backend::cpu();
  const std::map<std::string, ag::DType> want = {
      {"q4_0", ag::frozen_dtype(Format::Q4_0)}, {"q8_0", ag::frozen_dtype(Format::Q8_0)}, {"f16", ag::frozen_dtype(Format::F16)}, {"f32", ag::DType::F32}};
  // (Q4_K and Q6_K: InitModelQ4_K_MWritesLlamaQuantizesMix below, with rows of whole 256-weight super-blocks.)
  for (const auto& [type, dtype] : want) {
    auto m = Model::load(tiny_model("llama", type, false), *be);
    EXPECT_EQ(m->weight("blk.0.attn_q.weight").dtype(), dtype) << type;
    EXPECT_EQ(m->weight("blk.0.attn_norm.weight").dtype(), ag::DType::F32) << type;
  }
}

// q4_k_m writes llama-quantize's Q4_K_M mix: Q6_K for the output matrix and for attn_v and ffn_down of layers
// i < n/8, i >= 7n/8 and (i - n/8) % 3 == 2 (with 8 layers: 0, 3, 6, 7), Q4_K for every other matrix; the model
// loads every tensor in its stored type.
TEST(ModelFiles, InitModelQ4_K_MWritesLlamaQuantizesMix) {
  const std::string path = small_model("q4_k_m", 256, 8);
  auto f = gguf::File::open(path);
  EXPECT_EQ(f->get_uint("general.file_type"), 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  const std::set<int> six_bit_layers = {0, 3, 6, 7};
  int n_q4_k = 0, n_q6_k = 0;
  for (const auto& t : f->tensors()) {
    if (t.ne.size() != 2) {
      EXPECT_EQ(t.type, gguf::GgmlType::F32) << t.name;
      continue;
    }
    bool six = t.name == "output.weight";
    for (int l : six_bit_layers)
      for (const char* m : {"attn_v", "ffn_down"})
        six = six || t.name == "blk." + std::to_string(l) + "." + m + ".weight";
    EXPECT_EQ(t.type, six ? gguf::GgmlType::Q6_K : gguf::GgmlType::Q4_K) << t.name;
    (six ? n_q6_k : n_q4_k)++;
  }
  EXPECT_EQ(n_q6_k, 9);
  EXPECT_EQ(n_q4_k, 8 * 7 + 1 - 8);
  auto be = ag::Backend::cpu();
  auto m = Model::load(path, *be);
  EXPECT_EQ(m->weight("token_embd.weight").dtype(), ag::frozen_dtype(Format::Q4_K));
  EXPECT_EQ(m->weight("blk.3.attn_v.weight").dtype(), ag::frozen_dtype(Format::Q6_K));
  EXPECT_EQ(m->weight("blk.4.attn_v.weight").dtype(), ag::frozen_dtype(Format::Q4_K));
  EXPECT_EQ(m->weight("output.weight").dtype(), ag::frozen_dtype(Format::Q6_K));
  EXPECT_EQ(m->weight_bytes(), [&] {
    int64_t b = 0;
    for (const auto& t : f->tensors()) b += int64_t(t.bytes);
    return b;
  }());
}

// quantize --type q4_0 is llama-quantize's Q4_0: the output matrix (token_embd when tied) in Q6_K, or Q8_0 when
// its rows are not whole 256-weight super-blocks.
TEST(ModelFiles, QuantizeQ4_0WritesTheOutputMatrixAsLlamaQuantizeDoes) {
  for (const auto& [dim, tied, output_type] :
       {std::tuple{256, true, gguf::GgmlType::Q6_K}, std::tuple{256, false, gguf::GgmlType::Q6_K},
        std::tuple{64, false, gguf::GgmlType::Q8_0}}) {
    const std::string f32 = small_model("f32", dim, 1, tied);
    const std::string out = f32 + ".q4_0.gguf";
    std::ostringstream sink;
    run_quantize(f32, out, "q4_0", sink);
    auto f = gguf::File::open(out);
    const std::string output = tied ? "token_embd.weight" : "output.weight";
    for (const auto& t : f->tensors()) {
      const gguf::GgmlType want = t.ne.size() != 2 ? gguf::GgmlType::F32
                                  : t.name == output ? output_type
                                                     : gguf::GgmlType::Q4_0;
      EXPECT_EQ(t.type, want) << t.name << " (dim " << dim << (tied ? ", tied" : "") << ")";
    }
    auto be = ag::Backend::cpu();
    EXPECT_NO_THROW(Model::load(out, *be));
  }
}

// Q4_K needs rows of whole super-blocks; llama-quantize would fall back to Q5_0, which q4tune lacks: one clear
// error naming the tensor, and no file written (an existing one untouched).
// Rows that are not whole 256-weight super-blocks fall back as llama-quantize does: Q4_K to Q5_0, Q6_K to Q8_0.
TEST(ModelFiles, Q4_K_MFallsBackWhereRowsAreNotWholeSuperBlocks) {
  const auto f = gguf::File::open(small_model("q4_k_m", 64, 1));
  EXPECT_EQ(f->tensor("token_embd.weight")->type, gguf::GgmlType::Q5_0);
  EXPECT_EQ(f->tensor("blk.0.attn_q.weight")->type, gguf::GgmlType::Q5_0);
  EXPECT_EQ(f->tensor("output.weight")->type, gguf::GgmlType::Q8_0);
  EXPECT_EQ(f->tensor("blk.0.ffn_down.weight")->type, gguf::GgmlType::Q6_K);  // n_in = ff = 256
}

}  // namespace
}  // namespace q4t::model
