// Training checkpoints for an exact resume: LoRA weights, Adam moments, the schedule, the RNG and the data
// cursor, bitwise as they were. A checkpoint is the directory OUT/checkpoints/step-N/ holding
//   state.json                      step, adam_t, lr_base (as its bit pattern), rng_state, cursor, the two
//                                   opaque JSON strings, elapsed_s
//   lora.bin, adam_m.bin, adam_v.bin  tensors: "Q4TTENS1", u64 count, then per tensor u32 name length, name,
//                                   u32 rank, i64 shape[rank], f32 values (little-endian, row-major)
//   complete                        written last: the format version and, for every file, its size and 64-bit
//                                   hash (XXH3; checkpoints of format version 1 used an older hash, still read)
// It is built in a hidden .tmp-step-N-XXXXXX directory (every file fsynced, then the directory) and renamed
// into place, so a crash or an error never leaves a step-N that is not whole; a step saved again is swapped
// with its earlier copy in one rename, and a pruned one is renamed to a hidden name before it is deleted. One
// trainer owns OUT at a time: a save removes the hidden leftovers of earlier, interrupted saves, and
// recover_checkpoints, at the start of a run, first puts back a whole copy that an interrupted save hid.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace q4t {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;  // row-major, outermost first; {} is a scalar
  std::vector<float> values;   // product(shape) values
};

struct CheckpointState {
  int64_t step = 0;
  std::vector<NamedTensor> lora;
  std::vector<NamedTensor> adam_m, adam_v;  // Adam first/second moments, usually one per lora tensor
  int64_t adam_t = 0;                       // Adam's bias-correction step count
  double lr_base = 0.0;
  std::string schedule_json;                // the schedule config, opaque here
  std::vector<uint64_t> rng_state;          // a serialised generator (mt19937_64 or similar)
  data::Cursor cursor;
  std::string config_json;                  // the run's options, compared by the caller on resume
  double elapsed_s = 0;                     // training seconds up to this step, over every resumed run; a
                                            // state.json without it (an older checkpoint) reads as 0
};

// Writes OUT/checkpoints/step-<s.step>/ atomically (replacing an existing step-N directory), then deletes the
// checkpoints older than the newest keep_last complete, verified ones (keep_last <= 0 keeps all). Throws
// std::invalid_argument for a tensor whose values do not match its shape, and std::runtime_error naming the
// path on any I/O failure; then no new step-N exists and earlier checkpoints are untouched. A failure while
// pruning old checkpoints throws too, after the new checkpoint is complete (the message says so).
void save_checkpoint(const std::string& out_dir, const CheckpointState& s, int keep_last);

struct CheckpointRepair {
  std::vector<std::string> recovered;  // step-N directories put back from a whole hidden copy
  std::vector<std::string> removed;    // leftovers of interrupted saves and deletions
};

// For the start of a run in OUT: where a step-N is missing but a hidden copy of it is complete and verified (a
// save killed between the two renames of a re-save on a file system that cannot swap two names, or after
// writing its marker), renames that copy to step-N. Then removes every other leftover of an interrupted save:
// the hidden directories, and step-N directories without a marker that hold nothing but checkpoint files (a
// deletion by an older q4tune, killed midway). Throws std::runtime_error naming the path when a copy cannot be
// put back.
CheckpointRepair recover_checkpoints(const std::string& out_dir);

// The path of the complete, verified checkpoint with the highest step under OUT/checkpoints, or nullopt.
// Hidden directories are ignored silently; a step-N whose marker is missing, or whose files fail verification or
// do not parse, is skipped with one line appended to *warnings (when given).
std::optional<std::string> newest_checkpoint(const std::string& out_dir,
                                             std::vector<std::string>* warnings = nullptr);

// Reads and verifies a checkpoint directory (as returned by newest_checkpoint). Throws std::runtime_error
// naming the file and what is wrong with it.
CheckpointState load_checkpoint(const std::string& dir);

}  // namespace q4t
