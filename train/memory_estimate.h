// Refusing early a command that would need more memory than it can get: what this process may still allocate,
// estimates of what a command asks for, made before its big allocations, and the one-line error that gives the
// number and the flags that lower it (instead of std::bad_alloc halfway through).
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "autograd/backend.h"
#include "data/gguf.h"
#include "train/model/config.h"
#include "train/model/model.h"

namespace q4t::train {

// Bytes this process may still allocate, and the limit that says so.
struct MemoryRoom {
  enum class Limit { None, Machine, Cgroup, AddressSpace, DataSegment, Device };
  int64_t bytes = std::numeric_limits<int64_t>::max();
  Limit limit = Limit::None;
  std::string device;  // Limit::Device: its name
  // "this machine has 31.2 GiB available", "ulimit -v leaves 1.2 GiB", ...
  std::string text() const;
};
// The host: the tightest of MemAvailable (/proc/meminfo), the cgroup's memory limit less its usage (v2
// memory.max, v1 memory.limit_in_bytes; page cache counts as free), RLIMIT_AS less the address space mapped now
// and RLIMIT_DATA less the data mapped now.
MemoryRoom host_memory_room();
// Where be's tensors live: the host for the CPU and a CPU-type Vulkan device (lavapipe); for a GPU the largest
// device-local heap less what this device holds, and for an integrated one the host's room too.
MemoryRoom memory_room(ag::Backend& be);

// What a command asks for. Its `what` and `lower` name the flags: "--batch-size 4 x --seq-len 1000000",
// "lower --seq-len or --batch-size".
struct MemoryNeed {
  std::string what;
  int64_t activations = 0;  // everything but the weights: activations, caches, outputs
  int64_t weights = 0;
  bool weights_loaded = false;  // the weights are allocated already, so the room measured now lacks them
  std::string lower;
};
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws OutOfMemory, one line with the estimate, the room and what to do, when need does not fit in room.
void require_memory(const MemoryNeed& need, const MemoryRoom& room);

// Bytes of f's tensors as a backend holds them (quantized blocks as stored, f32 as f32).
int64_t weight_bytes(const gguf::File& f);
// Model::load(f, be), refused first when the weights plus need.activations do not fit in memory_room(be); need
// names the flags of the activations (its weights are filled in, its what defaults to the file).
std::unique_ptr<model::Model> load_model_that_fits(const gguf::File& f, ag::Backend& be, MemoryNeed need = {});

// Closed-form estimates where no memory plan exists. A forward over T tokens in one unplanned graph (every
// node's output kept: the residual stream, q/k/v and their rotations, attention, the feed-forward's three
// products; on the CPU attention's probabilities [H, T, T] per layer), its logits [T, V] and their copies as
// `q4tune logits` writes them (as doubles, JSON values and text).
int64_t logits_bytes(const model::ModelConfig& c, int64_t T, bool cpu);
// The keys and values of `tokens` positions in a decoder's cache.
int64_t kv_cache_bytes(const model::ModelConfig& c, int64_t tokens);

}  // namespace q4t::train
