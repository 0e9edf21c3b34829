// Adapter export: the RoPE row permutation of llama's q/k (both directions, against the converter's formula and
// against RoPE itself), GGUF LoRA export read back by q4tune's own loader (same logits), the PEFT folder
// (safetensors keys, shapes, values, adapter_config.json), the safetensors reader's checks, and atomic failures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "autograd/gradcheck.h"
#include "data/safetensors.h"
#include "train/commands.h"
#include "train/export.h"

namespace q4t {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = fs::temp_directory_path() / ("q4t_test_export_" + test + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<float> iota_rows(int64_t rows, int64_t cols) {  // row i holds i·cols .. i·cols + cols - 1
  std::vector<float> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return v;
}

TEST(RopePermutation, MatchesTheConvertersReshapeSwapaxesReshapeOnSmallExamples) {
  // reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).reshape: GGUF row h·hd + 2j + s is HF row h·hd + s·hd/2 + j.
  // hd = 4, two heads, two columns: HF rows [0 1 2 3 | 4 5 6 7] → [0 2 1 3 | 4 6 5 7].
  const std::vector<float> two_heads = rope_permute_rows(iota_rows(8, 2), 2, 2);
  const std::vector<int> want_rows = {0, 2, 1, 3, 4, 6, 5, 7};
  for (size_t g = 0; g < want_rows.size(); ++g) {
    EXPECT_EQ(two_heads[2 * g], float(2 * want_rows[g])) << "row " << g;
    EXPECT_EQ(two_heads[2 * g + 1], float(2 * want_rows[g] + 1)) << "row " << g;
  }
  // hd = 6, one head, one column: [0 1 2 3 4 5] → [0 3 1 4 2 5].
  EXPECT_EQ(rope_permute_rows(iota_rows(6, 1), 1, 1), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(rope_permute_rows(iota_rows(6, 1), 4, 1), std::invalid_argument);  // 6 rows, 4 heads
  EXPECT_THROW(rope_permute_rows(iota_rows(6, 1), 2, 1), std::invalid_argument);  // odd head size 3
}

TEST(RopePermutation, UnpermuteInvertsPermute) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [n_head, hd, cols] : {std::tuple{4, 8, 3}, std::tuple{2, 16, 5}, std::tuple{1, 2, 1}}) {
    std::vector<float> x(size_t(n_head * hd * cols));
    for (float& v : x) v = u(rng);
    EXPECT_EQ(rope_unpermute_rows(rope_permute_rows(x, n_head, cols), n_head, cols), x);
    EXPECT_EQ(rope_permute_rows(rope_unpermute_rows(x, n_head, cols), n_head, cols), x);
  }
}

// The reason for the permutation: RoPE on adjacent pairs (llama.cpp's norm mode) of GGUF-ordered rows equals
// RoPE on halves (HF's rotate_half) of the un-permuted rows. A wrong permutation breaks this.
TEST(RopePermutation, NormRopeInGgufOrderEqualsHalvesRopeInHfOrder) {
  constexpr int64_t n_head = 3, hd = 8, pos = 5;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<float> q(size_t(n_head * hd));
  for (float& v : q) v = float(u(rng));
  auto angle = [&](int64_t j) { return double(pos) * std::pow(10000.0, -2.0 * double(j) / double(hd)); };
  std::vector<double> norm(q.begin(), q.end()), halves(q.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t j = 0; j < hd / 2; ++j) {
      const double c = std::cos(angle(j)), s = std::sin(angle(j));
      const size_t a = size_t(h * hd + 2 * j), b = a + 1;
      const double x0 = norm[a], x1 = norm[b];
      norm[a] = x0 * c - x1 * s, norm[b] = x0 * s + x1 * c;
    }
  const std::vector<float> hf = rope_unpermute_rows(q, n_head, 1);
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t j = 0; j < hd / 2; ++j) {
      const double c = std::cos(angle(j)), s = std::sin(angle(j));
      const size_t a = size_t(h * hd + j), b = a + size_t(hd / 2);
      halves[a] = hf[a] * c - hf[b] * s, halves[b] = hf[a] * s + hf[b] * c;
    }
  std::vector<float> norm_f(norm.begin(), norm.end());
  const std::vector<float> norm_in_hf = rope_unpermute_rows(norm_f, n_head, 1);
  for (size_t i = 0; i < halves.size(); ++i) EXPECT_NEAR(norm_in_hf[i], halves[i], 1e-6) << "row " << i;
}

// A tiny model on the CPU with random A and B (rank 3) on all seven targets of every layer.
struct Fixture {
  std::unique_ptr<ag::Backend> be = ag::Backend::cpu(ag::DType::F32);
  std::unique_ptr<model::Model> m;
  std::unique_ptr<ag::Graph> g;
  std::unique_ptr<model::ModelGraph> mg;

  Fixture(const fs::path& path, const std::string& arch, const std::string& type, double scale, int64_t rank = 3) {
    InitModelOptions o;
    o.arch = arch, o.type = type, o.out = path.string();
    o.dim = 64, o.layers = 2, o.heads = 4, o.kv_heads = 2, o.ff = 96, o.ctx = 64, o.seed = 5;
    std::ostringstream sink;
    if (run_init_model(o, sink) != 0) throw std::runtime_error("init-model failed: " + sink.str());
    m = model::Model::load(path.string(), *be);
    g = std::make_unique<ag::Graph>(*be);
    mg = std::make_unique<model::ModelGraph>(*m, *g);
    std::mt19937 rng(3);
    for (int64_t l = 0; l < m->config().n_layer; ++l)
      for (const std::string& t : model::lora_targets(m->config())) {
        const std::string name = model::target_tensor_name(l, t);
        ag::Var w = mg->weight(name);
        ag::Var a = ag::random_param(*g, rng, {rank, w.shape()[1]}, name + ".lora_a", -0.3, 0.3);
        ag::Var b = ag::random_param(*g, rng, {w.shape()[0], rank}, name + ".lora_b", -0.3, 0.3);
        mg->set_adapter(name, ag::LoraLinear(w, a, b, scale));
      }
  }
};

const std::vector<int32_t> kIds = {1, 70, 200, 3, 258, 17, 99, 42};

std::vector<double> logits_of(const model::ModelGraph& mg) {
  ag::Var out = mg.logits(ag::ids_constant(mg.graph(), kIds, "ids"));
  mg.graph().forward();
  return mg.graph().backend().to_host(out.value());
}

double max_rel_diff(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

class GgufExport : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufExport, ReloadedAdapterGivesTheSameLogits) {
  TempDir dir;
  const double scale = 0.7;
  Fixture f(dir / "m.gguf", GetParam(), "q4_0", scale);
  const std::vector<double> want = logits_of(*f.mg);
  ag::Graph bare_graph(*f.be);
  EXPECT_GT(max_rel_diff(logits_of(model::ModelGraph(*f.m, bare_graph)), want), 1e-2) << "the adapters must matter";
  // alpha = scale·r (the natural choice), and an unrelated alpha whose ratio is folded into B.
  for (double alpha : {scale * 3, 16.0}) {
    const fs::path out = dir / "adapter.gguf";
    export_gguf_adapter(*f.mg, alpha, out.string());
    const auto file = gguf::File::open(out.string());
    EXPECT_EQ(file->get_string("general.type"), "adapter");
    EXPECT_EQ(file->get_string("general.architecture"), GetParam());
    EXPECT_EQ(file->get_string("adapter.type"), "lora");
    EXPECT_EQ(file->get_float("adapter.lora.alpha"), double(float(alpha)));
    EXPECT_EQ(file->tensors().size(), size_t(2 * model::lora_targets(f.m->config()).size() * 2));
    const gguf::TensorInfo* a = file->tensor("blk.1.ffn_down.weight.lora_a");
    const gguf::TensorInfo* b = file->tensor("blk.1.ffn_down.weight.lora_b");
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->ne, (std::vector<int64_t>{96, 3}));  // [n_in, r]
    EXPECT_EQ(b->ne, (std::vector<int64_t>{3, 64}));  // [r, n_out]

    ag::Graph g2(*f.be);
    model::ModelGraph fresh(*f.m, g2);
    fresh.load_adapters(*file, 1.0);
    const double rel = max_rel_diff(logits_of(fresh), want);
    EXPECT_LE(rel, 1e-6) << "alpha " << alpha;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufExport, ::testing::Values("llama", "qwen2", "phi3"));

class PeftExport : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftExport, WritesHfKeysShapesValuesAndConfig) {
  TempDir dir;
  const std::string arch = GetParam();
  Fixture f(dir / "m.gguf", arch, "f32", /*scale=*/0.5, /*rank=*/4);
  const fs::path out = dir / "nested" / "peft";  // created by the export
  ExportInfo info;
  info.alpha = 2.0;  // alpha / r = 0.5: B is written unscaled
  info.dropout = 0.05;
  info.base_model = base_model_name(*gguf::File::open((dir / "m.gguf").string()));
  export_peft(*f.mg, info, out.string());

  const safetensors::File st = safetensors::read((out / "adapter_model.safetensors").string());
  const bool phi3 = arch == "phi3";  // Hugging Face's Phi3 has the fused qkv_proj and gate_up_proj too
  EXPECT_EQ(st.tensors.size(), size_t(2 * (phi3 ? 4 : 7) * 2));
  EXPECT_EQ(st.metadata.at("format"), "pt");
  const model::ModelConfig& cfg = f.m->config();
  const ag::Backend& be = *f.be;
  const std::map<std::string, std::string> hf =
      phi3 ? std::map<std::string, std::string>{{"qkv", "self_attn.qkv_proj"}, {"o", "self_attn.o_proj"},
                                                {"gate_up", "mlp.gate_up_proj"}, {"down", "mlp.down_proj"}}
           : std::map<std::string, std::string>{
                 {"q", "self_attn.q_proj"}, {"k", "self_attn.k_proj"}, {"v", "self_attn.v_proj"},
                 {"o", "self_attn.o_proj"}, {"gate", "mlp.gate_proj"}, {"up", "mlp.up_proj"},
                 {"down", "mlp.down_proj"}};
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    for (const auto& [target, module] : hf) {
      const ag::LoraLinear& lin = f.mg->adapters().at(model::target_tensor_name(l, target));
      const std::string key = "base_model.model.model.layers." + std::to_string(l) + "." + module;
      ASSERT_TRUE(st.tensors.count(key + ".lora_A.weight")) << key;
      ASSERT_TRUE(st.tensors.count(key + ".lora_B.weight")) << key;
      const safetensors::Tensor& ta = st.tensors.at(key + ".lora_A.weight");
      const safetensors::Tensor& tb = st.tensors.at(key + ".lora_B.weight");
      EXPECT_EQ(ta.dtype, "F32");
      EXPECT_EQ(tb.dtype, "F32");
      EXPECT_EQ(ta.shape, (std::vector<int64_t>{4, lin.w.shape()[1]})) << key;  // [r, in]
      EXPECT_EQ(tb.shape, (std::vector<int64_t>{lin.w.shape()[0], 4})) << key;  // [out, r]
      const std::vector<double> a = be.to_host(lin.a.value()), b = be.to_host(lin.b.value());
      std::vector<float> want_b(b.begin(), b.end());
      if (arch == "llama" && (target == "q" || target == "k"))
        want_b = rope_unpermute_rows(want_b, target == "q" ? cfg.n_head : cfg.n_head_kv, 4);
      EXPECT_EQ(st.f32(key + ".lora_A.weight"), std::vector<float>(a.begin(), a.end())) << key;
      EXPECT_EQ(st.f32(key + ".lora_B.weight"), want_b) << key;
    }

  const nlohmann::json c = nlohmann::json::parse(read_all(out / "adapter_config.json"));
  EXPECT_EQ(c.at("peft_type"), "LORA");
  EXPECT_EQ(c.at("task_type"), "CAUSAL_LM");
  EXPECT_EQ(c.at("r"), 4);
  EXPECT_EQ(c.at("lora_alpha"), 2.0);
  EXPECT_EQ(c.at("target_modules"),
            phi3 ? nlohmann::json({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"})
                 : nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(c.at("bias"), "none");
  EXPECT_EQ(c.at("use_rslora"), false);
  EXPECT_EQ(c.at("fan_in_fan_out"), false);
  EXPECT_EQ(c.at("lora_dropout"), 0.05);
  EXPECT_EQ(c.at("inference_mode"), true);
  EXPECT_EQ(c.at("base_model_name_or_path"), info.base_model);
  EXPECT_FALSE(info.base_model.empty());
  EXPECT_FALSE(c.contains("layers_to_transform"));  // every layer is adapted
}

INSTANTIATE_TEST_SUITE_P(Archs, PeftExport, ::testing::Values("llama", "qwen2", "phi3"));

TEST(PeftExport, FoldsAScaleThatDiffersFromPeftsIntoB) {
  TempDir dir;
  Fixture f(dir / "m.gguf", "qwen2", "f32", /*scale=*/0.5, /*rank=*/4);
  ExportInfo info;
  info.alpha = 8;
  info.rslora = true;  // PEFT's scale 8 / sqrt(4) = 4, ours 0.5: B is written times 1/8
  export_peft(*f.mg, info, (dir / "peft").string());
  const safetensors::File st = safetensors::read((dir / "peft" / "adapter_model.safetensors").string());
  const std::vector<double> b = f.be->to_host(f.mg->adapters().at("blk.0.attn_v.weight").b.value());
  const std::vector<float> got = st.f32("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
  ASSERT_EQ(got.size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) EXPECT_FLOAT_EQ(got[i], float(b[i] / 8)) << i;
  EXPECT_EQ(nlohmann::json::parse(read_all(dir / "peft" / "adapter_config.json")).at("use_rslora"), true);
}

TEST(SafetensorsFile, RoundTripsWithAlignedHeaderAndRejectsBadFiles) {
  TempDir dir;
  safetensors::Writer w;
  w.set_metadata("format", "pt");
  w.add_f32("b", {2, 3}, {1, 2, 3, 4, 5, 6});
  w.add_f32("a", {1}, {-0.5f});
  EXPECT_THROW(w.add_f32("c", {2, 2}, {1, 2, 3}), std::invalid_argument);
  const fs::path p = dir / "t.safetensors";
  w.write(p.string());
  const std::string bytes = read_all(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 7 * 4);
  const safetensors::File f = safetensors::read(p.string());
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.tensors.at("b").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.f32("b"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(f.f32("a"), (std::vector<float>{-0.5f}));

  auto write_bytes = [&](const std::string& b) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
  };
  auto with_header = [](std::string json, size_t data_bytes) {
    std::string b(8, '\0');
    const uint64_t len = json.size();
    std::memcpy(b.data(), &len, 8);
    return b + json + std::string(data_bytes, '\0');
  };
  write_bytes(bytes.substr(0, bytes.size() - 4));  // truncated data
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(bytes.substr(0, 5));
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}");  // header length past the end
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8));  // offsets past the end
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));  // shape ≠ bytes
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(with_header(R"({"x":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 8));  // unknown dtype
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(with_header(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(with_header(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));  // a hole
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
  write_bytes(with_header(R"([1,2])", 0));
  EXPECT_THROW(safetensors::read(p.string()), safetensors::FormatError);
}

// PEFT's base_model_name_or_path: the Hugging Face id a GGUF names in its source or base-model keys (first match
// in this order), else its general.name, else its path.
TEST(PeftExport, BaseModelIdComesFromTheSourceKeysThenTheName) {
  TempDir dir;
  auto name_of = [&](const std::vector<std::pair<std::string, std::string>>& keys) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("llama"));
    for (const auto& [k, v] : keys) w.set(k, gguf::Value::str(v));
    const std::string path = (dir / "keys.gguf").string();
    w.write(path);
    return base_model_name(*gguf::File::open(path));
  };
  EXPECT_EQ(name_of({}), (dir / "keys.gguf").string());
  EXPECT_EQ(name_of({{"general.name", "TinyLlama Chat"}}), "TinyLlama Chat");
  EXPECT_EQ(name_of({{"general.name", "x"}, {"general.base_model.0.repo_url", "https://huggingface.co/org/base"}}),
            "org/base");
  EXPECT_EQ(name_of({{"general.base_model.0.repo_url", "https://huggingface.co/org/base"},
                     {"general.source.url", "https://huggingface.co/org/source/"}}),
            "org/source");
  EXPECT_EQ(name_of({{"general.source.url", "https://example.com/org/source"},
                     {"general.source.repo_url", "https://huggingface.co/TinyLlama/TinyLlama-1.1B-Chat-v1.0"}}),
            "TinyLlama/TinyLlama-1.1B-Chat-v1.0");
  EXPECT_EQ(name_of({{"general.source.repo_url", "https://huggingface.co/a/b"},
                     {"general.source.huggingface.repository", "Qwen/Qwen2.5-0.5B"}}),
            "Qwen/Qwen2.5-0.5B");
  // Addresses that are not a Hugging Face repository are passed over.
  EXPECT_EQ(name_of({{"general.name", "n"}, {"general.source.url", "https://github.com/org/repo"},
                     {"general.base_model.0.repo_url", "https://huggingface.co/just-a-name"}}),
            "n");
}

TEST(ExportFailures, LeaveNothingBehindAndExistingFilesUntouched) {
  TempDir dir;
  Fixture f(dir / "m.gguf", "llama", "f32", 0.5);
  // Under a parent that does not exist: throws, creates nothing.
  const fs::path missing = dir / "no_such_dir" / "adapter.gguf";
  EXPECT_THROW(export_gguf_adapter(*f.mg, 1.5, missing.string()), std::runtime_error);
  EXPECT_FALSE(fs::exists(dir / "no_such_dir"));

  // A failed export over existing files leaves them as they were, and no temp file.
  const fs::path existing = dir / "adapter.gguf";
  std::ofstream(existing) << "previous adapter";
  const fs::path peft = dir / "peft";
  fs::create_directories(peft);
  std::ofstream(peft / "adapter_config.json") << "previous config";
  std::ofstream(peft / "adapter_model.safetensors") << "previous weights";
  EXPECT_THROW(export_gguf_adapter(*f.mg, 0.0, existing.string()), std::invalid_argument);  // alpha 0
  ag::Graph g2(*f.be);
  model::ModelGraph no_adapters(*f.m, g2);
  EXPECT_THROW(export_gguf_adapter(no_adapters, 1.5, existing.string()), std::invalid_argument);
  EXPECT_THROW(export_peft(no_adapters, ExportInfo{}, peft.string()), std::invalid_argument);
  // The PEFT folder path is an existing file.
  EXPECT_THROW(export_peft(*f.mg, ExportInfo{}, existing.string()), std::runtime_error);
  // Two ranks cannot be one PEFT config.
  std::mt19937 rng(1);
  ag::Var w = f.mg->weight("blk.0.attn_v.weight");
  f.mg->set_adapter("blk.0.attn_v.weight",
                    ag::LoraLinear(w, ag::random_param(*f.g, rng, {5, w.shape()[1]}, "a5"),
                                   ag::random_param(*f.g, rng, {w.shape()[0], 5}, "b5"), 0.5));
  EXPECT_THROW(export_peft(*f.mg, ExportInfo{}, peft.string()), std::invalid_argument);

  EXPECT_EQ(read_all(existing), "previous adapter");
  EXPECT_EQ(read_all(peft / "adapter_config.json"), "previous config");
  EXPECT_EQ(read_all(peft / "adapter_model.safetensors"), "previous weights");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir / "")) ++entries;
  EXPECT_EQ(entries, 3);  // m.gguf, adapter.gguf, peft: no temp files
}

}  // namespace
}  // namespace q4t
