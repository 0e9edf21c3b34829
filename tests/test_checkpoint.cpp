// Checkpoints: bitwise round trips, pruning, choosing the newest verified checkpoint, and that failures and
// SIGKILLs mid-save never leave a partial step-N or damage earlier checkpoints.
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <thread>

#include "error_of.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;
using q4t::CheckpointState;
using q4t::NamedTensor;

namespace {

NamedTensor random_tensor(std::mt19937_64& rng, const std::string& name, std::vector<int64_t> shape) {
  NamedTensor t{name, std::move(shape), {}};
  size_t n = 1;
  for (int64_t d : t.shape) n *= size_t(d);
  std::normal_distribution<float> dist(0.f, 1.f);
  t.values.resize(n);
  for (float& v : t.values) v = dist(rng);
  return t;
}

// Two LoRA pairs of (rows x rank) floats, their moments, and awkward scalars; values include -0, a NaN with a
// payload, infinities and a denormal so that "bitwise" means bitwise.
CheckpointState make_state(int64_t step, uint64_t seed, int64_t rows = 16, int64_t pairs = 2) {
  std::mt19937_64 rng(seed);
  CheckpointState s;
  s.step = step;
  for (int64_t i = 0; i < pairs; ++i) {
    const std::string base = "blk." + std::to_string(i) + ".attn_q";
    s.lora.push_back(random_tensor(rng, base + ".lora_a", {4, rows}));
    s.lora.push_back(random_tensor(rng, base + ".lora_b", {rows, 4}));
  }
  s.lora.push_back(NamedTensor{"scalar", {}, {0.25f}});
  s.lora.push_back(NamedTensor{"empty", {0, 3}, {}});
  for (const NamedTensor& t : s.lora) {
    s.adam_m.push_back(random_tensor(rng, t.name, t.shape));
    s.adam_v.push_back(random_tensor(rng, t.name, t.shape));
  }
  s.lora[0].values[0] = -0.f;
  s.lora[0].values[1] = std::bit_cast<float>(0x7fc01234u);
  s.lora[0].values[2] = std::numeric_limits<float>::infinity();
  s.lora[0].values[3] = std::numeric_limits<float>::denorm_min();
  s.adam_t = step * 3 + 1;
  s.lr_base = std::nextafter(3e-4, 1.0);
  s.schedule_json = R"({"kind":"cosine","warmup":10})";
  for (int i = 0; i < 312; ++i) s.rng_state.push_back(rng());
  s.rng_state.push_back(std::numeric_limits<uint64_t>::max());
  s.cursor = {2, 17 + uint64_t(step), seed};
  s.config_json = R"({"rank":4,"alpha":8,"model":"m.gguf"})";
  s.elapsed_s = std::nextafter(1234.5 + double(step), 1e9);
  return s;
}

void expect_tensors_bitwise_equal(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
    ASSERT_EQ(a[i].values.size(), b[i].values.size()) << a[i].name;
    EXPECT_EQ(0, std::memcmp(a[i].values.data(), b[i].values.data(), a[i].values.size() * sizeof(float)))
        << a[i].name;
  }
}

void expect_states_bitwise_equal(const CheckpointState& a, const CheckpointState& b) {
  EXPECT_EQ(a.step, b.step);
  expect_tensors_bitwise_equal(a.lora, b.lora);
  expect_tensors_bitwise_equal(a.adam_m, b.adam_m);
  expect_tensors_bitwise_equal(a.adam_v, b.adam_v);
  EXPECT_EQ(a.adam_t, b.adam_t);
  EXPECT_EQ(0, std::memcmp(&a.lr_base, &b.lr_base, sizeof(double)));
  EXPECT_EQ(a.schedule_json, b.schedule_json);
  EXPECT_EQ(a.rng_state, b.rng_state);
  EXPECT_EQ(a.cursor.epoch, b.cursor.epoch);
  EXPECT_EQ(a.cursor.index, b.cursor.index);
  EXPECT_EQ(a.cursor.seed, b.cursor.seed);
  EXPECT_EQ(a.config_json, b.config_json);
  EXPECT_EQ(0, std::memcmp(&a.elapsed_s, &b.elapsed_s, sizeof(double)));
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Replaces the first `from` in the file at path by `to`; false when the file does not hold it.
bool replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = read_text(path);
  const size_t at = text.find(from);
  if (at == std::string::npos) return false;
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return true;
}

// The message of the std::runtime_error f throws.
std::string runtime_error_of(const std::function<void()>& f) { return q4t::test::error_of<std::runtime_error>(f); }

bool has_leftover(const std::string& ckpt_root) {
  for (const std::string& name : entries(ckpt_root)) {
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".old-", 0) == 0) return true;
  }
  return false;
}

class CheckpointTest : public ::testing::Test {
 protected:
  std::string step_dir(int64_t n) const { return root_ + "/step-" + std::to_string(n); }

  const q4t::test::TempDir tmp_{"q4t_ckpt_"};
  const std::string out_ = tmp_.path(), root_ = out_ + "/checkpoints";
};

TEST_F(CheckpointTest, SavedCheckpointLoadsBackBitwiseExact) {
  const CheckpointState s = make_state(7, 42);
  q4t::save_checkpoint(out_, s, 3);
  EXPECT_EQ(entries(root_), std::vector<std::string>{"step-7"});
  expect_states_bitwise_equal(s, q4t::load_checkpoint(step_dir(7)));
}

TEST_F(CheckpointTest, ElapsedTrainingTimeSurvivesTheRoundTrip) {
  CheckpointState s = make_state(3, 9);
  s.elapsed_s = 98765.4321;
  q4t::save_checkpoint(out_, s, 0);
  EXPECT_EQ(q4t::load_checkpoint(step_dir(3)).elapsed_s, 98765.4321);
  const std::string text = read_text(step_dir(3) + "/state.json");
  EXPECT_NE(text.find("\"elapsed_s\": 98765.4321"), std::string::npos) << text;

  // JSON has no NaN: a non-finite time is saved as 0 rather than as a null that would not load.
  s.step = 4;
  s.elapsed_s = std::nan("");
  q4t::save_checkpoint(out_, s, 0);
  EXPECT_EQ(q4t::load_checkpoint(step_dir(4)).elapsed_s, 0.0);
}

TEST_F(CheckpointTest, SavingTheSameStepAgainReplacesIt) {
  q4t::save_checkpoint(out_, make_state(5, 1), 3);
  const CheckpointState second = make_state(5, 2);
  q4t::save_checkpoint(out_, second, 3);
  EXPECT_EQ(entries(root_), std::vector<std::string>{"step-5"});
  expect_states_bitwise_equal(second, q4t::load_checkpoint(step_dir(5)));
}

TEST_F(CheckpointTest, KeepLastPrunesAllButTheNewestCompleteCheckpoints) {
  for (int64_t step : {10, 20, 30, 40, 50}) q4t::save_checkpoint(out_, make_state(step, uint64_t(step)), 2);
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"step-40", "step-50"}));

  // keep_last <= 0 keeps everything.
  for (int64_t step : {60, 70}) q4t::save_checkpoint(out_, make_state(step, uint64_t(step)), 0);
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"step-40", "step-50", "step-60", "step-70"}));
}

TEST_F(CheckpointTest, NewestCheckpointPicksTheHighestStepNumerically) {
  EXPECT_EQ(q4t::newest_checkpoint(out_), std::nullopt);
  for (int64_t step : {9, 100, 20}) q4t::save_checkpoint(out_, make_state(step, 3), 0);
  std::vector<std::string> warnings;
  EXPECT_EQ(q4t::newest_checkpoint(out_, &warnings), step_dir(100));
  EXPECT_TRUE(warnings.empty());
}

TEST_F(CheckpointTest, NewestCheckpointSkipsDamagedCheckpointsWithWarningsAndIgnoresTempDirs) {
  for (int64_t step : {1, 2, 3, 4}) q4t::save_checkpoint(out_, make_state(step, uint64_t(step)), 0);
  // step-4: a truncated file; step-3: one flipped byte; step-2: no marker.
  fs::resize_file(step_dir(4) + "/adam_v.bin", fs::file_size(step_dir(4) + "/adam_v.bin") - 5);
  {
    std::fstream f(step_dir(3) + "/lora.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  fs::remove(step_dir(2) + "/complete");
  // A leftover temp dir of a higher step, and names that are not checkpoints.
  fs::create_directories(root_ + "/.tmp-step-9-abcdef");
  std::ofstream(root_ + "/.tmp-step-9-abcdef/lora.bin") << "partial";
  fs::create_directories(root_ + "/step-08");
  std::ofstream(root_ + "/step-12") << "not a directory";

  std::vector<std::string> warnings;
  EXPECT_EQ(q4t::newest_checkpoint(out_, &warnings), step_dir(1));
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_NE(warnings[0].find(step_dir(4) + "/adam_v.bin"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("truncated"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find(step_dir(3) + "/lora.bin"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[1].find("checksum"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[2].find(step_dir(2) + "/complete"), std::string::npos) << warnings[2];
  expect_states_bitwise_equal(make_state(1, 1), q4t::load_checkpoint(step_dir(1)));
}

TEST_F(CheckpointTest, LoadingADamagedCheckpointNamesTheFile) {
  q4t::save_checkpoint(out_, make_state(1, 1), 0);
  const std::string file = step_dir(1) + "/adam_m.bin";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x01');
  }
  const std::string error = runtime_error_of([&] { q4t::load_checkpoint(step_dir(1)); });
  EXPECT_NE(error.find(file), std::string::npos) << error;
  EXPECT_THROW(q4t::load_checkpoint(out_ + "/nowhere"), std::runtime_error);
}

TEST_F(CheckpointTest, SaveFailsNamingThePathWhenTheCheckpointsDirIsAFile) {
  std::ofstream(root_) << "in the way";
  const std::string error = runtime_error_of([&] { q4t::save_checkpoint(out_, make_state(1, 1), 2); });
  EXPECT_NE(error.find(root_), std::string::npos) << error;
  EXPECT_TRUE(fs::is_regular_file(root_));
}

TEST_F(CheckpointTest, AFailureAfterWritingLeavesNoStepAndKeepsEarlierCheckpoints) {
  q4t::save_checkpoint(out_, make_state(1, 1), 2);
  q4t::save_checkpoint(out_, make_state(2, 2), 2);
  // A file where step-3 would be renamed to: every file is written, then installing fails.
  std::ofstream(step_dir(3)) << "in the way";
  const std::string error = runtime_error_of([&] { q4t::save_checkpoint(out_, make_state(3, 3), 2); });
  EXPECT_NE(error.find(step_dir(3)), std::string::npos) << error;
  EXPECT_TRUE(fs::is_regular_file(step_dir(3)));
  EXPECT_FALSE(has_leftover(root_));
  EXPECT_EQ(q4t::newest_checkpoint(out_), step_dir(2));
  expect_states_bitwise_equal(make_state(1, 1), q4t::load_checkpoint(step_dir(1)));
  expect_states_bitwise_equal(make_state(2, 2), q4t::load_checkpoint(step_dir(2)));
}

TEST_F(CheckpointTest, ATensorWhoseValuesDoNotMatchItsShapeIsRejectedBeforeWriting) {
  CheckpointState s = make_state(1, 1);
  s.adam_v[1].values.pop_back();
  EXPECT_THROW(q4t::save_checkpoint(out_, s, 2), std::invalid_argument);
  EXPECT_FALSE(fs::exists(root_));
}

// The state of tests/fixtures/checkpoint-v1/step-3: a checkpoint of format version 1, written by q4tune before
// checkpoint files were hashed with XXH3 (the adapter and moments are small hand-picked values).
CheckpointState version1_state() {
  CheckpointState s;
  s.step = 3;
  s.lora = {NamedTensor{"blk.0.attn_q.lora_a", {2, 3}, {0.5f, -1.25f, 3.0f, 0.0f, -0.0f, 1e-3f}},
            NamedTensor{"blk.0.attn_q.lora_b", {3, 2}, {-2.0f, 0.125f, 7.5f, -0.75f, 1e-5f, 4.0f}},
            NamedTensor{"scalar", {}, {0.25f}}};
  for (const NamedTensor& t : s.lora) {
    NamedTensor m = t, v = t;
    for (float& x : m.values) x *= 0.5f;
    for (float& x : v.values) x = x * x;
    s.adam_m.push_back(m);
    s.adam_v.push_back(v);
  }
  s.adam_t = 7;
  s.lr_base = 3e-4;
  s.schedule_json = R"({"kind":"cosine","warmup":2})";
  s.rng_state = {1, 2, 3, std::numeric_limits<uint64_t>::max()};
  s.cursor = {1, 5, 42};
  s.config_json = R"({"rank":2,"alpha":4})";
  s.elapsed_s = 12.5;
  return s;
}

TEST_F(CheckpointTest, ACheckpointOfFormatVersion1StillResumesAndIsStillVerified) {
  fs::create_directories(root_);
  fs::copy(std::string(Q4T_SOURCE_DIR) + "/tests/fixtures/checkpoint-v1/step-3", step_dir(3));
  ASSERT_NE(read_text(step_dir(3) + "/complete").find("\"version\": 1"), std::string::npos);
  std::vector<std::string> warnings;
  EXPECT_EQ(q4t::newest_checkpoint(out_, &warnings), step_dir(3));
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  CheckpointState s = q4t::load_checkpoint(step_dir(3));
  expect_states_bitwise_equal(version1_state(), s);

  // The run goes on: its next checkpoint is of the current format, and the old one is still read beside it.
  s.step = 4;
  q4t::save_checkpoint(out_, s, 0);
  EXPECT_NE(read_text(step_dir(4) + "/complete").find("\"version\": 2"), std::string::npos);
  expect_states_bitwise_equal(s, q4t::load_checkpoint(step_dir(4)));
  expect_states_bitwise_equal(version1_state(), q4t::load_checkpoint(step_dir(3)));

  // Its files are checked against the hash of version 1: one changed byte is found.
  {
    std::fstream f(step_dir(3) + "/adam_v.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(150);
    f.put('\x7f');
  }
  EXPECT_EQ(runtime_error_of([&] { q4t::load_checkpoint(step_dir(3)); }),
            step_dir(3) + "/adam_v.bin: checksum mismatch (the file is corrupted)");
}

TEST_F(CheckpointTest, ACheckpointOfANewerFormatIsRefusedNamingItsVersion) {
  q4t::save_checkpoint(out_, make_state(1, 1), 0);
  const std::string marker = step_dir(1) + "/complete";
  ASSERT_TRUE(replace_in_file(marker, "\"version\": 2", "\"version\": 3")) << read_text(marker);
  EXPECT_EQ(runtime_error_of([&] { q4t::load_checkpoint(step_dir(1)); }),
            marker + ": checkpoint format version 3, but this q4tune reads versions 1 to 2 (a newer q4tune wrote it)");
}

// Waits until `ready` holds or the child exits; returns false when the child finished first.
template <typename Pred>
bool wait_for(pid_t child, Pred ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    int status;
    if (waitpid(child, &status, WNOHANG) == child) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return false;
}

std::optional<std::string> temp_dir_of(const std::string& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.path().filename().string().rfind(".tmp-step-", 0) == 0) return e.path().string();
  }
  return std::nullopt;
}

TEST_F(CheckpointTest, ASaveKilledAtAnyMomentLeavesTheLastCompleteCheckpointLoadable) {
  // Large enough (about 100 MB) that the kills land while the files are being written.
  const CheckpointState big = make_state(2, 2, /*rows=*/256 * 1024, /*pairs=*/4);
  const CheckpointState small = make_state(1, 1);
  const std::vector<std::string> moments = {"", "state.json", "lora.bin", "adam_m.bin", "adam_v.bin", "complete"};
  int landed_mid_save = 0;
  for (const std::string& moment : moments) {
    SCOPED_TRACE("kill once the temp dir has '" + moment + "'");
    const std::string out = out_ + "/run-" + (moment.empty() ? "dir" : moment);
    const std::string root = out + "/checkpoints";
    q4t::save_checkpoint(out, small, 1);

    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        q4t::save_checkpoint(out, big, 1);
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
    const bool caught = wait_for(child, [&] {
      const std::optional<std::string> tmp = temp_dir_of(root);
      return tmp && (moment.empty() || fs::exists(*tmp + "/" + moment));
    });
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    if (caught && temp_dir_of(root)) ++landed_mid_save;

    std::vector<std::string> warnings;
    const std::optional<std::string> newest = q4t::newest_checkpoint(out, &warnings);
    EXPECT_TRUE(warnings.empty()) << warnings.front();
    ASSERT_TRUE(newest.has_value());
    if (*newest == root + "/step-2") {
      expect_states_bitwise_equal(big, q4t::load_checkpoint(*newest));  // the save had finished: also fine
    } else {
      EXPECT_EQ(*newest, root + "/step-1");
      EXPECT_FALSE(fs::exists(root + "/step-2"));
      expect_states_bitwise_equal(small, q4t::load_checkpoint(*newest));
    }
    // The next save clears what the killed one left behind.
    q4t::save_checkpoint(out, make_state(3, 3), 1);
    EXPECT_EQ(entries(root), std::vector<std::string>{"step-3"});
    fs::remove_all(out);
  }
  EXPECT_GE(landed_mid_save, 1);
  std::printf("kills that landed mid-save: %d of %zu\n", landed_mid_save, moments.size());
}

// A marker that is valid JSON of the wrong shape is one more damaged checkpoint: named, and skipped.
TEST_F(CheckpointTest, AMarkerWithAFormatOfTheWrongTypeIsSkippedNamingTheFile) {
  q4t::save_checkpoint(out_, make_state(1, 1), 0);
  q4t::save_checkpoint(out_, make_state(2, 2), 0);
  const std::string marker = step_dir(2) + "/complete";
  ASSERT_TRUE(replace_in_file(marker, "\"format\": \"q4tune-checkpoint\"", "\"format\": 5")) << read_text(marker);
  std::vector<std::string> warnings;
  EXPECT_EQ(q4t::newest_checkpoint(out_, &warnings), step_dir(1));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "skipping checkpoint " + step_dir(2) + ": " + marker +
                             ": not a q4tune checkpoint marker (its \"format\" must be \"q4tune-checkpoint\")");
}

// Damage one byte of every payload file of the checkpoint in dir.
void damage(const std::string& dir) {
  for (const char* name : {"lora.bin", "adam_m.bin"}) {
    std::fstream f(dir + "/" + name, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x33');
  }
}

// Pruning keeps the newest K complete checkpoints: damaged ones do not count, so a run whose checkpoints are all
// damaged keeps what it saves after.
TEST_F(CheckpointTest, PruningCountsOnlyCompleteVerifiedCheckpoints) {
  for (int64_t step : {2, 3}) q4t::save_checkpoint(out_, make_state(step, uint64_t(step)), 0);
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"step-2", "step-3"}));
  damage(step_dir(2));
  damage(step_dir(3));
  EXPECT_EQ(q4t::newest_checkpoint(out_), std::nullopt);

  // The run starts again from step 0; its first checkpoint stays, beside the damaged ones newer than it.
  q4t::save_checkpoint(out_, make_state(1, 11), 1);
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"step-1", "step-2", "step-3"}));
  EXPECT_EQ(q4t::newest_checkpoint(out_), step_dir(1));
  // A damaged checkpoint older than the newest complete one goes with the other old ones.
  q4t::save_checkpoint(out_, make_state(2, 12), 1);
  EXPECT_EQ(entries(root_), (std::vector<std::string>{"step-2", "step-3"}));
  q4t::save_checkpoint(out_, make_state(4, 14), 1);
  EXPECT_EQ(entries(root_), std::vector<std::string>{"step-4"});
  expect_states_bitwise_equal(make_state(4, 14), q4t::load_checkpoint(step_dir(4)));
}

// What kills left in checkpoints/: the only whole copy of step 5, hidden by a re-save killed between its two
// renames (on a file system that cannot swap two names), is put back; the other leftovers of interrupted saves
// and deletions are removed; anything else stays.
TEST_F(CheckpointTest, RecoveryPutsBackAHiddenWholeCopyAndRemovesTheLeftovers) {
  for (int64_t step : {2, 3, 4, 5}) q4t::save_checkpoint(out_, make_state(step, uint64_t(step)), 0);
  fs::rename(step_dir(5), root_ + "/.old-step-5-Ab12Cd");
  fs::create_directories(root_ + "/.tmp-step-5-Ef34Gh");  // the new copy, killed before its marker
  std::ofstream(root_ + "/.tmp-step-5-Ef34Gh/lora.bin") << "partial";
  fs::rename(step_dir(4), root_ + "/.pruned-step-4-Ij56Kl");
  for (const char* name : {"state.json", "adam_m.bin", "adam_v.bin", "complete"}) fs::remove(step_dir(3) + "/" + name);
  fs::create_directories(root_ + "/step-7");
  std::ofstream(root_ + "/step-7/notes.txt") << "a file of the user's";
  std::ofstream(root_ + "/.tmp-notes") << "a file of the user's";

  const q4t::CheckpointRepair repair = q4t::recover_checkpoints(out_);
  EXPECT_EQ(repair.recovered, std::vector<std::string>{step_dir(5)});
  std::vector<std::string> removed = repair.removed;
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{root_ + "/.pruned-step-4-Ij56Kl", root_ + "/.tmp-step-5-Ef34Gh",
                                               step_dir(3)}));
  EXPECT_EQ(entries(root_), (std::vector<std::string>{".tmp-notes", "step-2", "step-5", "step-7"}));
  EXPECT_EQ(q4t::newest_checkpoint(out_), step_dir(5));
  expect_states_bitwise_equal(make_state(5, 5), q4t::load_checkpoint(step_dir(5)));

  // Nothing is left to do the next time.
  const q4t::CheckpointRepair again = q4t::recover_checkpoints(out_);
  EXPECT_TRUE(again.recovered.empty());
  EXPECT_TRUE(again.removed.empty());
}

// A hidden copy of a step whose directory is whole (the earlier copy of a re-save, killed before it was removed)
// is only removed.
TEST_F(CheckpointTest, RecoveryLeavesACompleteStepAloneAndDropsItsHiddenCopies) {
  q4t::save_checkpoint(out_, make_state(5, 1), 1);
  fs::copy(step_dir(5), root_ + "/.tmp-step-5-Mn78Op");  // the earlier copy after a swap, killed before removal
  const q4t::CheckpointRepair repair = q4t::recover_checkpoints(out_);
  EXPECT_TRUE(repair.recovered.empty());
  EXPECT_EQ(repair.removed, std::vector<std::string>{root_ + "/.tmp-step-5-Mn78Op"});
  EXPECT_EQ(entries(root_), std::vector<std::string>{"step-5"});
}

}  // namespace
