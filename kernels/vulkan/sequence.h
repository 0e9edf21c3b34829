// A recorded command sequence: dispatches and transfers, each seeing the writes of the ones recorded before it
// that touch the same bytes, and timestamps. Record once with begin()/dispatch()/end(), then run() it as many
// times as needed; a training step is the same sequence every step.
//
// Commands are not written to the command buffer as they are recorded: end() (and each timestamp) orders them
// into levels. A command's level is one past the highest level of an earlier command it depends on: one that
// wrote bytes it reads, or read or wrote bytes it writes (bytes of a buffer's memory, so buffers that share an
// arena's bytes count as one). Levels go to the GPU in order with a barrier between them, and the commands of a
// level run side by side. Which bindings a dispatch writes comes from its shader (Pipeline::writes); the
// others it only reads.
#pragma once
#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
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
  // Copies src's first `bytes` into mapped host memory at dst_offset, ordered like the other commands. Then
  // signal_host() sets ev once the copies recorded before it into bytes [begin, end) of dst are done, their
  // bytes visible to the host (which polls vkGetEventStatus and resets ev before the next submit); the GPU goes
  // on with the commands that do not wait for those copies.
  void copy_to_host(const Device::HostBuffer& dst, size_t dst_offset, const Buffer& src, size_t bytes);
  void signal_host(VkEvent ev, const Device::HostBuffer& dst, size_t begin, size_t end);
  // Commands recorded between begin_independent() and end_independent() take one level as a group, although
  // they touch the same buffers: none of them may read or write bytes that another of them writes (parts of one
  // buffer, say). The group depends on what its commands depend on, and what touches its bytes, on the group.
  void begin_independent();
  void end_independent();
  // Writes a timestamp after all previous work; returns its slot. Commands are ordered into levels between
  // timestamps only: what follows one waits for everything before it. Not inside an independent group.
  uint32_t timestamp();
  // Profiling (set before begin(); the sequence needs room for the timestamps, max_timestamps):
  //   Commands: a timestamp after each command outside an independent group, and after each group, so that every
  //             command runs alone between two timestamps (the sequence runs slower);
  //   Levels:   a timestamp after each level, so that the levels run as without profiling and each is timed
  //             from the end of the one before (its barrier included).
  enum class Timing { Off, Commands, Levels };
  void set_timing(Timing t) { timing_ = t; }
  void end();

  void submit();
  void wait();
  void run() { submit(); wait(); }
  // Nanoseconds between timestamp slots a and b of the last run.
  double elapsed_ns(uint32_t a, uint32_t b) const;
  // With timing: each timed command's name (its pipeline's, or the kind of transfer; a group's names joined by
  // '+'), or each level's (its commands' names, sorted, with their counts), and its nanoseconds in the last run.
  std::vector<std::pair<std::string, double>> command_times() const;
  uint32_t dispatch_count() const { return n_dispatches_; }
  uint32_t barrier_count() const { return n_barriers_; }  // of the last recording, known after end()

 private:
  VkDescriptorSet allocate_set(VkDescriptorSetLayout layout);
  struct Range {
    VkDeviceMemory memory;
    size_t begin, end;
  };
  // A recorded command, written to the command buffer by flush().
  struct Command {
    enum Kind { Dispatch, Fill, Copy, Signal } kind;
    VkPipeline pipeline;
    VkPipelineLayout layout;
    VkDescriptorSet set;
    std::vector<uint8_t> push;
    std::array<uint32_t, 3> groups;
    VkBuffer dst, src;
    size_t bytes;
    uint32_t node;  // the independent group it belongs to, or its own index
    size_t dst_offset = 0;
    VkEvent event = VK_NULL_HANDLE;
    const std::string* name = nullptr;  // the pipeline's (dispatches), for command timing
  };
  struct Node {
    std::vector<std::pair<Range, bool>> accesses;  // {bytes, written}
    uint32_t level = 0;
  };
  static Range range_of(const Buffer& b);
  void add(Command c, std::vector<std::pair<Range, bool>> accesses);
  void time_command(std::string name);
  uint32_t write_timestamp();
  static std::string name_of(const Command& c);
  std::string level_name(const std::vector<uint32_t>& order, size_t begin, size_t end) const;
  void place_node(Node& n);
  void flush();
  void barrier();

  Device& dev_;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;  // own pool: sequences may be recorded from different threads
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  uint32_t max_timestamps_, n_timestamps_ = 0, n_dispatches_ = 0, n_barriers_ = 0;
  // Since the last flush: the commands, their nodes (a command, or an independent group), and per distinct
  // range of bytes the highest levels that wrote and read it (-1: none).
  std::vector<Command> pending_commands_;
  std::vector<Node> nodes_;
  struct Track {
    Range range;
    int64_t written = -1, read = -1;
  };
  std::vector<Track> tracks_;
  bool emitted_ = false;      // commands went to the command buffer before this flush window
  bool independent_ = false;  // inside begin_independent() .. end_independent()
  std::vector<VkDescriptorPool> pools_;
  size_t pool_in_use_ = 0;
  bool recording_ = false, pending_ = false;
  Timing timing_ = Timing::Off;
  std::vector<std::pair<uint32_t, std::string>> timed_;  // {the timestamp after it, name}
  std::string group_names_;                              // Timing::Commands: of the open independent group
};

}  // namespace q4t::vk
