// q4tune train end to end: token-normalised gradient accumulation, exact resume after SIGKILL, option and config
// errors, the non-finite-loss stop, and the embedded demo.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "autograd/backend.h"
#include "shell.h"
#include "data/checksum.h"
#include "data/dataset.h"
#include "kernels/vulkan/device.h"
#include "train/checkpoint.h"
#include "train/commands.h"
#include "train/train.h"
#include <CLI/CLI.hpp>
#include "train/loss_graph.h"
#include "train/model/model.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace q4t {
namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("q4t_train_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// q4tune as a child process: stdout and stderr to files under dir; env adds or replaces variables.
struct Child {
  pid_t pid = -1;
  fs::path out, err;
};

Child spawn(const std::vector<std::string>& args, const fs::path& dir, const std::string& tag,
            const std::map<std::string, std::string>& env = {}) {
  Child c;
  c.out = dir / (tag + ".stdout");
  c.err = dir / (tag + ".stderr");
  c.pid = fork();
  if (c.pid == 0) {
    const int o = open(c.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(c.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1), dup2(e, 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(Q4TUNE_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(Q4TUNE_BIN, argv.data());
    _exit(127);
  }
  return c;
}

struct Result {
  int code = -1;  // exit code, or -signal
  std::string out, err;
};

Result wait_for(const Child& c) {
  int status = 0;
  waitpid(c.pid, &status, 0);
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  r.out = read_file(c.out);
  r.err = read_file(c.err);
  return r;
}

Result run(const std::vector<std::string>& args, const fs::path& dir, const std::string& tag,
           const std::map<std::string, std::string>& env = {}) {
  return wait_for(spawn(args, dir, tag, env));
}

// A small random llama (init-model) for the tests.
fs::path make_model(const fs::path& dir, int64_t dim, int64_t layers, const std::string& arch = "llama") {
  InitModelOptions o;
  o.arch = arch;
  o.dim = dim;
  o.layers = layers;
  o.heads = 4;
  o.kv_heads = 2;
  o.ff = 2 * dim;
  o.ctx = 512;
  o.out = (dir / ("model_" + arch + ".gguf")).string();
  std::ostringstream quiet;
  EXPECT_EQ(run_init_model(o, quiet), 0);
  return o.out;
}

const std::string kDemoData = std::string(Q4T_SOURCE_DIR) + "/configs/demo.jsonl";

// ---------------------------------------------------------------------------------------------------------------
// Token-normalised gradient accumulation: the same examples as one padded batch, as k micro-batches with other
// padding, and packed give the same loss and the same gradient of every LoRA matrix.

std::vector<data::Example> examples(int32_t n_vocab) {
  std::mt19937 rng(5);
  // (length, counted tokens from this index on): very different counts per example, so a mean of per-micro-batch
  // means would differ from the token mean.
  const std::vector<std::pair<int, int>> shape = {{25, 2}, {9, 7}, {17, 12}, {6, 1}, {21, 16}};
  std::vector<data::Example> out;
  for (auto [len, from] : shape) {
    data::Example e;
    for (int i = 0; i < len; ++i) {
      e.ids.push_back(3 + int32_t(rng() % uint32_t(n_vocab - 3)));
      e.mask.push_back(i >= from ? 1 : 0);
    }
    out.push_back(e);
  }
  return out;
}

struct Grads {
  double loss = 0;
  std::map<std::string, std::vector<double>> g;
  size_t graph_bytes = 0;  // the op nodes' values, gradients and scratch: their arena, or their own tensors
  int64_t recomputed = 0;  // forward runs the backward repeats
};

Grads step_gradients(const model::Model& m, const std::vector<data::Example>& ex, int64_t B, int64_t T, bool pack,
                     int64_t rows_per_micro, Grads* naive = nullptr,
                     LossGraph::Memory memory = LossGraph::Memory::Planned, double dropout = 0,
                     int64_t keep_ffn_layers = 0) {
  data::DatasetOptions o;
  o.seq_len = T;
  o.pack = pack;
  data::Dataset ds(ex, o, 2);
  std::vector<data::Batch> micro;
  for (size_t first = 0; first < ds.size(); first += size_t(rows_per_micro)) micro.push_back(ds.batch_at(first, B));
  LossGraph lg(m, B, T, 7, memory);  // a vocab tile that does not divide the vocabulary
  model::LoraSpec spec;
  spec.cfg.rank = 3;
  spec.cfg.dropout = dropout;
  std::mt19937 rng(11);
  lg.model_graph().add_adapters(spec, rng);
  lg.model_graph().keep_ffn_layers(keep_ffn_layers);
  lg.build();
  // B starts at zero, which would leave A without gradient: give every B the same values in every graph.
  ag::Backend& be = m.backend();
  for (const ag::Var& p : lg.graph().params()) {
    const std::string& name = lg.graph().node(p.id).name;
    if (name.find("lora_b") == std::string::npos) continue;
    std::mt19937 r(uint32_t(std::hash<std::string>{}(name)));
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    std::vector<float> v(size_t(p.value().numel()));
    for (float& x : v) x = u(r);
    be.upload(lg.graph().node(p.id).value, v);
  }
  const StepLoss sl = accumulate_gradients(lg, micro);
  Grads out;
  out.loss = sl.loss;
  out.graph_bytes = lg.graph().planned_bytes();
  out.recomputed = lg.graph().recomputed_steps();
  for (int id = 0; memory == LossGraph::Memory::PerTensor && id < lg.graph().size(); ++id) {
    const ag::Node& n = lg.graph().node(id);
    if (!n.op) continue;
    out.graph_bytes += n.value.bytes() + (n.grad.defined() ? n.grad.bytes() : 0);
    for (const ag::Tensor& t : n.saved) out.graph_bytes += t.bytes();
  }
  for (const ag::Var& p : lg.graph().params()) out.g[lg.graph().node(p.id).name] = be.to_host(lg.graph().grad(p));
  if (naive) {
    // What averaging per micro-batch would give: each micro-batch's mean loss weighted 1/k.
    naive->loss = 0;
    const std::vector<float> seed{1.0f / float(micro.size())};
    for (size_t i = 0; i < micro.size(); ++i) {
      lg.set_batch(micro[i]);
      naive->loss += lg.forward() / double(micro.size());
      lg.graph().backward(lg.loss(), be.from_host(seed, lg.loss().shape()),
                          i == 0 ? ag::Graph::Accumulate::None : ag::Graph::Accumulate::Params);
    }
    for (const ag::Var& p : lg.graph().params()) naive->g[lg.graph().node(p.id).name] = be.to_host(lg.graph().grad(p));
  }
  return out;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i])), m = std::max(m, std::abs(b[i]));
  return d / std::max(m, 1e-30);
}

void check_accumulation(ag::Backend& be, const std::string& label) {
  const fs::path dir = temp_dir("accum");
  auto m = model::Model::load(make_model(dir, 64, 1).string(), be);
  const auto ex = examples(int32_t(m->config().n_vocab));
  Grads naive;
  const Grads whole = step_gradients(*m, ex, 5, 24, false, 5);           // one batch, rows padded to 24
  const Grads micro = step_gradients(*m, ex, 1, 40, false, 1, &naive);   // 5 micro-batches padded to 40
  const Grads pairs = step_gradients(*m, ex, 2, 31, false, 2);           // 3 micro-batches (the last half empty)
  const Grads packed = step_gradients(*m, ex, 1, 48, true, 1);           // packed rows
  ASSERT_EQ(whole.g.size(), 14u);
  EXPECT_NEAR(micro.loss, whole.loss, 1e-5 * whole.loss) << label;
  EXPECT_NEAR(pairs.loss, whole.loss, 1e-5 * whole.loss) << label;
  EXPECT_NEAR(packed.loss, whole.loss, 1e-5 * whole.loss) << label;
  double worst = 0, naive_worst = 0;
  for (const auto& [name, g] : whole.g) {
    double gmax = 0;
    for (double v : g) gmax = std::max(gmax, std::abs(v));
    EXPECT_GT(gmax, 0) << label << " " << name << " has no gradient";
    for (const Grads* other : {&micro, &pairs, &packed}) {
      const double e = rel_diff(other->g.at(name), g);
      worst = std::max(worst, e);
      EXPECT_LT(e, 2e-5) << label << " " << name;
    }
    naive_worst = std::max(naive_worst, rel_diff(naive.g.at(name), g));
  }
  // The test can tell: weighting each micro-batch's mean equally instead is far off.
  EXPECT_GT(naive_worst, 0.05) << label;
  std::cout << label << ": loss " << whole.loss << " (mean of micro-batch means " << naive.loss
            << "), worst gradient difference " << worst << " (mean of micro-batch means: " << naive_worst << ")\n";
  fs::remove_all(dir);
}

// The checks that run on each backend: the CPU, and Vulkan where the machine has a device.
class EachBackend : public ::testing::TestWithParam<std::string> {
 protected:
  // check(backend, label) on this instance's backend; skipped without a Vulkan device.
  void on_backend(void (*check)(ag::Backend&, const std::string&)) {
    if (GetParam() == "cpu") {
      auto be = ag::Backend::cpu();
      check(*be, "cpu");
      return;
    }
    if (vk::Device::list().empty()) GTEST_SKIP() << "no Vulkan device";
    auto dev = vk::Device::open({-1, true});
    auto be = ag::Backend::vulkan(*dev);
    check(*be, dev->name());
  }
};

TEST_P(EachBackend, MicroBatchesGiveTheGradientsOfOneBatch) { on_backend(check_accumulation); }

// ---------------------------------------------------------------------------------------------------------------
// The memory plan changes where tensors live, never a result: with every tensor in memory of its own, with the
// planned arena, with the layers recomputed in the backward but for the ffn gate and up outputs of the last 2
// layers (--keep-ffn-layers 2), and with the layers recomputed in full, a step of 5 micro-batches (LoRA dropout on)
// gives bit-identical losses and gradients, and each mode holds less than the one before. Keeping a layer's gate
// and up outputs takes 2·T·n_ff floats and spares the recomputation their two products.

void check_memory_modes(ag::Backend& be, const std::string& label) {
  const fs::path dir = temp_dir("memory");
  auto m = model::Model::load(make_model(dir, 64, 3).string(), be);
  const auto ex = examples(int32_t(m->config().n_vocab));
  using Memory = LossGraph::Memory;
  const Grads own = step_gradients(*m, ex, 1, 40, false, 1, nullptr, Memory::PerTensor, 0.25);
  const Grads planned = step_gradients(*m, ex, 1, 40, false, 1, nullptr, Memory::Planned, 0.25);
  const Grads kept = step_gradients(*m, ex, 1, 40, false, 1, nullptr, Memory::Recompute, 0.25, 2);
  const Grads again = step_gradients(*m, ex, 1, 40, false, 1, nullptr, Memory::Recompute, 0.25);
  ASSERT_EQ(own.g.size(), 42u);  // A and B on 7 targets of 3 layers
  for (const Grads* other : {&planned, &kept, &again}) {
    EXPECT_EQ(other->loss, own.loss) << label;
    for (const auto& [name, g] : own.g) EXPECT_EQ(other->g.at(name), g) << label << " " << name;
  }
  EXPECT_LT(planned.graph_bytes, own.graph_bytes) << label;
  EXPECT_LT(kept.graph_bytes, planned.graph_bytes) << label;
  EXPECT_LT(again.graph_bytes, kept.graph_bytes) << label;
  // The kept layers' gate and up (adapted: the LoRA linear op each) are not run again.
  EXPECT_EQ(planned.recomputed, 0) << label;
  EXPECT_EQ(again.recomputed - kept.recomputed, 2 * 2) << label;
  std::cout << label << ": loss " << own.loss << "; graph memory " << own.graph_bytes << " bytes per tensor, "
            << planned.graph_bytes << " planned, " << kept.graph_bytes << " recomputing all but 2 layers' ffn gate "
            << "and up, " << again.graph_bytes << " recomputing all; " << again.recomputed << " and "
            << kept.recomputed << " forward runs repeated\n";
  fs::remove_all(dir);
}

TEST_P(EachBackend, PlannedAndRecomputedStepsGiveIdenticalGradientsInLessMemory) { on_backend(check_memory_modes); }

INSTANTIATE_TEST_SUITE_P(Backends, EachBackend, ::testing::Values("cpu", "vulkan"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------------------------------------------
// Exact resume: killed (SIGKILL) at three points and resumed, the run ends with the same bytes as a straight run.

std::vector<std::string> resume_args(const fs::path& model, const fs::path& out) {
  return {"train", "--model", model.string(), "--data", kDemoData, "--out", out.string(), "--device", "cpu",
          "--threads", "2", "--steps", "36", "--seq-len", "64", "--pack", "--batch-size", "2", "--grad-accum", "2",
          "--lr", "5e-3", "--warmup-steps", "4", "--lora-rank", "4", "--lora-dropout", "0.1", "--val-fraction", "0.125",
          "--eval-every", "10", "--save-every", "3", "--keep-checkpoints", "2", "--seed", "9"};
}

int64_t last_logged_step(const fs::path& metrics) {
  std::ifstream f(metrics);
  int64_t last = 0;
  for (std::string l; std::getline(f, l);) {
    const json j = json::parse(l, nullptr, false);
    if (j.is_object() && j.value("type", "") == "train") last = std::max<int64_t>(last, j["step"].get<int64_t>());
  }
  return last;
}

// Waits until the run c has logged step `step` into out/metrics.jsonl, for at most two minutes; false, with a
// failure, when the run ended before.
bool wait_until_logged(const Child& c, const fs::path& out, int64_t step) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (last_logged_step(out / "metrics.jsonl") < step && std::chrono::steady_clock::now() < deadline) {
    int status;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      ADD_FAILURE() << "the run ended before step " << step << ": " << read_file(c.err);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return true;
}

// A model and a straight run of resume_args in dir/straight, whose bytes an interrupted and resumed run must end
// with.
class Resume : public ::testing::Test {
 protected:
  void SetUp() override {
    const Result straight = run(resume_args(model, dir / "straight"), dir, "straight");
    ASSERT_EQ(straight.code, 0) << straight.err;
  }
  const fs::path dir = temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const fs::path model = make_model(dir, 128, 2);
};

TEST_F(Resume, KilledThreeTimesEndsWithTheBytesOfAStraightRun) {
  const fs::path out = dir / "killed";
  int kills = 0;
  for (int64_t kill_after : {5, 16, 27}) {
    std::vector<std::string> args = resume_args(model, out);
    if (kills > 0) args.push_back("--resume");
    const Child c = spawn(args, dir, "killed" + std::to_string(kills));
    // Once the run has logged step kill_after, kill it wherever it is (inside a step, an eval or a checkpoint
    // write).
    if (!wait_until_logged(c, out, kill_after)) return;
    kill(c.pid, SIGKILL);
    const Result r = wait_for(c);
    ASSERT_EQ(r.code, -SIGKILL) << "not killed at step " << kill_after << ": " << r.err;
    std::cout << "killed after step " << last_logged_step(out / "metrics.jsonl") << " (waited for " << kill_after << ")\n";
    ++kills;
  }
  std::vector<std::string> args = resume_args(model, out);
  args.push_back("--resume");
  const Result fin = run(args, dir, "final");
  ASSERT_EQ(fin.code, 0) << fin.err;
  EXPECT_NE(fin.out.find("resuming from"), std::string::npos) << fin.out;

  for (const char* f : {"adapter.gguf", "peft/adapter_model.safetensors", "peft/adapter_config.json"}) {
    const std::string a = read_file(dir / "straight" / f), b = read_file(out / f);
    ASSERT_FALSE(a.empty()) << f;
    EXPECT_TRUE(a == b) << f << " differs between the straight and the killed-and-resumed run";
  }
  EXPECT_EQ(read_file(dir / "straight/checkpoints/step-36/lora.bin"), read_file(out / "checkpoints/step-36/lora.bin"));
  EXPECT_EQ(read_file(dir / "straight/checkpoints/step-36/adam_v.bin"), read_file(out / "checkpoints/step-36/adam_v.bin"));
  // The log holds every step once, with the same losses as the straight run.
  std::map<int64_t, double> a, b;
  for (const auto& [file, m] : {std::pair{dir / "straight/metrics.jsonl", &a}, std::pair{out / "metrics.jsonl", &b}}) {
    std::ifstream in(file);
    for (std::string l; std::getline(in, l);) {
      const json j = json::parse(l);
      if (j["type"] == "train") {
        EXPECT_EQ(m->count(j["step"].get<int64_t>()), 0u) << "step " << j["step"] << " logged twice in " << file;
        (*m)[j["step"].get<int64_t>()] = j["loss"].get<double>();
      }
    }
  }
  EXPECT_EQ(a.size(), 36u);
  EXPECT_EQ(a, b);
  // q4tune export on the final checkpoint writes what the run wrote at its end.
  const Result eg = run({"export", (out / "checkpoints/step-36").string(), "--format", "gguf", "--out",
                         (dir / "exported.gguf").string()}, dir, "export_gguf");
  ASSERT_EQ(eg.code, 0) << eg.err;
  EXPECT_TRUE(read_file(dir / "exported.gguf") == read_file(out / "adapter.gguf"));
  const Result ep = run({"export", (out / "checkpoints/step-36").string(), "--format", "peft", "--out",
                         (dir / "exported_peft").string()}, dir, "export_peft");
  ASSERT_EQ(ep.code, 0) << ep.err;
  EXPECT_TRUE(read_file(dir / "exported_peft/adapter_model.safetensors") == read_file(out / "peft/adapter_model.safetensors"));
  EXPECT_TRUE(read_file(dir / "exported_peft/adapter_config.json") == read_file(out / "peft/adapter_config.json"));
  const Result bad = run({"export", (out / "checkpoints/step-36").string(), "--format", "onnx"}, dir, "export_bad");
  EXPECT_NE(bad.code, 0);
  EXPECT_EQ(lines_of(bad.err).size(), 1u) << bad.err;
  fs::remove_all(dir);
}

// Ctrl-C (SIGINT): the run saves a checkpoint of the step it finished, says how to continue and exits 130;
// --resume DIR then ends with the bytes of a straight run.
TEST_F(Resume, InterruptSavesACheckpointThenResumeFinishes) {
  const fs::path out = dir / "interrupted";
  const Child c = spawn(resume_args(model, out), dir, "interrupted");
  if (!wait_until_logged(c, out, 8)) return;
  kill(c.pid, SIGINT);
  const Result r = wait_for(c);
  ASSERT_EQ(r.code, 130) << r.err;
  const int64_t step = last_logged_step(out / "metrics.jsonl");
  EXPECT_NE(r.out.find("interrupted at step " + std::to_string(step)), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / ("step-" + std::to_string(step)) / "complete")) << r.out;
  EXPECT_FALSE(fs::exists(out / "adapter.gguf"));
  std::vector<std::string> args = resume_args(model, out);
  args.push_back("--resume");  // naming the checkpoint this time
  args.push_back((out / "checkpoints" / ("step-" + std::to_string(step))).string());
  const Result fin = run(args, dir, "final");
  ASSERT_EQ(fin.code, 0) << fin.err;
  EXPECT_TRUE(read_file(dir / "straight" / "adapter.gguf") == read_file(out / "adapter.gguf"));
  fs::remove_all(dir);
}

// What a resume checks and tidies before it continues: the data it trained on, and the leftovers of a killed run.
// (Kills at every write of a run are swept in test_kill_sweep.)
class ResumeGuards : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir); }
  // A short run of data in out, or its resume.
  Result train(const fs::path& data, bool resume, const std::string& tag) {
    std::vector<std::string> args = {"train", "--model", model.string(), "--data", data.string(), "--out",
                                     out.string(), "--device", "cpu", "--threads", "1", "--steps", "2",
                                     "--seq-len", "32", "--pack", "--batch-size", "1", "--lora-rank", "2",
                                     "--save-every", "1", "--keep-checkpoints", "1"};
    if (resume) args.push_back("--resume");
    return run(args, dir, tag);
  }
  const fs::path dir = temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const fs::path model = make_model(dir, 64, 1), out = dir / "out", data = dir / "data.jsonl";
};

std::string xxh3_hex(const std::string& bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(checksum64(bytes.data(), bytes.size())));
  return hex;
}

TEST_F(ResumeGuards, DataEditedInPlaceIsRefusedNamingTheFile) {
  fs::copy_file(kDemoData, data);
  ASSERT_EQ(train(data, false, "first").code, 0);
  const std::string before = read_file(data);
  std::string after = before;
  char& letter = after[after.find("\"prompt\": \"") + 11];  // of the first row: the same rows, other data
  letter = letter == 'x' ? 'y' : 'x';
  std::ofstream(data, std::ios::binary | std::ios::trunc) << after;
  const Result r = train(data, true, "edited");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.err, "q4tune: error: --resume: " + data.string() + " has changed since checkpoint " + out.string() +
                       "/checkpoints/step-2 was written (its XXH3 was \"" + xxh3_hex(before) + "\", now \"" +
                       xxh3_hex(after) + "\"); resume on the data the run started with, or start a new run in "
                       "another --out\n");
  EXPECT_EQ(r.out.find("resuming from"), std::string::npos) << r.out;
}

// A checkpoint written before the data's digest was recorded resumes, saying that the data is not checked.
TEST_F(ResumeGuards, ACheckpointWithoutADataDigestResumesWithAWarning) {
  fs::copy_file(kDemoData, data);
  ASSERT_EQ(train(data, false, "first").code, 0);
  const std::string step2 = (out / "checkpoints/step-2").string();
  CheckpointState s = load_checkpoint(step2);
  json config = json::parse(s.config_json);
  ASSERT_EQ(config.erase("data-xxh3"), 1u) << s.config_json;
  s.config_json = config.dump();
  save_checkpoint(out.string(), s, 1);
  const Result r = train(data, true, "older");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string warning = "warning: checkpoint " + step2 + " records no digest of its data (an older q4tune "
                              "wrote it): resuming without checking that " + data.string() + " is unchanged\n";
  EXPECT_NE(r.out.find(warning), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resuming from " + step2), std::string::npos) << r.out;
}

// The leftovers of a run killed while it deleted an old checkpoint (by an older q4tune, which deleted it in place)
// and while it exported are removed when the run starts again; files of the user's are not touched.
TEST_F(ResumeGuards, LeftoversOfAKilledRunAreRemovedWhenItStartsAgain) {
  ASSERT_EQ(train(kDemoData, false, "first").code, 0);
  const std::string adapter = read_file(out / "adapter.gguf");
  const std::vector<fs::path> leftovers = {out / "adapter.gguf.tmp-1a2b3c4d", out / "metrics.jsonl.tmp-Qw12Er",
                                           out / "peft/adapter_model.safetensors.tmp-Ab3dE6",
                                           out / "peft/adapter_config.json.tmp-Xy9Zw1", out / "checkpoints/step-1",
                                           out / "checkpoints/.tmp-step-3-Rt45Yu"};
  const std::vector<fs::path> users = {out / "notes.txt", out / "adapter.gguf.tmp-mine", out / "peft/README.md",
                                       out / "checkpoints/step-1.txt"};
  fs::create_directories(out / "checkpoints/step-1");
  fs::create_directories(out / "checkpoints/.tmp-step-3-Rt45Yu");
  for (const fs::path& f : {out / "checkpoints/step-1/lora.bin", out / "checkpoints/.tmp-step-3-Rt45Yu/lora.bin"})
    std::ofstream(f) << "partial";
  for (const fs::path& f : leftovers)
    if (!fs::is_directory(f)) std::ofstream(f) << "partial";
  for (const fs::path& f : users) std::ofstream(f) << "the user's";

  const Result r = train(kDemoData, true, "again");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("removed 6 leftovers of an interrupted run from " + out.string() + "\n"), std::string::npos)
      << r.out;
  for (const fs::path& f : leftovers) EXPECT_FALSE(fs::exists(f)) << f;
  for (const fs::path& f : users) EXPECT_EQ(read_file(f), "the user's") << f;
  EXPECT_TRUE(read_file(out / "adapter.gguf") == adapter);
}

// ---------------------------------------------------------------------------------------------------------------
// Bad options: one line on stderr, a non-zero exit, no work (nothing on stdout, no output directory).

class TrainErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = temp_dir("errors");
    model = make_model(dir, 64, 1);
  }
  void TearDown() override {
    fs::permissions(dir, fs::perms::owner_all);
    fs::remove_all(dir);
  }
  // Runs train with args; expects a one-line error containing each of `want`.
  void expect_error(std::vector<std::string> args, const std::vector<std::string>& want) {
    args.insert(args.begin(), "train");
    const Result r = run(args, dir, "err");
    EXPECT_NE(r.code, 0);
    const auto l = lines_of(r.err);
    ASSERT_EQ(l.size(), 1u) << r.err;
    EXPECT_EQ(l[0].rfind("q4tune: error: ", 0), 0u) << l[0];
    for (const auto& w : want) EXPECT_NE(l[0].find(w), std::string::npos) << "'" << w << "' not in: " << l[0];
    EXPECT_EQ(r.out, "") << "work started";
    EXPECT_FALSE(fs::exists(dir / "out" / "metrics.jsonl"));
  }
  std::vector<std::string> base() {
    return {"--model", model.string(), "--data", kDemoData, "--out", (dir / "out").string(), "--device", "cpu"};
  }
  // expect_error for the base options and then `more`.
  void expect_error_with(const std::vector<std::string>& more, const std::vector<std::string>& want) {
    std::vector<std::string> a = base();
    a.insert(a.end(), more.begin(), more.end());
    expect_error(a, want);
  }
  // The options of a config file c.toml holding `text`.
  std::vector<std::string> config(const std::string& text) { return {"--config", write("c.toml", text).string()}; }
  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return dir / name;
  }
  fs::path dir, model;
};

TEST_F(TrainErrors, UnknownConfigKey) {
  expect_error_with(config("lora-rank = 8\nlearning-rate = 0.1\n"), {"c.toml:2:1: unknown key 'learning-rate'"});
}

TEST_F(TrainErrors, WrongTypeInConfig) {
  expect_error_with(config("lora-rank = \"eight\"\n"),
                    {"c.toml:1:13: 'lora-rank' wants an integer, not the string \"eight\""});
}

TEST_F(TrainErrors, FlagGivenANumberInConfig) {
  expect_error_with(config("pack = 3\n"), {"c.toml:1:8: 'pack' wants true or false, not the integer 3"});
}

TEST_F(TrainErrors, RankZero) { expect_error_with({"--lora-rank", "0"}, {"--lora-rank", "0"}); }

TEST_F(TrainErrors, RankZeroInConfig) {
  expect_error_with(config("lora-rank = 0\n"), {"c.toml:1:13: 'lora-rank': ", "65536"});
}

TEST_F(TrainErrors, MissingModelFile) {
  expect_error({"--model", (dir / "nope.gguf").string(), "--data", kDemoData, "--out", (dir / "out").string()},
               {"--model", "nope.gguf"});
}

TEST_F(TrainErrors, MissingConfigFile) {
  expect_error_with({"--config", (dir / "none.toml").string()}, {"none.toml: no such config file"});
}

TEST_F(TrainErrors, KeepFfnLayersWithoutGradCheckpoint) {
  expect_error_with({"--keep-ffn-layers", "1"}, {"--keep-ffn-layers", "only with --grad-checkpoint"});
}

TEST_F(TrainErrors, KeepFfnLayersBeyondTheModel) {
  expect_error_with({"--grad-checkpoint", "--keep-ffn-layers", "2"},
                    {"--keep-ffn-layers", "2 exceeds the model's layer count (1)"});
}

TEST_F(TrainErrors, UnknownLoraTarget) {
  expect_error_with({"--lora-targets", "q,v,attn"}, {"--lora-targets", "attn"});
}

TEST_F(TrainErrors, OutputDirectoryUnderAFile) {
  write("plain_file", "x");
  expect_error({"--model", model.string(), "--data", kDemoData, "--out", (dir / "plain_file" / "out").string()},
               {"--out", "plain_file"});
}

TEST_F(TrainErrors, UnwritableOutputDirectory) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes through permissions (the directory-under-a-file case covers this)";
  fs::create_directories(dir / "ro");
  fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  expect_error({"--model", model.string(), "--data", kDemoData, "--out", (dir / "ro" / "out").string()}, {"--out"});
  fs::permissions(dir / "ro", fs::perms::owner_all);
}

TEST_F(TrainErrors, ExistingRunWithoutResume) {
  auto a = base();
  a.insert(a.begin(), "train");
  a.insert(a.end(), {"--steps", "2", "--seq-len", "64", "--pack", "--batch-size", "2"});
  const Result first = run(a, dir, "first");
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string adapter = read_file(dir / "out" / "adapter.gguf");
  a.erase(a.begin());
  a.insert(a.begin(), "train");
  const Result again = run(a, dir, "again");
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
  EXPECT_EQ(read_file(dir / "out" / "adapter.gguf"), adapter) << "the earlier run's adapter was touched";
}

TEST_F(TrainErrors, ResumeWithOtherOptions) {
  auto a = base();
  a.insert(a.begin(), "train");
  a.insert(a.end(), {"--steps", "2", "--seq-len", "64", "--pack", "--batch-size", "2"});
  ASSERT_EQ(run(a, dir, "first").code, 0);
  a.insert(a.end(), {"--resume", "--lora-rank", "8"});
  const Result r = run(a, dir, "other");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("lora-rank was 16, now 8"), std::string::npos) << r.err;
}

// A loss that overflows stops the run with one clear error, keeping the checkpoints written before it.
TEST_F(TrainErrors, NonFiniteLossStopsAndKeepsTheLastGoodCheckpoint) {
  auto a = base();
  a.insert(a.end(), {"--steps", "6", "--seq-len", "64", "--pack", "--batch-size", "2", "--lr", "1e30", "--schedule",
                     "constant", "--grad-clip", "0", "--save-every", "1"});
  a.insert(a.begin(), "train");
  const Result r = run(a, dir, "nan");
  EXPECT_EQ(r.code, 1);
  const auto l = lines_of(r.err);
  ASSERT_EQ(l.size(), 1u) << r.err;
  EXPECT_TRUE(l[0].find("the loss is") != std::string::npos || l[0].find("gradient norm is") != std::string::npos) << l[0];
  EXPECT_FALSE(fs::exists(dir / "out" / "adapter.gguf"));
  EXPECT_TRUE(fs::exists(dir / "out" / "checkpoints" / "step-1" / "complete")) << r.out;
}

// Every shipped config parses with the train flags (an unknown or mistyped key would throw), and its values arrive.
TEST(Configs, EveryShippedConfigParses) {
  for (const char* name : {"demo.toml", "tiny.toml", "llama-1b.toml"}) {
    CLI::App app;
    TrainOptions o;
    add_train_options(app.add_subcommand("train"), o);
    const std::string path = std::string(Q4T_SOURCE_DIR) + "/configs/" + name;
    std::vector<std::string> args{path, "--config", "train"};  // CLI11 takes them last first
    ASSERT_NO_THROW(app.parse(args)) << name;
    EXPECT_EQ(o.config, path);
    EXPECT_FALSE(o.out.empty()) << name;
    EXPECT_EQ(o.lora_targets.size(), 7u) << name;
    EXPECT_TRUE(o.pack) << name;
  }
  CLI::App app;
  TrainOptions o;
  add_train_options(app.add_subcommand("train"), o);
  const std::string demo = std::string(Q4T_SOURCE_DIR) + "/configs/demo.toml";
  std::vector<std::string> args{"3", "--lora-rank", demo, "--config", "train"};
  app.parse(args);
  EXPECT_EQ(o.lora_rank, 3) << "the command line wins over the file";
  EXPECT_EQ(o.seq_len, 96);
  EXPECT_EQ(o.model, "builtin:demo-model");
  ASSERT_EQ(o.sample_prompts.size(), 5u) << "a multi-line array with comments";
  EXPECT_EQ(o.sample_prompts[0], "Q: 0j\nA:") << "\\n in the file is a newline";
}

// ---------------------------------------------------------------------------------------------------------------
// The embedded demo as README command (a) runs it, on the CPU: the validation loss (pairs the training never shows)
// falls by far more than 30% from its first evaluation, and the held-out sample prompts are answered right with
// the adapter (the letter in capitals, the digit plus one) while the base model does not answer them.
TEST(Demo, EmbeddedDefaultLearnsARuleThatHoldsOnHeldOutPrompts) {
  const fs::path dir = temp_dir("demo");
  const Result r = run({"train", "--out", (dir / "demo").string(), "--device", "cpu"}, dir, "demo",
                       {{"XDG_CACHE_HOME", (dir / "cache").string()}});
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  std::vector<double> val;
  std::ifstream in(dir / "demo" / "metrics.jsonl");
  for (std::string l; std::getline(in, l);) {
    const json j = json::parse(l);
    if (j["type"] == "eval") val.push_back(j["val_loss"].get<double>());
  }
  ASSERT_GE(val.size(), 2u);
  EXPECT_LE(val.back(), 0.7 * val.front()) << "first " << val.front() << " last " << val.back();
  for (const char* f : {"adapter.gguf", "peft/adapter_model.safetensors", "peft/adapter_config.json", "loss.svg"})
    EXPECT_TRUE(fs::exists(dir / "demo" / f)) << f;
  // "  Q: 0j\nA:\n    base model:   ...\n    with adapter:  J1\n" per prompt.
  const std::regex sample(R"(  Q: (\w)(\w)\\nA:\n    base model:   (.*)\n    with adapter: (.*)\n)");
  int prompts = 0, right = 0, base_right = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), sample), end; it != end; ++it) {
    const std::string a = (*it)[1], b = (*it)[2];
    const char letter = std::isalpha(a[0]) ? a[0] : b[0], digit = std::isalpha(a[0]) ? b[0] : a[0];
    const std::string want = std::string(" ") + char(std::toupper(letter)) + char('0' + (digit - '0' + 1) % 10);
    ++prompts;
    right += (*it)[4] == want;
    base_right += (*it)[3] == want;
  }
  EXPECT_EQ(prompts, 5) << r.out;
  EXPECT_GE(right, 3) << r.out;
  EXPECT_EQ(base_right, 0) << r.out;
  fs::remove_all(dir);
}

// A sample prompt longer than the samples' context is an option error before the first step, not a failure
// after the last one.
TEST_F(TrainErrors, SamplePromptLongerThanTheContextIsRefusedBeforeTraining) {
  auto a = base();
  a.insert(a.begin(), "train");
  a.insert(a.end(), {"--steps", "2", "--seq-len", "64", "--sample-prompt", "hi", "--sample-prompt",
                     std::string(600, 'x')});
  const Result r = run(a, dir, "long-prompt");
  EXPECT_NE(r.code, 0);
  const auto l = lines_of(r.err);
  ASSERT_EQ(l.size(), 1u) << r.err;
  EXPECT_EQ(l[0], "q4tune: error: --sample-prompt: prompt 2 ('" + std::string(40, 'x') +
                      "...') is 602 tokens, more than the samples' context of 511 prompt tokens");
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out" / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "out" / "checkpoints"));
}

// A full disk is named as such, and the write probe does not stay behind. The disk fills for the probe's
// write only (strace's fault injection on that path).
TEST_F(TrainErrors, AFullDiskIsSaidSoAndLeavesNoProbe) {
  const fs::path out = dir / "out";
  fs::create_directories(out);
  std::string cmd = "strace -f -qq -o /dev/null -P " + test::quoted(out / ".q4tune-write-probe") +
                    " -e inject=write:error=ENOSPC " + test::quoted(Q4TUNE_BIN) + " train";
  for (const std::string& arg : base()) cmd += " " + test::quoted(arg);
  const test::CmdResult r = test::run_shell(cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("q4tune: error: --out: cannot write in directory '" + out.string() +
                       "': No space left on device"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::is_empty(out)) << "something was left in " << out;
}

}  // namespace
}  // namespace q4t
