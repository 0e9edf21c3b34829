// A command that would need more memory than it can get is refused before its big allocations, in one line with
// the estimate, what is available and the flags that lower it: train and eval at a huge --seq-len or
// --batch-size (the memory plan's arena), logits of a model whose weights do not fit under ulimit -v.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "train/commands.h"
#include "train/memory_estimate.h"

namespace fs = std::filesystem;

namespace q4t {
namespace {

const std::string kDemoData = std::string(Q4T_SOURCE_DIR) + "/configs/demo.jsonl";
// "12.3 MiB", "1.23 GiB" or "1.23 TiB", as the error line writes its numbers.
const std::string kBytes = R"([0-9]+\.[0-9]+ [MGT]iB)";
// What the host leaves, whichever of its limits is the tightest.
const std::string kHostRoom = "(this machine has " + kBytes + " available|the cgroup's memory limit leaves " + kBytes +
                              "|the address-space limit \\(ulimit -v\\) leaves " + kBytes +
                              "|the data-segment limit \\(ulimit -d\\) leaves " + kBytes + ")";

struct ChildRun {
  int code = -1;  // the exit code, or -1 when the child did not exit normally
  std::string out, err;
  int64_t max_rss_kb = 0;
  double seconds = 0;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// q4tune args in a child process, its stdout and stderr in files under dir; address_space, when given, is its
// RLIMIT_AS (ulimit -v).
ChildRun run_q4tune(const std::vector<std::string>& args, const fs::path& dir, rlim_t address_space = RLIM_INFINITY) {
  const fs::path out = dir / "stdout", err = dir / "stderr";
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    dup2(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    const struct rlimit rl {address_space, address_space};
    if (address_space != RLIM_INFINITY && setrlimit(RLIMIT_AS, &rl) != 0) _exit(126);
    std::vector<char*> argv{const_cast<char*>(Q4TUNE_BIN)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(Q4TUNE_BIN, argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  ChildRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  r.max_rss_kb = ru.ru_maxrss;
  return r;
}

std::string last_line(const std::string& s) {
  std::istringstream in(s);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return last;
}

// A random llama (init-model) of `type` weights with 4 heads (2 kv heads).
std::string make_model(const fs::path& dir, const std::string& name, int64_t dim, int64_t layers, int64_t ff,
                       const std::string& type = "q4_0") {
  InitModelOptions o;
  o.out = (dir / name).string();
  o.dim = dim;
  o.layers = layers;
  o.ff = ff;
  o.type = type;
  std::ostringstream quiet;
  EXPECT_EQ(run_init_model(o, quiet), 0);
  return o.out;
}

class MemoryRefusal : public ::testing::Test {
 protected:
  void SetUp() override { model_ = make_model(dir_.path(), "tiny.gguf", 64, 2, 128); }
  // The command (q4tune args on the tiny model and the demo data) exits 1 within seconds, its peak RSS far below
  // what it asked for, with "<what> needs about ...; <room>: <lower>" as stderr's last line.
  void expect_refused(std::vector<std::string> args, const std::string& what, const std::string& lower) {
    args.insert(args.end(), {"--device", "cpu", "--threads", "1", "-m", model_, "--data", kDemoData});
    const ChildRun r = run_q4tune(args, dir_.path());
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_LT(r.seconds, 30.0);
    EXPECT_LT(r.max_rss_kb, 128 * 1024) << "peak RSS " << r.max_rss_kb << " kB";
    EXPECT_FALSE(fs::exists(dir_.path() + "/run/checkpoints"));
    const std::string line = last_line(r.err);
    const std::string expected = "q4tune: error: " + what + " needs about " + kBytes + " \\(activations " + kBytes +
                                 " \\+ weights " + kBytes + "\\); " + kHostRoom + ": " + lower;
    EXPECT_TRUE(std::regex_match(line, std::regex(expected))) << line;
  }
  test::TempDir dir_{"q4t_memory_"};
  std::string model_;
};

TEST_F(MemoryRefusal, TrainAtASeqLenOfAMillionSaysHowMuchAndWhichFlagsLowerIt) {
  expect_refused({"train", "--seq-len", "1000000", "--batch-size", "1", "--steps", "1", "-o", dir_.path() + "/run"},
                 "--batch-size 1 x --seq-len 1000000", "lower --seq-len or --batch-size, or use --grad-checkpoint");
}

TEST_F(MemoryRefusal, TrainAtABatchSizeOf100000WithGradCheckpointNamesTheOtherFlags) {
  expect_refused({"train", "--seq-len", "96", "--batch-size", "100000", "--grad-checkpoint", "--steps", "1", "-o",
                  dir_.path() + "/run"},
                 "--batch-size 100000 x --seq-len 96", "lower --seq-len or --batch-size");
}

TEST_F(MemoryRefusal, EvalAtASeqLenOfAMillionIsRefusedToo) {
  expect_refused({"eval", "--seq-len", "1000000", "--pack"}, "--batch-size 1 x --seq-len 1000000",
                 "lower --seq-len or --batch-size");
}

// On lavapipe the demo model at a million tokens passes the memory check (its heap is the machine's memory) and
// meets a tensor larger than the device can make a buffer for: one error with the flags, nothing written.
TEST(MemoryRefusalOnVulkan, ATensorTheDeviceCannotMakeNamesTheFlags) {
  test::TempDir dir("q4t_memory_");
  const ChildRun devices = run_q4tune({"devices"}, dir.path());
  if (devices.out.find("llvmpipe") == std::string::npos) GTEST_SKIP() << "no lavapipe device";
  const ChildRun r = run_q4tune({"train", "--device", "vulkan", "--seq-len", "1000000", "--steps", "1", "-o",
                                 dir.path() + "/run"},
                                dir.path());
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_FALSE(fs::exists(dir.path() + "/run/checkpoints"));
  const std::string line = last_line(r.err);
  EXPECT_TRUE(std::regex_match(line, std::regex("q4tune: error: --batch-size 4 x --seq-len 1000000: .* cannot make a "
                                                "buffer of [0-9]+ bytes \\(vkCreateBuffer: out of device memory\\); "
                                                "lower --seq-len or --batch-size")))
      << line;
}

// Under ulimit -v the mapped model file takes address space as well as its copy: a 1-layer model runs in 256 MiB,
// one of 190 MB of f32 weights (mapped 190 MB + copied 190 MB) is refused before it is copied.
TEST(MemoryLimit, LogitsRunsASmallModelUnderUlimitVAndRefusesOneWhoseWeightsDoNotFit) {
  test::TempDir dir("q4t_memory_");
  const std::string small = make_model(dir.path(), "small.gguf", 64, 1, 128);
  const std::string large = make_model(dir.path(), "large.gguf", 1024, 4, 2816, "f32");
  const rlim_t limit = rlim_t(256) << 20;
  auto logits = [&](const std::string& model) {
    const std::vector<std::string> args{"logits", "--device", "cpu", "--threads", "1", "-m", model, "--ids", "1,2,3"};
    return run_q4tune(args, dir.path(), limit);
  };
  const ChildRun fits = logits(small);
  EXPECT_EQ(fits.code, 0) << fits.err;
  EXPECT_EQ(fits.out.rfind("{\"logits\":[[", 0), 0u) << fits.out.substr(0, 200);

  const ChildRun refused = logits(large);
  EXPECT_EQ(refused.code, 1) << refused.err;
  const std::string line = last_line(refused.err);
  EXPECT_TRUE(std::regex_match(line, std::regex("q4tune: error: logits of 3 tokens needs about " + kBytes +
                                                " \\(activations " + kBytes + " \\+ weights 18[0-9]\\.[0-9] MiB\\); "
                                                "the address-space limit \\(ulimit -v\\) leaves " + kBytes +
                                                ": use a smaller or more quantized model \\(the weights alone do not "
                                                "fit\\)")))
      << line;
  EXPECT_LT(refused.max_rss_kb, 64 * 1024) << "the weights were copied: peak RSS " << refused.max_rss_kb << " kB";
}

// host_memory_room under RLIMIT_AS (in a child, whose limit goes with it): the limit less what is mapped now.
TEST(MemoryRoom, TheAddressSpaceLimitLeavesItselfLessWhatIsMapped) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int64_t mapped = [] {
      std::ifstream in("/proc/self/status");
      for (std::string k; in >> k;)
        if (k == "VmSize:") {
          int64_t kb = 0;
          in >> kb;
          return kb * 1024;
        }
      return int64_t(-1);
    }();
    const int64_t room = int64_t(64) << 20;
    const struct rlimit rl {rlim_t(mapped + room), rlim_t(mapped + room)};
    if (mapped < 0 || setrlimit(RLIMIT_AS, &rl) != 0) _exit(2);
    const train::MemoryRoom r = train::host_memory_room();
    const bool ok = r.limit == train::MemoryRoom::Limit::AddressSpace && r.bytes <= room &&
                    r.bytes > room - (8 << 20) && r.text().rfind("the address-space limit (ulimit -v) leaves ", 0) == 0;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace q4t
