// A recorded command sequence: dispatches and transfers, each seeing the writes of the ones before it, and
// timestamps. A command gets a barrier only when it needs one: when it reads bytes that a command since the last
// barrier wrote, or writes bytes that one of them read or wrote (bytes of a buffer's memory, so buffers that
// share an arena's bytes count as one). Which bindings a dispatch writes comes from its shader
// (Pipeline::writes); the others it only reads. Commands between two barriers may run side by side. Record once with begin()/dispatch()/end(), then run() it as
// many times as needed; a training step is the same sequence every step.
#pragma once
#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/vulkan/buffer.h"
#include "kernels/vulkan/pipeline.h"

namespace q4t::vk {

class Sequence {
 public:
  explicit Sequence(Device& dev, uint32_t max_timestamps = 0);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  void begin();  // drops what was recorded before
  void dispatch(const Pipeline& p, std::initializer_list<const Buffer*> buffers, const void* push,
                uint32_t push_bytes, std::array<uint32_t, 3> groups);
  template <class Push>
  void dispatch(const Pipeline& p, std::initializer_list<const Buffer*> buffers, const Push& push,
                std::array<uint32_t, 3> groups) {
    dispatch(p, buffers, &push, sizeof(Push), groups);
  }
  // Transfer commands, ordered like dispatches: zero a whole buffer, or copy bytes between buffers.
  void fill_zero(const Buffer& b);
  void copy(const Buffer& dst, const Buffer& src, size_t bytes);
  // Commands recorded between begin_independent() and end_independent() have no barriers between them, so the
  // GPU may run them side by side: none of them may read or write memory that another of them writes. The group
  // as a whole still waits for every command before it, and the first command after it waits for the group.
  void begin_independent();
  void end_independent();
  // Writes a timestamp after all previous work; returns its slot. The command after it waits for all before it.
  uint32_t timestamp();
  void end();

  void submit();
  void wait();
  void run() { submit(); wait(); }
  // Nanoseconds between timestamp slots a and b of the last run.
  double elapsed_ns(uint32_t a, uint32_t b) const;
  uint32_t dispatch_count() const { return n_dispatches_; }
  uint32_t barrier_count() const { return n_barriers_; }

 private:
  VkDescriptorSet allocate_set(VkDescriptorSetLayout layout);
  struct Access {
    const Buffer* buffer;
    bool write;
  };
  void barrier_before_command(std::initializer_list<Access> accesses);
  void barrier_before_command(const std::vector<Access>& accesses);
  struct Range {
    VkDeviceMemory memory;
    size_t begin, end;
  };

  Device& dev_;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;  // own pool: sequences may be recorded from different threads
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  uint32_t max_timestamps_, n_timestamps_ = 0, n_dispatches_ = 0, n_commands_ = 0, n_barriers_ = 0;
  std::vector<Range> read_, written_;  // by the commands since the last barrier
  bool barrier_next_ = false;          // after a timestamp
  bool independent_ = false;  // inside begin_independent() .. end_independent()
  bool group_started_ = false;  // ... and the group has had its first command
  std::vector<VkDescriptorPool> pools_;
  size_t pool_in_use_ = 0;
  bool recording_ = false, pending_ = false;
};

}  // namespace q4t::vk
