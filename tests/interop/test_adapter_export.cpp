// Our adapter exports loaded by the other tools. A random tiny f32 model (f32, so that llama.cpp's Q8_0 rounding
// of activations does not enter) gets random LoRA A and B on every projection; export_gguf_adapter writes it, and
// llama.cpp (node-llama-cpp's CPU prebuilt, via llama_ref.mjs --lora) must give the logits `q4tune logits
// --adapter` gives: max_v |Δ| <= 1e-3 · max_v |llama.cpp| at every position. One variant uses alpha = scale·r, the
// other an unrelated alpha (its ratio folded into B).
// PEFT: export_peft's folder loaded by PyTorch + peft (peft_check.py) must reproduce q4tune's logits, for a q4_0
// llama (q/k rows un-permuted), an f32 qwen2, a q4_0 qwen3 and gemma2, an f32 gemma3, a q4_0 phi3 (fused qkv_proj
// and gate_up_proj); skipped where python3 lacks torch, transformers or peft.
// Needs node >= 20 and npm (and the npm registry the first time); ctest label "interop".
#include <gtest/gtest.h>
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
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "autograd/gradcheck.h"
#include "kernels/formats.h"
#include "train/commands.h"
#include "train/export.h"
#include "interop_util.h"
#include "work_dir.h"

namespace q4t {
namespace {

namespace fs = std::filesystem;
using namespace q4t::interop;

constexpr double kTolerance = 1e-3;  // of the position's largest |reference logit|
constexpr int kSeqLen = 24;

// max over positions of max_v |got - want| / max_v |want|; NaN or a shape mismatch gives infinity.
double worst_ratio(const Logits& got, const Logits& want) {
  if (got.size() != want.size() || want.empty()) return INFINITY;
  double worst = 0;
  for (size_t p = 0; p < want.size(); ++p) {
    if (got[p].size() != want[p].size()) return INFINITY;
    double diff = 0, scale = 0;
    for (size_t v = 0; v < want[p].size(); ++v) {
      diff = std::max(diff, std::abs(got[p][v] - want[p][v]));
      scale = std::max(scale, std::abs(want[p][v]));
    }
    if (!(diff / scale <= worst)) worst = diff / scale;
  }
  return worst;
}

class Workdir : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_work_dir("q4t-adapter-export"); }
  void TearDown() override { remove_unless_failed(dir_); }

  // A random model, random rank-4 adapters on every target (scale 0.5), and the ids: everything the exports need.
  void make_adapted_model(const std::string& arch, const std::string& type, uint32_t seed, int64_t dim = 64) {
    InitModelOptions o;
    o.arch = arch, o.type = type, o.seed = seed, o.out = (dir_ / "m.gguf").string();
    o.dim = dim, o.ff = 2 * dim;
    // gemma: a local first layer with a window shorter than the ids, soft-caps that bend (gemma2 is tied).
    o.tied = arch == "gemma2";
    o.sliding_window = 7, o.swa_pattern = 2, o.attn_softcap = 3, o.final_softcap = 4;
    std::ostringstream sink;
    ASSERT_EQ(run_init_model(o, sink), 0) << sink.str();
    model_ = model::Model::load(o.out, *be_);
    graph_ = std::make_unique<ag::Graph>(*be_);
    mg_ = std::make_unique<model::ModelGraph>(*model_, *graph_);
    std::mt19937 rng(seed);
    for (int64_t l = 0; l < model_->config().n_layer; ++l)
      for (const std::string& t : model::lora_targets(model_->config())) {
        const std::string name = model::target_tensor_name(l, t);
        ag::Var w = mg_->weight(name);
        mg_->set_adapter(name, ag::LoraLinear(w, ag::random_param(*graph_, rng, {4, w.shape()[1]}, name + ".a", -0.1, 0.1),
                                              ag::random_param(*graph_, rng, {w.shape()[0], 4}, name + ".b", -0.1, 0.1),
                                              0.5));
      }
    std::vector<int64_t> ids(kSeqLen);
    for (auto& id : ids) id = 3 + int64_t(rng() % uint32_t(model_->config().n_vocab - 3));
    std::ofstream(dir_ / "ids.json") << nlohmann::json(ids).dump();
  }

  Logits q4tune_logits(const std::string& adapter_args, const std::string& out_name) {
    const fs::path out = dir_ / out_name;
    const CmdResult r = run(std::string(Q4TUNE_BIN) + " logits " + interop::quoted(dir_ / "m.gguf") + " --ids-file " +
                            interop::quoted(dir_ / "ids.json") + " --device cpu" + adapter_args + " --out " + interop::quoted(out));
    EXPECT_EQ(r.code, 0) << r.out;
    return r.code == 0 ? read_logits(out) : Logits{};
  }

  std::unique_ptr<ag::Backend> be_ = ag::Backend::cpu(ag::DType::F32);
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<ag::Graph> graph_;
  std::unique_ptr<model::ModelGraph> mg_;
  fs::path dir_;
};

struct Variant {
  const char* arch;
  double alpha;  // of the GGUF export; 2 = scale·r
  uint32_t seed;
  const char* type = "f32";  // of the random model's weights
};

std::string g_node_llama_dir, g_node_llama_error;

class LlamaCppLoadsOurGgufAdapter : public Workdir, public ::testing::WithParamInterface<Variant> {
 protected:
  static void SetUpTestSuite() {
    if (!g_node_llama_dir.empty() || !g_node_llama_error.empty()) return;
    const CmdResult r = run(interop::quoted(fs::path(Q4T_INTEROP_DIR) / "install_node_llama.sh"));
    std::string last = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
    last = last.substr(last.find_last_of('\n') + 1);
    if (r.code != 0 || last.empty())
      g_node_llama_error = "install_node_llama.sh failed (exit " + std::to_string(r.code) + "):\n" + r.out;
    else
      g_node_llama_dir = last;
  }
};

TEST_P(LlamaCppLoadsOurGgufAdapter, AndGivesQ4tunesLogits) {
  ASSERT_TRUE(g_node_llama_error.empty()) << g_node_llama_error;
  const Variant v = GetParam();
  make_adapted_model(v.arch, "f32", v.seed);
  ASSERT_FALSE(HasFailure());
  const fs::path adapter = dir_ / "adapter.gguf";
  // Odd seeds' adapters carry the q4tune.chat_template key, which llama.cpp must pass over.
  export_gguf_adapter(*mg_, v.alpha, adapter.string(), v.seed % 2 == 1 ? "chatml" : "");

  const Logits ours = q4tune_logits(" --adapter " + interop::quoted(adapter), "q4tune.json");
  const fs::path ref = dir_ / "llama_cpp.json";
  const CmdResult r = run("node " + interop::quoted(fs::path(Q4T_INTEROP_DIR) / "llama_ref.mjs") + " --node-llama " +
                          interop::quoted(g_node_llama_dir) + " --model " + interop::quoted(dir_ / "m.gguf") + " --ids-file " +
                          interop::quoted(dir_ / "ids.json") + " --lora " + interop::quoted(adapter) + " --out " + interop::quoted(ref));
  ASSERT_EQ(r.code, 0) << r.out;
  const Logits want = read_logits(ref);
  ASSERT_EQ(want.size(), size_t(kSeqLen));
  // The adapter must matter: without it the logits are far from llama.cpp's adapted ones.
  const double without = worst_ratio(q4tune_logits("", "q4tune_base.json"), want);
  const double with = worst_ratio(ours, want);
  std::printf("%s alpha %g: max|q4tune - llama.cpp| / max|llama.cpp| = %.3g (without the adapter %.3g)\n", v.arch,
              v.alpha, with, without);
  EXPECT_LE(with, kTolerance);
  EXPECT_GT(without, 10 * kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaCppLoadsOurGgufAdapter,
                         ::testing::Values(Variant{"llama", 2.0, 21}, Variant{"llama", 16.0, 22},
                                           Variant{"qwen2", 2.0, 23}, Variant{"qwen2", 16.0, 24}),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           return std::string(i.param.arch) + (i.param.alpha == 2.0 ? "_alpha_scale_r" : "_alpha_16");
                         });

// q4tune merge: llama.cpp runs the merged file. Merged in f32, llama.cpp's logits are those of base + adapter
// computed with f32 activations (q4tune's; with an f32 base also llama.cpp's own base + adapter: llama.cpp rounds
// the activations entering a quantized, f16 or bf16 product to that product's input type, which a merged f32
// model has none of). Merged into each weight's own type, every adapted weight is the f32 merge quantized afresh
// (the bytes `q4tune quantize` writes from it), so the merge adds one requantization of W + ΔW and nothing else;
// its effect on the logits is printed per format.
class LlamaCppRunsTheMergedModel : public LlamaCppLoadsOurGgufAdapter {
 protected:
  // llama.cpp's logits of each {model, adapter or ""} on ids.json, all in one run of llama_ref.mjs.
  std::vector<Logits> llama_cpp(const std::vector<std::pair<std::string, std::string>>& jobs) {
    std::string cmd = "node " + interop::quoted(fs::path(Q4T_INTEROP_DIR) / "llama_ref.mjs") + " --node-llama " +
                      interop::quoted(g_node_llama_dir);
    for (size_t i = 0; i < jobs.size(); ++i) {
      const auto& [model, lora] = jobs[i];
      cmd += (i > 0 ? " --and --model " : " --model ") + interop::quoted(dir_ / model) + " --ids-file " +
             interop::quoted(dir_ / "ids.json") + (lora.empty() ? "" : " --lora " + interop::quoted(dir_ / lora)) +
             " --out " + interop::quoted(dir_ / (std::to_string(i) + "-llama-cpp.json"));
    }
    const CmdResult r = run(cmd);
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<Logits> got;
    for (size_t i = 0; i < jobs.size(); ++i)
      got.push_back(r.code == 0 ? read_logits(dir_ / (std::to_string(i) + "-llama-cpp.json")) : Logits{});
    return got;
  }
  CmdResult q4tune(const std::string& args) { return run(std::string(Q4TUNE_BIN) + " " + args); }
  std::string at(const std::string& name) { return interop::quoted(dir_ / name); }
};

TEST_P(LlamaCppRunsTheMergedModel, WithTheLogitsOfBasePlusAdapter) {
  ASSERT_TRUE(g_node_llama_error.empty()) << g_node_llama_error;
  const std::string arch = GetParam().arch, type = GetParam().type;
  make_adapted_model(arch, type, 51, 256);
  ASSERT_FALSE(HasFailure());
  export_gguf_adapter(*mg_, 2.0, (dir_ / "adapter.gguf").string());
  for (const char* t : {"f32", "same"}) {
    const CmdResult m = q4tune("merge -m " + at("m.gguf") + " --lora " + at("adapter.gguf") + " --type " + t + " -o " +
                               at(std::string("merged-") + t + ".gguf"));
    ASSERT_EQ(m.code, 0) << m.out;
  }
  const Logits f32_activations = q4tune_logits(" --adapter " + interop::quoted(dir_ / "adapter.gguf"), "q4tune.json");
  const std::vector<Logits> ref = llama_cpp(
      {{"m.gguf", "adapter.gguf"}, {"merged-f32.gguf", ""}, {"merged-same.gguf", ""}, {"m.gguf", ""}});
  const Logits &reference = ref[0], &merged_f32 = ref[1], &merged_same = ref[2], &base = ref[3];
  ASSERT_EQ(reference.size(), size_t(kSeqLen));
  const double f32 = worst_ratio(merged_f32, f32_activations), f32_vs_llama = worst_ratio(merged_f32, reference);
  const double same = worst_ratio(merged_same, reference), requant = worst_ratio(merged_same, merged_f32);
  const double effect = worst_ratio(base, reference);
  std::printf("%s %s merged, by llama.cpp: f32 vs base + adapter %.3g (vs llama.cpp's own %.3g); %s vs base + "
              "adapter %.3g, of which requantizing W + dW %.3g; the adapter's effect %.3g\n",
              arch.c_str(), type.c_str(), f32, f32_vs_llama, type.c_str(), same, requant, effect);
  EXPECT_LE(f32, kTolerance);
  if (type == "f32") EXPECT_LE(f32_vs_llama, kTolerance);
  // Each adapted weight in its own type lies at least as close to W + dW as the f32 merge quantized afresh
  // (`q4tune quantize`): blocks rounded on their old grid are kept only where they are closer.
  if (type == "f32" || type == "f16") return;
  const CmdResult q = q4tune("quantize -m " + at("merged-f32.gguf") + " -o " + at("requantized.gguf") + " --type " + type);
  ASSERT_EQ(q.code, 0) << q.out;
  const auto exact = gguf::File::open((dir_ / "merged-f32.gguf").string());
  const auto merged = gguf::File::open((dir_ / "merged-same.gguf").string());
  const auto fresh = gguf::File::open((dir_ / "requantized.gguf").string());
  int adapted = 0;
  double err_merged = 0, err_fresh = 0;
  for (const auto& [name, lora] : mg_->adapters()) {
    const gguf::TensorInfo *x = exact->tensor(name), *a = merged->tensor(name), *b = fresh->tensor(name);
    ASSERT_TRUE(x && a && b) << name;
    if (a->type != b->type) continue;  // q2_k: init-model made every matrix Q2_K, quantize's mix chooses others
    const Format f = find_format(uint32_t(a->type))->format;
    const float* want = reinterpret_cast<const float*>(x->data);
    const std::vector<float> got = dequantize_matrix(f, {a->data, a->bytes}, a->rows(), a->cols());
    const std::vector<float> requantized = dequantize_matrix(f, {b->data, b->bytes}, b->rows(), b->cols());
    double e_merged = 0, e_fresh = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      e_merged += double(got[i] - want[i]) * double(got[i] - want[i]);
      e_fresh += double(requantized[i] - want[i]) * double(requantized[i] - want[i]);
    }
    EXPECT_LE(e_merged, e_fresh * (1 + 1e-6)) << name;
    err_merged += e_merged, err_fresh += e_fresh;
    ++adapted;
  }
  std::printf("%s %s: squared weight error of the merge %.4g, of quantizing W + dW afresh %.4g\n", arch.c_str(),
              type.c_str(), err_merged, err_fresh);
  EXPECT_GT(adapted, 0);
}

// Every architecture (q8_0 for all but llama) and every format (llama).
const std::vector<Variant> kMergeCases = {
    Variant{"qwen2", 2.0, 0, "q8_0"}, Variant{"qwen3", 2.0, 0, "q8_0"},
    Variant{"gemma2", 2.0, 0, "q8_0"}, Variant{"gemma3", 2.0, 0, "q8_0"},
    Variant{"phi3", 2.0, 0, "q8_0"}, Variant{"llama", 2.0, 0, "q4_0"},
    Variant{"llama", 2.0, 0, "q4_1"}, Variant{"llama", 2.0, 0, "q5_0"},
    Variant{"llama", 2.0, 0, "q5_1"}, Variant{"llama", 2.0, 0, "q8_0"},
    Variant{"llama", 2.0, 0, "q2_k"}, Variant{"llama", 2.0, 0, "q3_k"},
    Variant{"llama", 2.0, 0, "q4_k"}, Variant{"llama", 2.0, 0, "q5_k"},
    Variant{"llama", 2.0, 0, "q6_k"}, Variant{"llama", 2.0, 0, "iq4_nl"},
    Variant{"llama", 2.0, 0, "iq4_xs"}, Variant{"llama", 2.0, 0, "f16"},
    Variant{"llama", 2.0, 0, "bf16"}, Variant{"llama", 2.0, 0, "f32"},
    Variant{"llama", 2.0, 0, "q4_k_m"}};

// By default a llama case is left out where another architecture's case has its type (llama_q8_0): every
// architecture and every type still runs. Q4T_FULL_MATRIX=1 in the environment when the tests are listed and run
// (ctest lists them as it starts: tests/interop/CMakeLists.txt) runs every case.
std::vector<Variant> merge_cases() {
  const char* full = std::getenv("Q4T_FULL_MATRIX");
  if (full && std::string(full) == "1") return kMergeCases;
  std::vector<Variant> cases;
  for (const Variant& v : kMergeCases) {
    const auto other_arch_has_type = [&](const Variant& o) {
      return std::string(o.arch) != "llama" && std::string(o.type) == v.type;
    };
    if (std::string(v.arch) != "llama" || std::none_of(kMergeCases.begin(), kMergeCases.end(), other_arch_has_type))
      cases.push_back(v);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    EveryArchitectureAndFormat, LlamaCppRunsTheMergedModel, ::testing::ValuesIn(merge_cases()),
    [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.arch) + "_" + i.param.type; });

class PeftLoadsOurExport : public Workdir, public ::testing::WithParamInterface<std::pair<const char*, const char*>> {
 protected:
  void SetUp() override {
    Workdir::SetUp();
    const CmdResult probe = run("python3 -c 'import torch, transformers, peft, numpy'");
    if (probe.code != 0) GTEST_SKIP() << "python3 with torch, transformers, peft and numpy is needed: " << probe.out;
  }

  // PyTorch + peft apply the PEFT folder `peft` to m.gguf: their logits of ids.json agree with q4tune's
  // (adapted.json), and the bare model's with base.json. `label` names the case in the printed ratios.
  void expect_peft_agrees(const fs::path& peft, const std::string& label) {
    const fs::path result = dir_ / "peft_result.json";
    const CmdResult r = run("python3 " + interop::quoted(fs::path(Q4T_INTEROP_DIR) / "peft_check.py") + " --model " +
                            interop::quoted(dir_ / "m.gguf") + " --peft " + interop::quoted(peft) + " --ids-file " +
                            interop::quoted(dir_ / "ids.json") + " --logits " + interop::quoted(dir_ / "adapted.json") +
                            " --base-logits " + interop::quoted(dir_ / "base.json") + " --out " +
                            interop::quoted(result));
    ASSERT_EQ(r.code, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(result));
    std::printf("%s: PEFT vs q4tune worst ratio %.3g (bare model %.3g)\n", label.c_str(), j.at("ratio").get<double>(),
                j.at("base_ratio").get<double>());
    EXPECT_LE(j.at("base_ratio").get<double>(), kTolerance);
    EXPECT_LE(j.at("ratio").get<double>(), kTolerance);
  }
};

TEST_P(PeftLoadsOurExport, AndGivesQ4tunesLogits) {
  const auto [arch, type] = GetParam();
  make_adapted_model(arch, type, 31);
  ASSERT_FALSE(HasFailure());
  const fs::path adapter = dir_ / "adapter.gguf", peft = dir_ / "peft";
  export_gguf_adapter(*mg_, 2.0, adapter.string());
  ExportInfo info;
  info.alpha = 2.0;
  info.base_model = "q4t-test-" + std::string(arch);
  export_peft(*mg_, info, peft.string());
  q4tune_logits("", "base.json");
  q4tune_logits(" --adapter " + interop::quoted(adapter), "adapted.json");
  ASSERT_FALSE(HasFailure());
  expect_peft_agrees(peft, std::string(arch) + " " + type);
}

// The PEFT folder `q4tune train` writes at the end of a run, loaded by PyTorch + peft: q4tune's logits with the
// run's adapter.gguf.
TEST_P(PeftLoadsOurExport, AfterQ4tuneTrain) {
  const auto [arch, type] = GetParam();
  make_adapted_model(arch, type, 41);
  ASSERT_FALSE(HasFailure());
  const fs::path run_dir = dir_ / "run";
  const CmdResult t = run(std::string(Q4TUNE_BIN) + " train --model " + interop::quoted(dir_ / "m.gguf") + " --data " +
                          interop::quoted(fs::path(Q4T_SOURCE_DIR) / "configs" / "demo.jsonl") + " --out " +
                          interop::quoted(run_dir) + " --steps 30 --seq-len 64 --pack --batch-size 2 --lr 1e-2"
                          " --lora-rank 8 --lora-alpha 12 --rslora");
  ASSERT_EQ(t.code, 0) << t.out;
  q4tune_logits("", "base.json");
  q4tune_logits(" --adapter " + interop::quoted(run_dir / "adapter.gguf"), "adapted.json");
  ASSERT_FALSE(HasFailure());
  expect_peft_agrees(run_dir / "peft", std::string(arch) + " " + type + " trained");
}

INSTANTIATE_TEST_SUITE_P(Variants, PeftLoadsOurExport,
                         ::testing::Values(std::pair{"llama", "q4_0"}, std::pair{"qwen2", "f32"},
                                           std::pair{"qwen3", "q4_0"}, std::pair{"gemma2", "q4_0"},
                                           std::pair{"gemma3", "f32"}, std::pair{"phi3", "q4_0"}),
                         [](const auto& i) { return std::string(i.param.first) + "_" + i.param.second; });

}  // namespace
}  // namespace q4t
