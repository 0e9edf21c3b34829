#include "train/memory_estimate.h"

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "train/run_log.h"

namespace q4t::train {

namespace {

namespace fs = std::filesystem;

// The value of `key` in a file of "key value [kB]" lines (/proc/meminfo, /proc/self/status, memory.stat), in bytes
// where the line says kB.
std::optional<int64_t> keyed_value(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string k, unit;
    int64_t v = 0;
    if (!(words >> k >> v)) continue;
    if (k != key && k != key + ":") continue;
    words >> unit;
    return unit == "kB" ? v * 1024 : v;
  }
  return std::nullopt;
}

// A file holding one number; nullopt when it is missing or holds something else ("max").
std::optional<int64_t> number_in(const fs::path& file) {
  std::ifstream in(file);
  int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

// The cgroup directories this process is under, innermost first, for the hierarchy whose /proc/self/cgroup line
// `matches`; a path the mount does not show (another namespace's) leaves only the mount's root.
template <class Matches>
std::vector<fs::path> cgroup_dirs(const fs::path& mount, Matches matches) {
  std::ifstream in("/proc/self/cgroup");
  std::string rel;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos || !matches(line.substr(a + 1, b - a - 1))) continue;
    rel = line.substr(b + 1);
    break;
  }
  fs::path d = mount;
  for (const fs::path& part : fs::path(rel).relative_path()) d /= part;
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (;; d = d.parent_path()) {
    if (fs::is_directory(d, ec)) dirs.push_back(d);
    if (d == mount || !d.has_relative_path()) break;
  }
  return dirs;
}

// The least a cgroup directory's limit leaves over its usage less its page cache (reclaimable), across the
// directories; nullopt where none sets a limit.
std::optional<int64_t> cgroup_room(const std::vector<fs::path>& dirs, const char* limit_file, const char* usage_file,
                                   const char* cache_key) {
  constexpr int64_t kNoLimit = int64_t(1) << 60;  // v1 writes "no limit" as a page-rounded INT64_MAX
  std::optional<int64_t> room;
  for (const fs::path& d : dirs) {
    const std::optional<int64_t> limit = number_in(d / limit_file);
    if (!limit || *limit >= kNoLimit) continue;
    const int64_t used = number_in(d / usage_file).value_or(0) - keyed_value(d / "memory.stat", cache_key).value_or(0);
    room = std::min(room.value_or(kNoLimit), *limit - std::max<int64_t>(used, 0));
  }
  return room;
}

std::optional<int64_t> rlimit_room(int resource, const char* mapped_key) {
  struct rlimit rl {};
  if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return int64_t(rl.rlim_cur) - keyed_value("/proc/self/status", mapped_key).value_or(0);
}

void tighten(MemoryRoom& room, std::optional<int64_t> bytes, MemoryRoom::Limit limit) {
  if (bytes && *bytes < room.bytes) {
    room.bytes = std::max<int64_t>(*bytes, 0);
    room.limit = limit;
  }
}

int64_t saturated(double bytes) {
  return bytes >= double(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : int64_t(bytes);
}

}  // namespace

std::string MemoryRoom::text() const {
  const std::string n = fmt_bytes(bytes);
  switch (limit) {
    case Limit::None:
    case Limit::Machine: return "this machine has " + n + " available";
    case Limit::Cgroup: return "the cgroup's memory limit leaves " + n;
    case Limit::AddressSpace: return "the address-space limit (ulimit -v) leaves " + n;
    case Limit::DataSegment: return "the data-segment limit (ulimit -d) leaves " + n;
    case Limit::Device: return device + " has " + n + " free";
  }
  return n;
}

MemoryRoom host_memory_room() {
  MemoryRoom room;
  using L = MemoryRoom::Limit;
  tighten(room, keyed_value("/proc/meminfo", "MemAvailable"), L::Machine);
  const fs::path v2 = "/sys/fs/cgroup";
  if (fs::exists(v2 / "cgroup.controllers"))
    tighten(room, cgroup_room(cgroup_dirs(v2, [](const std::string& c) { return c.empty(); }), "memory.max",
                              "memory.current", "file"),
            L::Cgroup);
  const auto v1_memory = [](const std::string& c) { return ("," + c + ",").find(",memory,") != std::string::npos; };
  tighten(room, cgroup_room(cgroup_dirs(v2 / "memory", v1_memory), "memory.limit_in_bytes", "memory.usage_in_bytes",
                            "total_cache"),
          L::Cgroup);
  tighten(room, rlimit_room(RLIMIT_AS, "VmSize"), L::AddressSpace);
  tighten(room, rlimit_room(RLIMIT_DATA, "VmData"), L::DataSegment);
  return room;
}

MemoryRoom memory_room(ag::Backend& be) {
  // A CPU-type device (lavapipe) allocates from the host and does not hold to the heap size it reports.
  if (be.is_cpu() || be.device().properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) return host_memory_room();
  const vk::Device& dev = be.device();
  VkPhysicalDeviceMemoryProperties mem{};
  vkGetPhysicalDeviceMemoryProperties(dev.physical(), &mem);
  int64_t heap = 0;
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i)
    if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      heap = std::max(heap, int64_t(mem.memoryHeaps[i].size));
  // An integrated GPU's heap is host memory too.
  const bool integrated = dev.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
  MemoryRoom room = integrated ? host_memory_room() : MemoryRoom{};
  room.device = "device " + dev.name();
  tighten(room, heap - dev.bytes_allocated(), MemoryRoom::Limit::Device);
  return room;
}

void require_memory(const MemoryNeed& need, const MemoryRoom& room) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const auto sum = [](int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; };  // saturating
  const int64_t have = need.weights_loaded ? sum(room.bytes, need.weights) : room.bytes;
  const int64_t total = sum(need.activations, need.weights);
  if (total <= have) return;
  MemoryRoom said = room;
  said.bytes = have;
  const std::string weights = "weights " + fmt_bytes(need.weights);
  const std::string parts =
      need.activations > 0 ? "activations " + fmt_bytes(need.activations) + " + " + weights : weights;
  const std::string lower = need.weights > have || need.lower.empty()
                                ? "use a smaller or more quantized model (the weights alone do not fit)"
                                : need.lower;
  throw OutOfMemory(need.what + " needs about " + fmt_bytes(total) + " (" + parts + "); " + said.text() + ": " + lower);
}

int64_t weight_bytes(const gguf::File& f) {
  int64_t n = 0;
  for (const gguf::TensorInfo& t : f.tensors()) n += int64_t(t.bytes);
  return n;
}

std::unique_ptr<model::Model> load_model_that_fits(const gguf::File& f, ag::Backend& be, MemoryNeed need) {
  if (need.what.empty()) need.what = f.path();
  need.weights = weight_bytes(f);
  require_memory(need, memory_room(be));
  return model::Model::load(f, be);
}

int64_t logits_bytes(const model::ModelConfig& c, int64_t T, bool cpu) {
  const double t = double(T), C = double(c.n_embd), ff = double(c.n_ff), H = double(c.n_head);
  const double q = H * double(c.head_dim), kv = double(c.n_head_kv * c.head_dim);
  // Floats per token of one layer: two norms, the o and down products and two residual adds (C each); q, k, v,
  // their rotations and attention's output; gate, up and their product.
  const double per_layer = 6 * C + 3 * q + 3 * kv + 3 * ff + (cpu ? H * t : 0);
  // Per logit: the f32 tensor, the doubles read back, their JSON values (16 bytes) and their text (~20 bytes).
  const double per_logit = 4 + 8 + 16 + 20;
  return saturated(4 * t * (double(c.n_layer) * per_layer + 2 * C) + t * double(c.n_vocab) * per_logit);
}

int64_t kv_cache_bytes(const model::ModelConfig& c, int64_t tokens) {
  return saturated(2.0 * 4 * double(c.n_layer) * double(c.n_head_kv * c.head_dim) * double(tokens));
}

}  // namespace q4t::train
