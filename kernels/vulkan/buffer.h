// A device-local storage buffer. Upload/download go through a host-visible staging buffer, or straight through
// a persistent mapping when the device memory is host-visible (lavapipe, unified-memory GPUs).
// A buffer either owns its memory, or is made without memory and later placed at an offset of an Arena that
// many buffers share (the graph's memory plan: buffers whose uses never overlap in time share bytes).
#pragma once
#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/vulkan/device.h"

namespace q4t::vk {

class Arena;

class Buffer {
 public:
  struct Unplaced {};
  // bytes is rounded up to a multiple of 4 (shaders read 32-bit words); the tail is zeroed.
  Buffer(Device& dev, size_t bytes);
  // No memory yet: place() binds it into an arena before any use.
  Buffer(Device& dev, size_t bytes, Unplaced);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&&) = delete;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  VkBuffer handle() const { return buffer_; }
  // Bytes requested at construction (before rounding).
  size_t size() const { return size_; }
  Device& device() const { return *dev_; }

  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  void fill_zero();

  // Unplaced buffers: the bytes and alignment an arena must give, and the placement (once).
  VkMemoryRequirements requirements() const;
  void place(const Arena& arena, size_t offset);
  bool placed() const { return memory_ != VK_NULL_HANDLE; }
  // The bytes the buffer occupies: [offset, offset + allocated size) of `memory` (its own, or an arena's).
  VkDeviceMemory memory() const { return memory_; }
  size_t memory_offset() const { return offset_; }
  size_t allocated_size() const { return alloc_size_; }

  template <class T>
  void upload(std::span<const T> v) { upload(v.data(), v.size_bytes()); }
  template <class T>
  void upload(const std::vector<T>& v) { upload(v.data(), v.size() * sizeof(T)); }
  template <class T>
  std::vector<T> download_as(size_t count) const {
    std::vector<T> v(count);
    download(v.data(), count * sizeof(T));
    return v;
  }

 private:
  void check_range(const char* what, size_t bytes, size_t offset) const;
  void copy_via_staging(void* host, size_t bytes, size_t offset, bool to_device) const;

  Device* dev_;
  size_t size_ = 0;
  size_t alloc_size_ = 0;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  size_t offset_ = 0;  // in memory_
  void* mapped_ = nullptr;
  bool owns_memory_ = true;
};

// One device-local allocation that unplaced buffers are bound into (counted once in the device's accounting).
class Arena {
 public:
  // type_bits: the memory types every buffer placed here accepts (VkMemoryRequirements::memoryTypeBits).
  Arena(Device& dev, size_t bytes, uint32_t type_bits);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  size_t size() const { return size_; }

 private:
  friend class Buffer;
  Device* dev_;
  size_t size_ = 0;
  uint32_t type_ = 0;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  void* mapped_ = nullptr;
};

}  // namespace q4t::vk
