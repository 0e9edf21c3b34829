// q4tune merge: an adapter folded into its base gives the logits of base + adapter (exactly in f32, within the
// requantization error in the weights' own types), several adapters fold in one go, a run directory stands for its
// adapter, every mismatch is one error with no output, and the merge streams (peak memory through this binary's
// own operator new stays near one weight in f32). Requantizing against calibration inputs lowers the output error
// of every format.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include <Eigen/Cholesky>
#include <random>

#include "data/gguf.h"
#include "kernels/formats.h"
#include "scratch_dir.h"
#include "shell.h"
#include "train/commands.h"
#include "train/requantize.h"

namespace fs = std::filesystem;

// The allocator's accounting: every operator new of this test binary counts its bytes (in a header before the
// block), and the peak is kept.
namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};
constexpr size_t kHeader = 16;
}  // namespace

void* operator new(size_t n) {
  void* p = std::malloc(n + kHeader);
  if (!p) throw std::bad_alloc();
  *static_cast<size_t*>(p) = n;
  const int64_t live = g_live += int64_t(n);
  for (int64_t peak = g_peak; live > peak && !g_peak.compare_exchange_weak(peak, live);) {
  }
  return static_cast<char*>(p) + kHeader;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  char* block = static_cast<char*>(p) - kHeader;
  g_live -= int64_t(*reinterpret_cast<size_t*>(block));
  std::free(block);
}
void operator delete(void* p, size_t) noexcept { operator delete(p); }
void* operator new[](size_t n) { return operator new(n); }
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete[](void* p, size_t) noexcept { operator delete(p); }

namespace {

using q4t::test::CmdResult;

const fs::path& dir() {
  static const fs::path d = q4t::test::process_scratch_dir("q4t_merge_");
  return d;
}

CmdResult q4tune(const std::string& args) {
  return q4t::test::run_shell("cd " + q4t::test::quoted(dir()) + " && " + std::string(Q4TUNE_BIN) + " " + args);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Logits of the model (with an adapter) on a fixed prompt, on the CPU in f32.
std::vector<double> logits(const std::string& model, const std::string& adapter = "") {
  const std::string out = model + (adapter.empty() ? "" : "+" + fs::path(adapter).filename().string()) + ".json";
  const CmdResult r = q4tune("logits -m " + model + " --ids 1,72,101,108,108,111,32,119 --device cpu -o " + out +
                             (adapter.empty() ? "" : " --lora " + adapter));
  EXPECT_EQ(r.code, 0) << r.out;
  std::vector<double> v;
  if (r.code != 0) return v;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir() / out));
  for (const auto& row : j["logits"])
    for (double x : row) v.push_back(x);
  return v;
}

// max|a - b| / max|b|.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i])), m = std::max(m, std::abs(b[i]));
  return d / m;
}

// A base model of the type, and a run trained on it for a few steps (so its adapter moves the logits).
void make_base_and_run(const std::string& type, const std::string& stem, int64_t dim = 256) {
  if (fs::exists(dir() / (stem + ".gguf"))) return;
  ASSERT_EQ(q4tune("init-model -o " + stem + ".gguf --type " + type + " --dim " + std::to_string(dim) +
                   " --ff " + std::to_string(3 * dim) + " --layers 2 --seed 3")
                .code,
            0);
  const CmdResult t = q4tune("train -m " + stem + ".gguf --data " + std::string(Q4T_SOURCE_DIR) +
                             "/configs/demo.jsonl -o " + stem + "-run --steps 12 --lr 2e-2 --seq-len 32 --device cpu "
                             "--lora-rank 4 --save-every 6");
  ASSERT_EQ(t.code, 0) << t.out;
}

TEST(Merge, F32MergeGivesTheLogitsOfBasePlusAdapter) {
  make_base_and_run("q4_0", "q40");
  const CmdResult m = q4tune("merge -m q40.gguf --lora q40-run/adapter.gguf --type f32 -o q40-merged-f32.gguf");
  ASSERT_EQ(m.code, 0) << m.out;
  EXPECT_TRUE(has(m.out, "wrote q40-merged-f32.gguf: 14 adapted weights merged from 1 adapter (as f32), ")) << m.out;
  const std::vector<double> want = logits("q40.gguf", "q40-run/adapter.gguf"), base = logits("q40.gguf");
  const double merged = rel_diff(logits("q40-merged-f32.gguf"), want);
  EXPECT_LT(merged, 1e-5);
  EXPECT_GT(rel_diff(base, want), 100 * merged) << "the adapter must matter";
  // The merged file names the merge and its adapter.
  const auto f = q4t::gguf::File::open((dir() / "q40-merged-f32.gguf").string());
  EXPECT_EQ(f->get_string("general.name"), f->find("general.name") ? f->get_string("general.name") : "");
  EXPECT_TRUE(has(f->get_string("general.name"), " + LoRA")) << f->get_string("general.name");
  EXPECT_EQ(std::get<std::string>(f->get_array("q4tune.merge.adapters", q4t::gguf::ValueType::STRING)[0].v),
            "adapter.gguf");
  EXPECT_EQ(f->tensor("blk.0.attn_q.weight")->type, q4t::gguf::GgmlType::F32);
  EXPECT_EQ(f->tensor("token_embd.weight")->type, q4t::gguf::GgmlType::F32);  // converted by the f32 recipe
}

// mean|a - b| over every logit.
double mean_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += std::abs(a[i] - b[i]);
  return d / double(std::max<size_t>(a.size(), 1));
}

// `same`: each weight keeps its type; the logits differ from base + adapter only by requantizing W + ΔW, which
// is much less than what the adapter changes. Compared on the mean over every logit: these small trained models
// have positions where a perturbation as small as BF16's rounding moves a logit by a quarter of the largest.
TEST(Merge, SameTypeMergeStaysWithinTheRequantizationError) {
  for (const std::string type : {"q4_0", "q8_0", "q4_k_m", "iq4_xs", "bf16"}) {
    const std::string stem = "same_" + type;
    make_base_and_run(type, stem);
    const CmdResult m = q4tune("merge -m " + stem + ".gguf --lora " + stem + "-run/adapter.gguf -o " + stem + "-m.gguf");
    ASSERT_EQ(m.code, 0) << m.out;
    const auto in = q4t::gguf::File::open((dir() / (stem + ".gguf")).string());
    const auto out = q4t::gguf::File::open((dir() / (stem + "-m.gguf")).string());
    for (const auto& t : in->tensors()) EXPECT_EQ(out->tensor(t.name)->type, t.type) << type << " " << t.name;
    const std::vector<double> want = logits(stem + ".gguf", stem + "-run/adapter.gguf"), merged = logits(stem + "-m.gguf");
    const std::vector<double> base = logits(stem + ".gguf");
    const double err = mean_diff(merged, want), effect = mean_diff(base, want);
    std::printf("merge --type same, %s: mean|merged - (base + adapter)| = %.3g, the adapter's effect %.3g (largest: "
                "%.3g of max|logit|, the effect %.3g)\n",
                type.c_str(), err, effect, rel_diff(merged, want), rel_diff(base, want));
    EXPECT_LT(err, 0.25 * effect) << type;
  }
}

// A run directory (its newest complete checkpoint) merges like the adapter.gguf the run wrote; two adapters at
// once, with scales, equal merging one and then the other.
TEST(Merge, ARunDirectoryAndSeveralAdaptersWithScales) {
  make_base_and_run("q8_0", "q80");
  ASSERT_EQ(q4tune("merge -m q80.gguf --lora q80-run --type f32 -o from-run.gguf").code, 0);
  ASSERT_EQ(q4tune("merge -m q80.gguf --lora q80-run/adapter.gguf --type f32 -o from-file.gguf").code, 0);
  EXPECT_LT(rel_diff(logits("from-run.gguf"), logits("from-file.gguf")), 1e-6);

  const std::string a = "q80-run/adapter.gguf", b = "q80-run/checkpoints/step-6";
  CmdResult r = q4tune("merge -m q80.gguf --lora " + a + " --adapter-scale 0.5 --lora " + b +
                       " --adapter-scale 2 --type f32 -o both.gguf");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "merged from 2 adapters")) << r.out;
  ASSERT_EQ(q4tune("merge -m q80.gguf --lora " + a + " --adapter-scale 0.5 --type f32 -o first.gguf").code, 0);
  ASSERT_EQ(q4tune("merge -m first.gguf --lora " + b + " --adapter-scale 2 --type f32 -o second.gguf").code, 0);
  const auto both = q4t::gguf::File::open((dir() / "both.gguf").string());
  const auto two_steps = q4t::gguf::File::open((dir() / "second.gguf").string());
  for (const auto& t : both->tensors()) {
    const auto* u = two_steps->tensor(t.name);
    ASSERT_TRUE(u && u->bytes == t.bytes) << t.name;
    if (t.type != q4t::gguf::GgmlType::F32) continue;
    const float* x = reinterpret_cast<const float*>(t.data);
    const float* y = reinterpret_cast<const float*>(u->data);
    for (int64_t i = 0; i < int64_t(t.bytes / 4); ++i) ASSERT_NEAR(x[i], y[i], 1e-5f * (1 + std::abs(y[i]))) << t.name;
  }
  r = q4tune("merge -m q80.gguf --lora " + a + " --lora " + b + " --adapter-scale 2 -o x.gguf");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.out, "merge: 1 --adapter-scale for 2 adapters: give one per adapter, or none")) << r.out;
}

// Each mismatch: one error line naming what is wrong, no output file, and an existing output left as it was.
TEST(Merge, MismatchedAdaptersAreOneErrorEachAndWriteNothing) {
  make_base_and_run("q8_0", "q80");
  ASSERT_EQ(q4tune("init-model -o qwen.gguf --arch qwen2 --type q8_0 --dim 256 --ff 768 --layers 2").code, 0);
  ASSERT_EQ(q4tune("init-model -o wide.gguf --type q8_0 --dim 512 --ff 768 --layers 2").code, 0);
  ASSERT_EQ(q4tune("init-model -o deep.gguf --type q8_0 --dim 256 --ff 768 --layers 1").code, 0);
  std::ofstream(dir() / "existing.gguf") << "an earlier file";
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {
           Case{"-m qwen.gguf --lora q80-run/adapter.gguf",
                "q80-run/adapter.gguf: an adapter for a llama model; qwen.gguf is qwen2"},
           Case{"-m wide.gguf --lora q80-run/adapter.gguf",
                "q80-run/adapter.gguf: its adapter of 'blk.0.attn_q.weight' (A [4, 256], B [256, 4]) does not fit the "
                "weight [512, 512] of wide.gguf (an adapter of a model with other dims?)"},
           Case{"-m deep.gguf --lora q80-run/adapter.gguf",
                "q80-run/adapter.gguf: its adapter of 'blk.1.attn_q.weight' names no tensor of deep.gguf (an adapter "
                "of another model?)"},
           Case{"-m q80.gguf --lora qwen.gguf",
                "qwen.gguf is a model (it has token_embd.weight), not a LoRA adapter"},
           Case{"-m q80-run/adapter.gguf --lora q80-run/adapter.gguf", "q80-run/adapter.gguf is a LoRA adapter"},
           Case{"-m q80.gguf --lora no-such-run", "--adapter: 'no-such-run' does not exist"},
           Case{"-m q80.gguf --lora q80.gguf --type q9_9", "--type: 'q9_9' is not one of"},
       }) {
    const CmdResult r = q4tune("merge " + c.args + " -o existing.gguf");
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, c.message)) << c.args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    std::ostringstream kept;
    kept << std::ifstream(dir() / "existing.gguf").rdbuf();
    EXPECT_EQ(kept.str(), "an earlier file") << c.args;
  }
  for (const auto& e : fs::directory_iterator(dir()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// Streaming: the merge's peak allocation stays near one weight in f32 (plus its requantized bytes and the
// adapters), far below the f32 size of all the weights.
TEST(Merge, PeakMemoryIsAboutOneWeightInF32) {
  ASSERT_EQ(q4tune("init-model -o big.gguf --type q4_k_m --dim 512 --ff 1536 --layers 8 --seed 5").code, 0);
  const CmdResult t = q4tune("train -m big.gguf --data " + std::string(Q4T_SOURCE_DIR) +
                             "/configs/demo.jsonl -o big-run --steps 1 --seq-len 16 --device cpu --lora-rank 4");
  ASSERT_EQ(t.code, 0) << t.out;
  q4t::MergeOptions o;
  o.model = (dir() / "big.gguf").string();
  o.adapters = {(dir() / "big-run" / "adapter.gguf").string()};
  o.out = (dir() / "big-merged.gguf").string();
  int64_t all_weights = 0, largest = 0;
  {
    const auto f = q4t::gguf::File::open(o.model);
    for (const auto& w : f->tensors())
      if (w.ne.size() == 2) all_weights += 4 * w.rows() * w.cols(), largest = std::max(largest, 4 * w.rows() * w.cols());
  }
  std::ostringstream log;
  const int64_t before = g_live;
  g_peak = before;
  ASSERT_EQ(q4t::run_merge(o, log), 0);
  const int64_t peak = g_peak - before;
  std::printf("merge peak allocation %.2f MiB; largest weight in f32 %.2f MiB; all weights in f32 %.2f MiB\n",
              double(peak) / (1 << 20), double(largest) / (1 << 20), double(all_weights) / (1 << 20));
  EXPECT_LT(peak, 3 * largest);
  EXPECT_LT(peak, all_weights / 4);
}

}  // namespace

namespace {

// Calibration-like inputs X [N, k]: independent noise plus a few shared directions (correlated columns), and columns
// of unequal scale.
// The directions come from `mix_seed`, so two draws of tokens can share them.
Eigen::MatrixXf correlated_inputs(int64_t N, int64_t k, std::mt19937& rng, uint32_t mix_seed = 1) {
  std::normal_distribution<float> g;
  Eigen::MatrixXf z(N, 8), mix(8, k), x(N, k);
  for (int64_t i = 0; i < z.size(); ++i) z.data()[i] = g(rng);
  std::mt19937 mix_rng(mix_seed);
  for (int64_t i = 0; i < mix.size(); ++i) mix.data()[i] = g(mix_rng);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = g(rng);
  x += 0.5f * z * mix;
  for (int64_t j = 0; j < k; j += 7) x.col(j) *= 4.0f;
  return x;
}

}  // namespace

// The factor of the calibration inputs is what the error feedback needs: Uᵀ·U = (XᵀX/N + λI)⁻¹, U upper.
TEST(Requantize, InputFactorInvertsTheDampedCovariance) {
  std::mt19937 rng(5);
  const Eigen::MatrixXf X = correlated_inputs(50, 40, rng);  // fewer tokens than columns: the damping makes it whole
  const auto f = q4t::input_factor(X, 0.01);
  Eigen::MatrixXd H = (X.cast<double>().transpose() * X.cast<double>()) / 50.0;
  H.diagonal().array() += 0.01 * H.diagonal().mean();
  const Eigen::MatrixXd U = f->U.cast<double>();
  EXPECT_LT((U.transpose() * U * H - Eigen::MatrixXd::Identity(40, 40)).cwiseAbs().maxCoeff(), 1e-3);
  EXPECT_EQ(U.triangularView<Eigen::StrictlyLower>().toDenseMatrix().cwiseAbs().maxCoeff(), 0.0);
  EXPECT_EQ(f->tokens, 50);
}

// With calibration inputs, every format's requantization leaves a smaller output error |(W - Ŵ)·x|² than rounding
// each weight alone, on other inputs of the same distribution (not the calibration tokens themselves), from
// scratch and with an old grid; formats without per-weight quants round alone.
TEST(Requantize, CalibrationInputsLowerTheOutputErrorOfEveryFormat) {
  using q4t::gguf::GgmlType;
  std::mt19937 rng(11);
  const int64_t n_out = 13, n_in = 512;  // an odd row count; two super-blocks per row
  const auto factor = q4t::input_factor(correlated_inputs(4 * n_in, n_in, rng));
  const Eigen::MatrixXf X = correlated_inputs(1000, n_in, rng);  // held out
  std::normal_distribution<float> g;
  std::vector<float> w(static_cast<size_t>(n_out * n_in)), change(w.size());
  for (float& v : w) v = 0.05f * g(rng);
  for (float& v : change) v = 0.01f * g(rng);
  for (const char* name : {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl",
                           "iq4_xs", "bf16", "f16"}) {
    const q4t::FormatTraits& f = *q4t::find_format(name);
    const auto type = GgmlType(uint32_t(f.format));  // the table's codes are GGML's type numbers
    std::vector<float> plain = w, fed = w;
    const double alone = q4t::output_error(w, q4t::encode_weight(plain, type, n_out, n_in), type, n_out, n_in, X);
    const double with = q4t::output_error(w, q4t::encode_weight(fed, type, n_out, n_in, nullptr, factor.get()), type,
                                          n_out, n_in, X);
    // The same after a change, with the bytes from before it as the old grid.
    std::vector<float> before_w = w, after = w;
    const std::vector<uint8_t> before = q4t::encode_weight(before_w, type, n_out, n_in);
    for (size_t i = 0; i < after.size(); ++i) after[i] += change[i];
    std::vector<float> a1 = after, a2 = after;
    const double old_alone = q4t::output_error(after, q4t::encode_weight(a1, type, n_out, n_in, before.data()), type,
                                               n_out, n_in, X);
    const double old_with = q4t::output_error(
        after, q4t::encode_weight(a2, type, n_out, n_in, before.data(), factor.get()), type, n_out, n_in, X);
    std::printf("%-7s output error: rounding alone %.4g, with the inputs %.4g (%.2fx); after a change, on the old "
                "grid too: %.4g, %.4g (%.2fx)\n",
                name, alone, with, with / alone, old_alone, old_with, old_with / old_alone);
    if (f.format == q4t::Format::BF16 || f.format == q4t::Format::F16) {
      EXPECT_EQ(with, alone) << name;
      continue;
    }
    EXPECT_LT(with, 0.8 * alone) << name;
    EXPECT_LT(old_with, 0.8 * old_alone) << name;
  }
}

// --calibration: the merged weights are quantized against the inputs they see on a dataset (run through the base
// with its adapter); the result still is base + adapter within the requantization error. Refusals write nothing.
TEST(Merge, CalibrationQuantizesAgainstTheInputsSeenOnData) {
  make_base_and_run("q4_k_m", "cal");
  const std::string data = std::string(Q4T_SOURCE_DIR) + "/configs/demo.jsonl";
  CmdResult r = q4tune("merge -m cal.gguf --lora cal-run/adapter.gguf -o cal-m.gguf --calibration " + data +
                       " --calibration-tokens 600 --calibration-seq-len 64");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "calibration: 600 tokens of " + data + " through the base and its adapter (8 inputs, ")) << r.out;
  EXPECT_FALSE(has(r.out, "rounded alone")) << r.out;
  r = q4tune("merge -m cal.gguf --lora cal-run/adapter.gguf -o plain-m.gguf");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "the 14 quantized weights written anew were rounded alone; --calibration DATA")) << r.out;
  const std::vector<double> want = logits("cal.gguf", "cal-run/adapter.gguf");
  const double cal = rel_diff(logits("cal-m.gguf"), want), plain = rel_diff(logits("plain-m.gguf"), want);
  const double effect = rel_diff(logits("cal.gguf"), want);
  std::printf("q4_k_m merge: max|merged - (base + adapter)| / max|.| = %.3g calibrated, %.3g rounded alone; the "
              "adapter's effect %.3g\n", cal, plain, effect);
  EXPECT_LT(cal, 0.25 * effect);

  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--lora cal-run/adapter.gguf --lora cal-run/adapter.gguf --calibration " + data,
            "--calibration: runs the base with one adapter; merge several one after the other"},
           {"--lora cal-run/adapter.gguf --calibration missing.jsonl",
            "--calibration: 'missing.jsonl' does not exist or is not a file"},
           {"--lora cal-run/adapter.gguf --calibration " + data + " --calibration-tokens 0",
            "--calibration-tokens: must be at least 1"}}) {
    r = q4tune("merge -m cal.gguf " + args + " -o refused.gguf");
    EXPECT_EQ(r.code, 1) << args;
    EXPECT_TRUE(has(r.out, message)) << r.out;
    EXPECT_FALSE(fs::exists(dir() / "refused.gguf")) << args;
  }
}
