#include "kernels/vulkan/sequence.h"

#include <algorithm>
#include <string>

namespace q4t::vk {

namespace {
constexpr uint32_t kSetsPerPool = 256;
constexpr uint32_t kMaxBuffersPerSet = 12;  // the fused attention backward binds 9
}  // namespace

Sequence::Range Sequence::range_of(const Buffer& b) {
  return {b.memory(), b.memory_offset(), b.memory_offset() + b.allocated_size()};
}

Sequence::Sequence(Device& dev, uint32_t max_timestamps) : dev_(dev), max_timestamps_(max_timestamps) {
  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = dev.queue_family();
  check(vkCreateCommandPool(dev.handle(), &pci, nullptr, &cmd_pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = cmd_pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(dev.handle(), &ai, &cb_), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(dev.handle(), &fci, nullptr, &fence_), "vkCreateFence");
  if (max_timestamps_ > 0) {
    if (!dev.timestamps_supported()) throw DeviceError(dev.name() + ": timestamp queries are not supported");
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = max_timestamps_;
    check(vkCreateQueryPool(dev.handle(), &qi, nullptr, &queries_), "vkCreateQueryPool");
  }
}

Sequence::~Sequence() {
  if (pending_) vkWaitForFences(dev_.handle(), 1, &fence_, VK_TRUE, UINT64_MAX);
  for (VkDescriptorPool p : pools_) vkDestroyDescriptorPool(dev_.handle(), p, nullptr);
  if (queries_) vkDestroyQueryPool(dev_.handle(), queries_, nullptr);
  vkDestroyFence(dev_.handle(), fence_, nullptr);
  vkDestroyCommandPool(dev_.handle(), cmd_pool_, nullptr);
}

void Sequence::begin() {
  if (pending_) wait();
  for (VkDescriptorPool p : pools_) vkResetDescriptorPool(dev_.handle(), p, 0);
  pool_in_use_ = 0;
  n_timestamps_ = 0;
  n_dispatches_ = 0;
  n_barriers_ = 0;
  pending_commands_.clear();
  nodes_.clear();
  tracks_.clear();
  emitted_ = false;
  independent_ = false;
  timed_.clear();
  group_names_.clear();
  vkResetCommandBuffer(cb_, 0);
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  check(vkBeginCommandBuffer(cb_, &bi), "vkBeginCommandBuffer");
  if (queries_) vkCmdResetQueryPool(cb_, queries_, 0, max_timestamps_);
  recording_ = true;
  if (timing_ == Timing::Levels) timestamp();  // where the first level's time starts
}

VkDescriptorSet Sequence::allocate_set(VkDescriptorSetLayout layout) {
  for (;;) {
    if (pool_in_use_ == pools_.size()) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBuffersPerSet};
      VkDescriptorPoolCreateInfo ci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
      ci.maxSets = kSetsPerPool;
      ci.poolSizeCount = 1;
      ci.pPoolSizes = &size;
      VkDescriptorPool pool;
      check(vkCreateDescriptorPool(dev_.handle(), &ci, nullptr, &pool), "vkCreateDescriptorPool");
      pools_.push_back(pool);
    }
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = pools_[pool_in_use_];
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set;
    VkResult r = vkAllocateDescriptorSets(dev_.handle(), &ai, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) check(r, "vkAllocateDescriptorSets");
    ++pool_in_use_;
  }
}

void Sequence::dispatch(const Pipeline& p, std::initializer_list<const Buffer*> buffers, const void* push,
                        uint32_t push_bytes, std::array<uint32_t, 3> groups) {
  if (!recording_) throw std::logic_error("Sequence::dispatch outside begin()/end()");
  if (buffers.size() != p.n_buffers() || buffers.size() > kMaxBuffersPerSet)
    throw std::logic_error(p.name() + ": " + std::to_string(buffers.size()) + " buffers bound, pipeline has " +
                           std::to_string(p.n_buffers()));
  if (push_bytes != p.push_bytes())
    throw std::logic_error(p.name() + ": push constants of " + std::to_string(push_bytes) + " bytes, pipeline has " +
                           std::to_string(p.push_bytes()));
  const auto& lim = dev_.properties().limits.maxComputeWorkGroupCount;
  for (int i = 0; i < 3; ++i)
    if (groups[i] == 0 || groups[i] > lim[i])
      throw std::logic_error(p.name() + ": workgroup count " + std::to_string(groups[i]) + " outside [1, " +
                             std::to_string(lim[i]) + "]");

  VkDescriptorSet set = allocate_set(p.set_layout());
  std::vector<VkDescriptorBufferInfo> infos;
  std::vector<VkWriteDescriptorSet> writes;
  infos.reserve(buffers.size());
  for (const Buffer* b : buffers) infos.push_back({b->handle(), 0, VK_WHOLE_SIZE});
  for (uint32_t i = 0; i < infos.size(); ++i) {
    VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    w.dstSet = set;
    w.dstBinding = i;
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &infos[i];
    writes.push_back(w);
  }
  vkUpdateDescriptorSets(dev_.handle(), uint32_t(writes.size()), writes.data(), 0, nullptr);

  Command c{Command::Dispatch, p.handle(), p.layout(), set,
            std::vector<uint8_t>(static_cast<const uint8_t*>(push), static_cast<const uint8_t*>(push) + push_bytes),
            groups, VK_NULL_HANDLE, VK_NULL_HANDLE, 0, 0};
  c.name = &p.name();
  std::vector<std::pair<Range, bool>> accesses;
  accesses.reserve(buffers.size());
  uint32_t binding = 0;
  for (const Buffer* b : buffers) accesses.push_back({range_of(*b), p.writes(binding++)});
  add(std::move(c), std::move(accesses));
  ++n_dispatches_;
}

void Sequence::add(Command c, std::vector<std::pair<Range, bool>> accesses) {
  std::string name = timing_ == Timing::Commands ? name_of(c) : std::string();
  if (independent_) {
    c.node = uint32_t(nodes_.size() - 1);
    auto& acc = nodes_.back().accesses;
    acc.insert(acc.end(), accesses.begin(), accesses.end());
  } else {
    c.node = uint32_t(nodes_.size());
    nodes_.push_back({std::move(accesses), 0});
    place_node(nodes_.back());
  }
  pending_commands_.push_back(std::move(c));
  if (timing_ != Timing::Commands) return;
  if (!independent_) return time_command(std::move(name));
  group_names_ += (group_names_.empty() ? "" : "+") + name;
}

std::string Sequence::name_of(const Command& c) {
  static const char* const kKinds[] = {"", "(fill)", "(copy)", "(signal)"};
  return c.name ? *c.name : kKinds[c.kind];
}

// "namexcount+..." of the commands order[begin, end), names sorted (a count only above 1).
std::string Sequence::level_name(const std::vector<uint32_t>& order, size_t begin, size_t end) const {
  std::vector<std::string> names;
  for (size_t k = begin; k < end; ++k) names.push_back(name_of(pending_commands_[order[k]]));
  std::sort(names.begin(), names.end());
  std::string out;
  for (size_t i = 0; i < names.size();) {
    size_t j = i;
    while (j < names.size() && names[j] == names[i]) ++j;
    out += (out.empty() ? "" : "+") + names[i] + (j - i > 1 ? "x" + std::to_string(j - i) : "");
    i = j;
  }
  return out;
}

void Sequence::time_command(std::string name) { timed_.push_back({timestamp(), std::move(name)}); }

std::vector<std::pair<std::string, double>> Sequence::command_times() const {
  std::vector<uint64_t> t(n_timestamps_);
  if (n_timestamps_ > 0)
    check(vkGetQueryPoolResults(dev_.handle(), queries_, 0, n_timestamps_, t.size() * sizeof(uint64_t), t.data(),
                                sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
          "vkGetQueryPoolResults");
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [slot, name] : timed_)
    if (slot > 0) out.push_back({name, double(t[slot] - t[slot - 1]) * dev_.timestamp_period_ns()});
  return out;
}

// A node's level: one past every level that wrote bytes it reads, or read or wrote bytes it writes. Then the
// node's own reads and writes raise its ranges' levels.
void Sequence::place_node(Node& n) {
  int64_t level = 0;
  for (const auto& [r, write] : n.accesses)
    for (const Track& t : tracks_)
      if (t.range.memory == r.memory && t.range.begin < r.end && r.begin < t.range.end)
        level = std::max(level, (write ? std::max(t.written, t.read) : t.written) + 1);
  n.level = uint32_t(level);
  for (const auto& [r, write] : n.accesses) {
    auto it = std::find_if(tracks_.begin(), tracks_.end(), [&r = r](const Track& t) {  // clang 14 captures no binding
      return t.range.memory == r.memory && t.range.begin == r.begin && t.range.end == r.end;
    });
    if (it == tracks_.end()) it = tracks_.insert(tracks_.end(), Track{r});
    (write ? it->written : it->read) = std::max(write ? it->written : it->read, level);
  }
}

void Sequence::barrier() {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                     VK_ACCESS_TRANSFER_READ_BIT;
  mb.dstAccessMask = mb.srcAccessMask;
  const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(cb_, stages, stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
  ++n_barriers_;
}

// The pending commands, level by level (in recording order within a level), a barrier before each level and
// before the first when commands went to the command buffer earlier.
void Sequence::flush() {
  if (pending_commands_.empty()) return;
  std::vector<uint32_t> order(pending_commands_.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto level = [&](uint32_t i) { return nodes_[pending_commands_[i].node].level; };
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return level(a) < level(b); });
  size_t level_begin = 0;  // Timing::Levels: the first command of the current level
  const auto end_level = [&](size_t k) {
    if (timing_ != Timing::Levels || k == level_begin) return;
    timed_.push_back({write_timestamp(), level_name(order, level_begin, k)});
    level_begin = k;
  };
  for (size_t k = 0; k < order.size(); ++k) {
    const Command& c = pending_commands_[order[k]];
    if (k > 0 && level(order[k]) != level(order[k - 1])) end_level(k);
    if (k == 0 ? emitted_ : level(order[k]) != level(order[k - 1])) barrier();
    if (c.kind == Command::Dispatch) {
      vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, c.pipeline);
      vkCmdBindDescriptorSets(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, c.layout, 0, 1, &c.set, 0, nullptr);
      if (!c.push.empty())
        vkCmdPushConstants(cb_, c.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, uint32_t(c.push.size()), c.push.data());
      vkCmdDispatch(cb_, c.groups[0], c.groups[1], c.groups[2]);
    } else if (c.kind == Command::Fill) {
      vkCmdFillBuffer(cb_, c.dst, 0, VK_WHOLE_SIZE, 0);
    } else if (c.kind == Command::Copy) {
      VkBufferCopy region{0, c.dst_offset, c.bytes};
      vkCmdCopyBuffer(cb_, c.src, c.dst, 1, &region);
    } else {  // the copies before it into host memory, visible to the host; then the event
      VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
      mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
      vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0,
                           nullptr);
      vkCmdSetEvent(cb_, c.event, VK_PIPELINE_STAGE_TRANSFER_BIT);
    }
  }
  end_level(order.size());
  emitted_ = true;
  pending_commands_.clear();
  nodes_.clear();
  tracks_.clear();
}

void Sequence::fill_zero(const Buffer& b) {
  if (!recording_) throw std::logic_error("Sequence::fill_zero outside begin()/end()");
  add({Command::Fill, VK_NULL_HANDLE, VK_NULL_HANDLE, VK_NULL_HANDLE, {}, {}, b.handle(), VK_NULL_HANDLE, 0, 0},
      {{range_of(b), true}});
}

void Sequence::copy(const Buffer& dst, const Buffer& src, size_t bytes) {
  if (!recording_) throw std::logic_error("Sequence::copy outside begin()/end()");
  if (bytes > dst.size() || bytes > src.size()) throw std::logic_error("Sequence::copy: range exceeds a buffer");
  if (bytes == 0) return;
  add({Command::Copy, VK_NULL_HANDLE, VK_NULL_HANDLE, VK_NULL_HANDLE, {}, {}, dst.handle(), src.handle(), bytes, 0},
      {{range_of(src), false}, {range_of(dst), true}});
}

void Sequence::copy_to_host(const Device::HostBuffer& dst, size_t dst_offset, const Buffer& src, size_t bytes) {
  if (!recording_) throw std::logic_error("Sequence::copy_to_host outside begin()/end()");
  if (bytes > src.size()) throw std::logic_error("Sequence::copy_to_host: range exceeds the source");
  if (bytes == 0) return;
  Command c{Command::Copy, VK_NULL_HANDLE, VK_NULL_HANDLE, VK_NULL_HANDLE, {}, {}, dst.buffer, src.handle(), bytes, 0};
  c.dst_offset = dst_offset;
  add(std::move(c), {{range_of(src), false}, {{dst.memory, dst_offset, dst_offset + bytes}, true}});
}

void Sequence::signal_host(VkEvent ev, const Device::HostBuffer& dst, size_t begin, size_t end) {
  if (!recording_) throw std::logic_error("Sequence::signal_host outside begin()/end()");
  if (independent_) throw std::logic_error("Sequence::signal_host inside an independent group");
  Command c{Command::Signal, VK_NULL_HANDLE, VK_NULL_HANDLE, VK_NULL_HANDLE, {}, {}, VK_NULL_HANDLE, VK_NULL_HANDLE,
            0, 0};
  c.event = ev;
  add(std::move(c), {{{dst.memory, begin, std::max(end, begin + 1)}, false}});
}

void Sequence::begin_independent() {
  if (!recording_) throw std::logic_error("Sequence::begin_independent outside begin()/end()");
  if (independent_) throw std::logic_error("Sequence::begin_independent inside an independent group");
  independent_ = true;
  nodes_.push_back({});
}

void Sequence::end_independent() {
  if (!independent_) throw std::logic_error("Sequence::end_independent without begin_independent()");
  independent_ = false;
  place_node(nodes_.back());
  if (timing_ == Timing::Commands && !group_names_.empty()) time_command(std::move(group_names_));
  group_names_.clear();
}

uint32_t Sequence::timestamp() {
  if (!recording_) throw std::logic_error("Sequence::timestamp outside begin()/end()");
  if (independent_) throw std::logic_error("Sequence::timestamp inside an independent group");
  flush();
  return write_timestamp();
}

// A timestamp after the commands already in the command buffer, in the next free slot.
uint32_t Sequence::write_timestamp() {
  if (n_timestamps_ >= max_timestamps_)
    throw std::logic_error("Sequence: more than " + std::to_string(max_timestamps_) + " timestamps");
  vkCmdWriteTimestamp(cb_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, n_timestamps_);
  return n_timestamps_++;
}

void Sequence::end() {
  if (!recording_) throw std::logic_error("Sequence::end without begin()");
  if (independent_) throw std::logic_error("Sequence::end inside an independent group");
  flush();
  check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer");
  recording_ = false;
}

void Sequence::submit() {
  if (recording_) throw std::logic_error("Sequence::submit while still recording");
  if (pending_) wait();
  check(vkResetFences(dev_.handle(), 1, &fence_), "vkResetFences");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb_;
  check(vkQueueSubmit(dev_.queue(), 1, &si, fence_), "vkQueueSubmit");
  pending_ = true;
}

void Sequence::wait() {
  if (!pending_) return;
  pending_ = false;
  check(vkWaitForFences(dev_.handle(), 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
}

double Sequence::elapsed_ns(uint32_t a, uint32_t b) const {
  if (a >= n_timestamps_ || b >= n_timestamps_) throw std::logic_error("Sequence::elapsed_ns: no such timestamp");
  uint64_t t[2];
  vkGetQueryPoolResults(dev_.handle(), queries_, a, 1, sizeof(uint64_t), &t[0], sizeof(uint64_t),
                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  vkGetQueryPoolResults(dev_.handle(), queries_, b, 1, sizeof(uint64_t), &t[1], sizeof(uint64_t),
                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  return double(t[1] - t[0]) * dev_.timestamp_period_ns();
}

}  // namespace q4t::vk
