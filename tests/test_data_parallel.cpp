// Data-parallel training under mpirun (train/distributed.h), on the CPU with oversubscribed ranks: N ranks of B rows
// end at the adapters of one process of N·B rows, a checkpoint resumes on another number of ranks, and a rank
// killed mid-run ends the job quickly with the last checkpoint intact. Skipped where q4tune was built without
// MPI or mpirun is missing (./run.sh installs both).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "shell.h"
#include "train/checkpoint.h"
#include "train/distributed.h"

namespace fs = std::filesystem;

namespace q4t {
namespace {

constexpr int kSteps = 6;

// Open MPI refuses root unless told; ranks beyond the cores are normal here (2 cores).
const std::string kMpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe "
                            "--mca btl self,vader --mca btl_vader_single_copy_mechanism none ";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Whether process pid runs (mpirun is started in the background and reaped by whoever adopts it: a zombie has ended).
bool running(const std::string& pid) {
  const std::string stat = read_file("/proc/" + pid + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dist::built_with_mpi()) GTEST_SKIP() << "q4tune was built without MPI (libopenmpi-dev)";
    if (test::run_shell("command -v mpirun").code != 0) GTEST_SKIP() << "no mpirun (openmpi-bin)";
    char templ[] = "/tmp/q4t_dp_XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    dir_ = templ;
    const test::CmdResult made = test::run_shell(test::quoted(Q4TUNE_BIN) + " init-model -o " +
                                                 test::quoted(dir_ / "model.gguf") + " --dim 64 --layers 2");
    ASSERT_EQ(made.code, 0) << made.out;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // q4tune train of kSteps steps into dir_/name with `ranks` processes (0: no mpirun) of `batch` rows each and
  // grad-accum `accum`; the global batch is ranks·batch·accum rows.
  test::CmdResult train(const std::string& name, int ranks, int batch, int accum = 1, const std::string& more = "") {
    std::string cmd = ranks > 0 ? kMpirun + "-np " + std::to_string(ranks) + " " : "";
    cmd += test::quoted(Q4TUNE_BIN) + " train --model " + test::quoted(dir_ / "model.gguf") + " --data " +
           test::quoted(std::string(Q4T_SOURCE_DIR) + "/configs/demo.jsonl") + " --val-data " +
           test::quoted(std::string(Q4T_SOURCE_DIR) + "/configs/demo-val.jsonl") + " --out " +
           test::quoted(dir_ / name) + " " + device_ + " --steps " + std::to_string(kSteps) +
           " --seq-len 48 --pack --lora-rank 4 --lr 1e-3 --seed 5 --eval-every 3 --save-every 3 --keep-checkpoints 0"
           " --batch-size " + std::to_string(batch) + " --grad-accum " + std::to_string(accum) + " " + more;
    return test::run_shell(cmd);
  }

  CheckpointState final_state(const std::string& name) const {
    return load_checkpoint((dir_ / name / "checkpoints" / ("step-" + std::to_string(kSteps))).string());
  }

  // max |a - b| / max |a| over every adapter tensor of the runs' last checkpoints.
  double relative_difference(const std::string& a, const std::string& b) const {
    const CheckpointState sa = final_state(a), sb = final_state(b);
    EXPECT_EQ(sa.lora.size(), sb.lora.size());
    double diff = 0, top = 0;
    for (size_t i = 0; i < std::min(sa.lora.size(), sb.lora.size()); ++i) {
      EXPECT_EQ(sa.lora[i].name, sb.lora[i].name);
      EXPECT_EQ(sa.lora[i].values.size(), sb.lora[i].values.size());
      for (size_t k = 0; k < std::min(sa.lora[i].values.size(), sb.lora[i].values.size()); ++k) {
        diff = std::max(diff, double(std::fabs(sa.lora[i].values[k] - sb.lora[i].values[k])));
        top = std::max(top, double(std::fabs(sa.lora[i].values[k])));
      }
    }
    EXPECT_GT(top, 0);
    return diff / top;
  }

  fs::path dir_;
  std::string device_ = "--device cpu --threads 1";
};

// The same 6 rows per step as one micro-batch of 6, as 2 or 3 micro-batches (--grad-accum), and on 2 or 3 ranks.
// The ranks sum their gradients as --grad-accum sums micro-batches: N ranks of B rows agree with one process of N
// micro-batches of B rows to 1e-6 (in practice bit for bit). Against one micro-batch of 6 rows, the f32 sums run in
// another order, and AdamW's first steps (m / sqrt(v) is about ±1 for any gradient) magnify that in the parameters
// with near-zero gradients: the ranks must sit where the single process's own --grad-accum sits.
TEST_F(DataParallel, TwoAndThreeRanksEndAtTheAdaptersOfOneRankWithTheSameGlobalBatch) {
  for (const auto& [name, ranks, batch, accum] : {std::tuple{"one", 0, 6, 1}, std::tuple{"accum2", 0, 3, 2},
                                                   std::tuple{"accum3", 0, 2, 3}, std::tuple{"two", 2, 3, 1},
                                                   std::tuple{"three", 3, 2, 1}}) {
    const test::CmdResult r = train(name, ranks, batch, accum);
    ASSERT_EQ(r.code, 0) << name << "\n" << r.out;
    if (std::string(name) == "two") {
      EXPECT_NE(r.out.find("on each of 2 ranks"), std::string::npos) << r.out;
    }
  }
  for (const auto& [ranks, accum] : {std::pair{"two", "accum2"}, std::pair{"three", "accum3"}}) {
    const double same_split = relative_difference(accum, ranks), whole = relative_difference("one", ranks),
                 whole_accum = relative_difference("one", accum);
    std::printf("%-5s against %s: %.3g; against one micro-batch of 6 rows: %.3g (%s: %.3g)\n", ranks, accum,
                same_split, whole, accum, whole_accum);
    EXPECT_LE(same_split, 1e-6) << ranks;
    EXPECT_LE(std::fabs(whole - whole_accum), 1e-6) << ranks;
    // The steps consumed the same rows: the data cursor is the same.
    EXPECT_EQ(final_state(ranks).cursor.index, final_state("one").cursor.index) << ranks;
    EXPECT_EQ(final_state(ranks).cursor.epoch, final_state("one").cursor.epoch) << ranks;
  }
  // Sharded evaluation: the same validation tokens, the same loss up to summation order.
  const auto val_lines = [&](const std::string& run) {
    std::ifstream f(dir_ / run / "metrics.jsonl");
    std::vector<std::pair<double, int64_t>> out;
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("type", "") == "eval") out.emplace_back(j["val_loss"].get<double>(), j["val_tokens"].get<int64_t>());
    }
    return out;
  };
  const auto ref = val_lines("one");
  ASSERT_EQ(ref.size(), 2u);
  for (const char* run : {"two", "three"}) {
    const auto got = val_lines(run);
    // Rank 0 alone writes: one line per step and evaluation, as one process.
    const std::string a = read_file(dir_ / run / "metrics.jsonl"), b = read_file(dir_ / "one" / "metrics.jsonl");
    EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), std::count(b.begin(), b.end(), '\n')) << run;
    ASSERT_EQ(got.size(), ref.size()) << run;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(got[i].second, ref[i].second) << run;
      EXPECT_NEAR(got[i].first, ref[i].first, 1e-5 * ref[i].first) << run;
    }
  }
}

// On Vulkan (two ranks sharing lavapipe here) the ranks sum their gradients bucket by bucket while the backward of
// the step's last micro-batch runs (ag::FlatGrads): each bucket is copied out and signalled as soon as the backward
// is done with it. A copy or a signal placed before the backward's last add into a gradient would show as another
// adapter than that of the same ranks summing everything after the backward (--grad-bucket-mb 0): the same sums
// in the same order, so bit for bit the same.
TEST_F(DataParallel, OnVulkanTheSumDuringTheBackwardEqualsTheSumAfterIt) {
  if (test::run_shell(test::quoted(Q4TUNE_BIN) + " devices").out.find("vulkan:0") == std::string::npos)
    GTEST_SKIP() << "no Vulkan device";
  device_ = "--device vulkan --allow-shared-device";
  // 10 KB buckets: the gradients of the 2 layers' 14 adapters go in several parts.
  const test::CmdResult during = train("during", 2, 3, 1, "--grad-bucket-mb 0.01"),
                        after = train("after", 2, 3, 1, "--grad-bucket-mb 0");
  ASSERT_EQ(during.code, 0) << during.out;
  ASSERT_EQ(after.code, 0) << after.out;
  EXPECT_NE(during.out.find("buckets while the backward runs"), std::string::npos) << during.out;
  EXPECT_NE(after.out.find("in 1 bucket after the backward"), std::string::npos) << after.out;
  const double d = relative_difference("after", "during");
  std::printf("two ranks on Vulkan, the sum during the backward against after it: %.3g\n", d);
  EXPECT_EQ(d, 0);
  // With --grad-accum 2 the first micro-batch's backward runs as without data parallelism, the second sums.
  const test::CmdResult during2 = train("during2", 2, 3, 2, "--grad-bucket-mb 0.01"),
                        after2 = train("after2", 2, 3, 2, "--grad-bucket-mb 0");
  ASSERT_EQ(during2.code, 0) << during2.out;
  ASSERT_EQ(after2.code, 0) << after2.out;
  const double d2 = relative_difference("after2", "during2");
  std::printf("the same with --grad-accum 2: %.3g\n", d2);
  EXPECT_EQ(d2, 0);
}

// A run whose last checkpoint is lost continues from the middle one, on another number of ranks.
TEST_F(DataParallel, ACheckpointResumesOnAnotherNumberOfRanks) {
  // Each pair keeps the rows of a micro-batch and trades ranks for --grad-accum: 2 ranks then 1 process of 2
  // micro-batches, 1 process of 3 micro-batches then 3 ranks; each must end at the bits of its straight run.
  ASSERT_EQ(train("straight2", 0, 3, 2).code, 0);
  ASSERT_EQ(train("straight3", 0, 2, 3).code, 0);
  struct Case {
    const char* name;
    const char* straight;
    int ranks_before, accum_before, ranks_after, accum_after, batch;
  };
  for (const Case& c : {Case{"two-to-one", "straight2", 2, 1, 0, 2, 3}, Case{"one-to-three", "straight3", 0, 3, 3, 1, 2}}) {
    SCOPED_TRACE(c.name);
    const test::CmdResult first = train(c.name, c.ranks_before, c.batch, c.accum_before);
    ASSERT_EQ(first.code, 0) << first.out;
    // As if the run had stopped after step 3: its later files go.
    fs::remove_all(dir_ / c.name / "checkpoints" / ("step-" + std::to_string(kSteps)));
    for (const char* f : {"adapter.gguf", "peft"}) fs::remove_all(dir_ / c.name / f);
    const test::CmdResult resumed = train(c.name, c.ranks_after, c.batch, c.accum_after, "--resume");
    ASSERT_EQ(resumed.code, 0) << resumed.out;
    EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
    const double d = relative_difference(c.straight, c.name);
    std::printf("%s against its straight run: %.3g\n", c.name, d);
    EXPECT_LE(d, 1e-6);
    EXPECT_EQ(final_state(c.name).cursor.index, final_state(c.straight).cursor.index);
  }
  // Another global batch is refused, naming what the three numbers multiply to.
  const test::CmdResult other = train("two-to-one", 2, 2, 1, "--resume");  // 4 rows per step
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.out.find("rows-per-step was 6, now 4 (ranks x --batch-size x --grad-accum)"), std::string::npos)
      << other.out;
  // One line from q4tune (rank 0's); mpirun adds its own note on the exit code.
  size_t errors = 0;
  for (size_t at = 0; (at = other.out.find("q4tune: error:", at)) != std::string::npos; ++at) ++errors;
  EXPECT_EQ(errors, 1u) << other.out;
}

TEST_F(DataParallel, AKilledRankEndsTheJobQuicklyAndTheLastCheckpointStaysWhole) {
  const fs::path out = dir_ / "killed";
  std::string cmd = kMpirun + "-np 2 " + test::quoted(Q4TUNE_BIN) + " train --model " +
                    test::quoted(dir_ / "model.gguf") + " --data " +
                    test::quoted(std::string(Q4T_SOURCE_DIR) + "/configs/demo.jsonl") + " --out " + test::quoted(out) +
                    " --device cpu --threads 1 --steps 100000 --seq-len 48 --pack --lora-rank 4 --batch-size 2 "
                    "--save-every 5 --keep-checkpoints 2 > " + test::quoted(dir_ / "killed.log") + " 2>&1 & echo $!";
  const test::CmdResult started = test::run_shell(cmd);
  ASSERT_EQ(started.code, 0) << started.out;
  const std::string mpirun_pid = started.out.substr(0, started.out.find('\n'));
  // Wait for two checkpoints, then SIGKILL rank 1 (found by its launcher's environment).
  const auto saved = [&] {
    int n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(out / "checkpoints", ec))
      n += e.path().filename().string().rfind("step-", 0) == 0;
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (saved() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(saved(), 2) << read_file(dir_ / "killed.log");
  const test::CmdResult killed = test::run_shell(
      "for p in $(pgrep -P " + mpirun_pid + "); do tr '\\0' '\\n' < /proc/$p/environ | "
      "grep -qx OMPI_COMM_WORLD_RANK=1 && kill -9 $p && echo $p; done");
  ASSERT_EQ(killed.code, 0) << killed.out;
  ASSERT_FALSE(killed.out.empty()) << "no rank 1 under mpirun " << mpirun_pid;
  const auto t0 = std::chrono::steady_clock::now();
  while (running(mpirun_pid) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("the job ended %.1f s after rank 1 was killed\n", seconds);
  EXPECT_LT(seconds, 30.0) << read_file(dir_ / "killed.log");
  const std::string log = read_file(dir_ / "killed.log");
  EXPECT_NE(log.find("exited on signal 9"), std::string::npos) << log;
  // The newest checkpoint loads (its checksums hold), and a resume on one rank continues from it.
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(out / "checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0) steps.push_back(load_checkpoint(e.path().string()).step);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(*std::max_element(steps.begin(), steps.end()) % 5, 0);
  // One process of 4 rows continues from it (stopped by SIGINT after a few seconds, saving as Ctrl-C does).
  const int64_t newest = *std::max_element(steps.begin(), steps.end());
  const test::CmdResult resumed = test::run_shell(
      "timeout -s INT 3 " + test::quoted(Q4TUNE_BIN) + " train --model " + test::quoted(dir_ / "model.gguf") +
      " --data " + test::quoted(std::string(Q4T_SOURCE_DIR) + "/configs/demo.jsonl") + " --out " + test::quoted(out) +
      " --device cpu --threads 1 --steps 100000 --seq-len 48 --pack --lora-rank 4 --batch-size 4 --save-every 5 "
      "--keep-checkpoints 2 --resume");
  EXPECT_NE(resumed.out.find("resuming from " + (out / "checkpoints").string() + "/step-" + std::to_string(newest)),
            std::string::npos)
      << resumed.out;
}

}  // namespace
}  // namespace q4t
