// SIGKILL at every rename, fsync and unlink of q4tune train: of its checkpoint saves and prunes, of a same-step
// re-save (a resume of a finished run, also where the file system cannot swap two names) and of its exports,
// with --keep-checkpoints 1 and 3. strace's fault injection kills one run per call of one syscall; each killed
// run is then resumed, and must continue from the newest complete checkpoint the kill left, end with the bytes
// of a straight run, and leave nothing of the kill behind.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>

#include "shell.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace q4t {
namespace {

constexpr int64_t kSteps = 4;

// Each is swept on its own: strace counts the calls of each syscall apart.
const char* const kSyscalls[] = {"rename",    "renameat", "renameat2", "fsync",
                                 "fdatasync", "unlink",   "unlinkat",  "rmdir"};

// What is killed: a run from its start, or a resume of the finished run (which saves its last step again and
// exports again); strace_args add to strace's.
struct Scenario {
  const char* name;
  bool resave;
  std::string strace_args;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every path under root, relative to it.
std::set<std::string> tree(const fs::path& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) out.insert(fs::relative(e.path(), root).string());
  return out;
}

// The newest step held by a complete, verified checkpoint under out, hidden copies of interrupted saves included;
// 0 when there is none.
int64_t newest_complete_step(const fs::path& out) {
  int64_t newest = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out / "checkpoints", ec)) {
    try {
      newest = std::max(newest, load_checkpoint(e.path().string()).step);
    } catch (const std::runtime_error&) {
    }
  }
  return newest;
}

// A fresh directory for the runs: in /dev/shm where there is one, since a few hundred runs that fsync each of
// their writes take a minute on a disk and seconds in memory; the calls, and so the kill points, are the same.
std::string runs_dir() {
  std::error_code ec;
  std::string templ = (fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path()).string();
  templ += "/q4t_kill_sweep_XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("cannot create " + templ);
  return templ;
}

// A tiny model and a straight run of it in dir/straight, with the tokenized data cached beforehand (so that the
// kills land on the run's own files only).
class KillSweep : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const test::CmdResult made = test::run_shell(env_ + test::quoted(Q4TUNE_BIN) + " init-model -o " +
                                                 test::quoted(dir_ / "model.gguf") + " --dim 64 --layers 1");
    ASSERT_EQ(made.code, 0) << made.out;
    const test::CmdResult straight = test::run_shell(train(straight_, false));
    ASSERT_EQ(straight.code, 0) << straight.out;
  }

  // The command line of the run in out; under strace killing it at the n-th call of syscall when one is given.
  std::string train(const fs::path& out, bool resume, const std::string& syscall = "", int n = 0,
                    const std::string& strace_args = "") const {
    std::string cmd = env_;
    if (!syscall.empty())
      cmd += "strace -f -qq -o /dev/null " + strace_args + " -e inject=" + syscall +
             ":signal=SIGKILL:when=" + std::to_string(n) + " ";
    cmd += test::quoted(Q4TUNE_BIN) + " train --model " + test::quoted(dir_ / "model.gguf") + " --data " +
           test::quoted(std::string(Q4T_SOURCE_DIR) + "/configs/demo.jsonl") + " --out " + test::quoted(out) +
           " --device cpu --threads 1 --steps " + std::to_string(kSteps) +
           " --seq-len 32 --pack --batch-size 1 --lora-rank 2 --seed 3 --save-every 1 --keep-checkpoints " +
           std::to_string(GetParam());
    return cmd + (resume ? " --resume" : "");
  }

  // Kills the scenario's run at the n-th call of syscall for n = 1, 2, ... until a run is not killed (it made
  // fewer calls); a re-save starts from a copy of the finished straight run. After each kill, resumes the run
  // and checks it. Returns the number of kills.
  int sweep(const Scenario& scenario, const std::string& syscall) {
    const fs::path out = dir_ / "killed";
    for (int n = 1;; ++n) {
      SCOPED_TRACE(std::string(scenario.name) + " killed at " + syscall + " call " + std::to_string(n));
      fs::remove_all(out);
      if (scenario.resave) fs::copy(straight_, out, fs::copy_options::recursive);
      const test::CmdResult killed =
          test::run_shell(train(out, scenario.resave, syscall, n, scenario.strace_args));
      if (killed.code == 0) return n - 1;
      if (killed.code != 128 + SIGKILL && killed.code != -1) {
        ADD_FAILURE() << "the run failed instead of being killed: " << killed.out;
        return n;
      }
      const int64_t newest = newest_complete_step(out);
      const test::CmdResult resumed = test::run_shell(train(out, true));
      EXPECT_EQ(resumed.code, 0) << resumed.out;
      const std::string from =
          newest > 0 ? "resuming from " + (out / "checkpoints").string() + "/step-" + std::to_string(newest) +
                           " (step " + std::to_string(newest) + " of " + std::to_string(kSteps) + ")\n"
                     : "no complete checkpoint under " + out.string() + "/checkpoints: starting from step 0\n";
      EXPECT_NE(resumed.out.find(from), std::string::npos) << "expected: " << from << resumed.out;
      for (const char* f : {"adapter.gguf", "peft/adapter_model.safetensors", "peft/adapter_config.json",
                            "checkpoints/step-4/lora.bin", "checkpoints/step-4/adam_v.bin"}) {
        EXPECT_TRUE(read_file(straight_ / f) == read_file(out / f)) << f << " differs from the straight run's";
      }
      EXPECT_EQ(tree(out), tree(straight_)) << "the resumed run holds other files than the straight run";
      if (HasFailure()) return n;
    }
  }

  // Sweeps every syscall of kSyscalls over the scenario; prints the kills per syscall.
  void sweep_all(const Scenario& scenario) {
    int total = 0;
    std::string counts;
    for (const char* syscall : kSyscalls) {
      const int kills = sweep(scenario, syscall);
      total += kills;
      counts += std::string(counts.empty() ? "" : ", ") + syscall + " " + std::to_string(kills);
      if (HasFailure()) return;
    }
    std::cout << scenario.name << " with --keep-checkpoints " << GetParam() << ": " << total << " kill points ("
              << counts << ")\n";
    EXPECT_GT(total, 0);
  }

  void TearDown() override { fs::remove_all(dir_); }

  const fs::path dir_ = runs_dir(), straight_ = dir_ / "straight";
  const std::string env_ = "XDG_CACHE_HOME=" + test::quoted(dir_ / "cache") + " ";
};

TEST_P(KillSweep, ARunKilledAtAnyWriteResumesFromTheNewestCompleteCheckpoint) { sweep_all({"run", false, ""}); }

TEST_P(KillSweep, ASameStepResaveKilledAtAnyWriteResumesFromTheNewestCompleteCheckpoint) {
  sweep_all({"re-save", true, ""});
}

// Where renameat2 cannot swap (EINVAL, as on file systems without RENAME_EXCHANGE), a re-save moves the earlier
// copy aside first; a kill between its two renames hides both copies, and the next start puts one back.
TEST_P(KillSweep, ASameStepResaveThatCannotSwapKilledAtAnyWriteResumesFromTheNewestCompleteCheckpoint) {
  sweep_all({"re-save without RENAME_EXCHANGE", true, "-e inject=renameat2:error=EINVAL"});
}

INSTANTIATE_TEST_SUITE_P(Keep, KillSweep, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param); });

}  // namespace
}  // namespace q4t
