#include "kernels/vulkan/buffer.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace q4t::vk {

namespace {

VkBuffer make_buffer(Device& dev, size_t bytes, VkBufferUsageFlags usage) {
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = bytes;
  bi.usage = usage;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer b;
  const VkResult r = vkCreateBuffer(dev.handle(), &bi, nullptr, &b);
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
    throw OutOfMemoryError(dev.name() + " cannot make a buffer of " + std::to_string(bytes) + " bytes (vkCreateBuffer: " +
                           (r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "out of device memory)" : "out of host memory)"));
  check(r, "vkCreateBuffer");
  return b;
}

// Transfers up to this size go through the device's reused staging buffer; larger ones (weights, once) through
// one of their own, freed afterwards.
constexpr size_t kReusedStagingMax = size_t(4) << 20;

}  // namespace

Buffer::Buffer(Device& dev, size_t bytes) : dev_(&dev), size_(bytes) {
  alloc_size_ = std::max<size_t>(4, (bytes + 3) / 4 * 4);
  buffer_ = make_buffer(dev, alloc_size_,
                        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                            VK_BUFFER_USAGE_TRANSFER_DST_BIT);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev.handle(), buffer_, &req);
  bool host_visible = false;
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = dev.pick_memory_type(req.memoryTypeBits, &host_visible);
  VkResult r = vkAllocateMemory(dev.handle(), &ai, nullptr, &memory_);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(dev.handle(), buffer_, nullptr);
    throw OutOfMemoryError(dev.name() + ": cannot allocate " + std::to_string(bytes) + " bytes of device memory (" +
                      (r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "out of device memory" : "vkAllocateMemory failed") +
                      ")");
  }
  check(vkBindBufferMemory(dev.handle(), buffer_, memory_, 0), "vkBindBufferMemory");
  if (host_visible) check(vkMapMemory(dev.handle(), memory_, 0, VK_WHOLE_SIZE, 0, &mapped_), "vkMapMemory");
  dev.note_alloc(int64_t(alloc_size_));
  if (alloc_size_ != bytes) {
    const uint32_t zero = 0;
    upload(&zero, alloc_size_ - bytes, bytes);
  }
}

Buffer::Buffer(Device& dev, size_t bytes, Unplaced) : dev_(&dev), size_(bytes), owns_memory_(false) {
  alloc_size_ = std::max<size_t>(4, (bytes + 3) / 4 * 4);
  buffer_ = make_buffer(dev, alloc_size_,
                        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                            VK_BUFFER_USAGE_TRANSFER_DST_BIT);
}

VkMemoryRequirements Buffer::requirements() const {
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev_->handle(), buffer_, &req);
  return req;
}

void Buffer::place(const Arena& arena, size_t offset) {
  if (owns_memory_ || memory_) throw std::logic_error("Buffer::place: the buffer already has memory");
  const VkMemoryRequirements req = requirements();
  if (!(req.memoryTypeBits & (1u << arena.type_)) || offset % req.alignment || offset + req.size > arena.size_)
    throw std::logic_error("Buffer::place: offset " + std::to_string(offset) + " does not fit the arena");
  check(vkBindBufferMemory(dev_->handle(), buffer_, arena.memory_, offset), "vkBindBufferMemory");
  memory_ = arena.memory_;
  offset_ = offset;
  if (arena.mapped_) mapped_ = static_cast<char*>(arena.mapped_) + offset;
}

Arena::Arena(Device& dev, size_t bytes, uint32_t type_bits) : dev_(&dev), size_(std::max<size_t>(bytes, 4)) {
  bool host_visible = false;
  type_ = dev.pick_memory_type(type_bits, &host_visible);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = size_;
  ai.memoryTypeIndex = type_;
  const VkResult r = vkAllocateMemory(dev.handle(), &ai, nullptr, &memory_);
  if (r != VK_SUCCESS)
    throw OutOfMemoryError(dev.name() + ": cannot allocate " + std::to_string(bytes) + " bytes of device memory (" +
                      (r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "out of device memory" : "vkAllocateMemory failed") + ")");
  if (host_visible) check(vkMapMemory(dev.handle(), memory_, 0, VK_WHOLE_SIZE, 0, &mapped_), "vkMapMemory");
  dev.note_alloc(int64_t(size_));
}

Arena::~Arena() {
  vkFreeMemory(dev_->handle(), memory_, nullptr);
  dev_->note_alloc(-int64_t(size_));
}

Buffer::Buffer(Buffer&& o) noexcept
    : dev_(o.dev_), size_(o.size_), alloc_size_(o.alloc_size_), buffer_(o.buffer_), memory_(o.memory_),
      offset_(o.offset_), mapped_(o.mapped_), owns_memory_(o.owns_memory_) {
  o.buffer_ = VK_NULL_HANDLE;
  o.memory_ = VK_NULL_HANDLE;
  o.mapped_ = nullptr;
}

Buffer::~Buffer() {
  if (!buffer_) return;
  vkDestroyBuffer(dev_->handle(), buffer_, nullptr);
  if (!owns_memory_) return;
  vkFreeMemory(dev_->handle(), memory_, nullptr);
  dev_->note_alloc(-int64_t(alloc_size_));
}

void Buffer::check_range(const char* what, size_t bytes, size_t offset) const {
  if (!memory_) throw std::logic_error(std::string("Buffer::") + what + " on a buffer not placed in memory yet");
  if (offset > alloc_size_ || bytes > alloc_size_ - offset)
    throw std::out_of_range(std::string("Buffer::") + what + ": " + std::to_string(bytes) + " bytes at offset " +
                            std::to_string(offset) + " exceed the buffer's " + std::to_string(alloc_size_) +
                            " bytes");
}

void Buffer::copy_via_staging(void* host, size_t bytes, size_t offset, bool to_device) const {
  auto copy = [&](const Device::HostBuffer& st) {
    if (to_device) std::memcpy(st.ptr, host, bytes);
    dev_->run_once([&](VkCommandBuffer cb) {
      VkBufferCopy c{};
      c.size = bytes;
      if (to_device) {
        c.dstOffset = offset;
        vkCmdCopyBuffer(cb, st.buffer, buffer_, 1, &c);
      } else {
        c.srcOffset = offset;
        vkCmdCopyBuffer(cb, buffer_, st.buffer, 1, &c);
      }
    });
    if (!to_device) std::memcpy(host, st.ptr, bytes);
  };
  if (bytes <= kReusedStagingMax) return dev_->with_staging(bytes, copy);
  struct Own {  // freed however copy() ends
    Device& dev;
    Device::HostBuffer b;
    ~Own() { dev.free_host_buffer(b); }
  } st{*dev_, dev_->make_host_buffer(bytes)};
  copy(st.b);
}

void Buffer::upload(const void* src, size_t bytes, size_t offset) {
  check_range("upload", bytes, offset);
  if (bytes == 0) return;
  if (mapped_) {
    std::memcpy(static_cast<char*>(mapped_) + offset, src, bytes);
    return;
  }
  copy_via_staging(const_cast<void*>(src), bytes, offset, true);
}

void Buffer::download(void* dst, size_t bytes, size_t offset) const {
  check_range("download", bytes, offset);
  if (bytes == 0) return;
  if (mapped_) {
    std::memcpy(dst, static_cast<const char*>(mapped_) + offset, bytes);
    return;
  }
  copy_via_staging(dst, bytes, offset, false);
}

void Buffer::fill_zero() {
  check_range("fill_zero", 0, 0);
  dev_->run_once([&](VkCommandBuffer cb) { vkCmdFillBuffer(cb, buffer_, 0, VK_WHOLE_SIZE, 0); });
}

}  // namespace q4t::vk
