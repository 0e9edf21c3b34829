// Tensors: a shape, a dtype and storage on one backend (host memory, or a Vulkan buffer). Shapes are
// row-major with the last dimension fastest; a quantized tensor is a matrix [rows, cols] of GGML blocks,
// rows contiguous, and is read-only storage: it can never be a parameter or receive a gradient.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/vulkan/buffer.h"

namespace q4t::ag {

// F32: activations, LoRA parameters and gradients. F64: the same on the CPU in gradient checks.
// I32: token ids and labels. The frozen weights as GGUF stores them (raw GGML bytes) have one dtype per format of
// kernels/formats.h, whose code it is: frozen_dtype(Format::Q4_K).
enum class DType : uint8_t { F32 = 100, F64 = 101, I32 = 102 };
constexpr DType frozen_dtype(Format f) { return DType(uint32_t(f)); }
// The storages of frozen GGUF weights: quantized blocks, or F16 / BF16 halves. Read-only, like the blocks: never
// trainable, never given a gradient, never reshaped (F16 is storage here, not a real type of the graph).
inline bool is_frozen_storage(DType t) { return find_format(uint32_t(t)) != nullptr; }
// Block-quantized weights (every frozen storage but the 16-bit floats).
inline bool is_quantized(DType t) { return is_frozen_storage(t) && format_traits(Format(uint32_t(t))).block_elems > 1; }
const char* dtype_name(DType t);
// Weights per block of a frozen dtype (1 for any other).
int64_t block_elems(DType t);
// The kernels' format of a frozen storage (kernels/formats.h); throws GraphError for any other dtype.
Format frozen_format(DType t);
inline bool is_real(DType t) { return t == DType::F32 || t == DType::F64; }

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t numel(const Shape& s);
// Bytes that a tensor of this dtype and shape occupies (a frozen matrix: rows of its format's blocks, GGML's
// bytes). A Vulkan tensor's buffer holds W in its format's device layout (Storage::bytes; device_weight_bytes).
size_t storage_bytes(DType t, const Shape& s);

// Where the bytes live. Exactly one of host / buffer is used. A planned tensor (see Graph::defer_memory) has
// no bytes of its own until the plan places it: then `placed` points into a host arena, or the buffer is bound
// into a device arena; `arena` keeps that arena alive as long as the tensor.
struct Storage {
  std::vector<std::byte> host;
  std::unique_ptr<vk::Buffer> buffer;
  size_t bytes = 0;
  std::byte* placed = nullptr;
  std::shared_ptr<void> arena;
};

// Thrown for graphs that cannot be built: shape mismatches, quantized parameters, gradients of frozen tensors.
struct GraphError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, DType dtype, std::shared_ptr<Storage> storage)
      : shape_(std::move(shape)), dtype_(dtype), storage_(std::move(storage)) {}

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return ag::numel(shape_); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : size_t(i)); }
  int64_t cols() const { return shape_.empty() ? 1 : shape_.back(); }
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }
  bool defined() const { return storage_ != nullptr; }
  bool on_host() const { return storage_ && !storage_->buffer; }
  size_t bytes() const { return storage_bytes(dtype_, shape_); }

  // Host pointer (CPU tensors only); T must match the dtype (float, double, int32_t, uint8_t for quantized).
  template <class T>
  T* data() const {
    if (!on_host()) throw std::logic_error("Tensor::data on a device tensor");
    if (!storage_->placed && storage_->host.size() < storage_->bytes)
      throw std::logic_error("Tensor::data on a tensor not placed in memory yet");
    return reinterpret_cast<T*>(storage_->placed ? storage_->placed : storage_->host.data());
  }
  // The Vulkan buffer (device tensors only).
  const vk::Buffer& buffer() const {
    if (!storage_ || !storage_->buffer) throw std::logic_error("Tensor::buffer on a host tensor");
    return *storage_->buffer;
  }
  // Same storage, another shape with the same number of elements (not for quantized tensors).
  Tensor view(Shape shape) const;
  Storage& storage() const { return *storage_; }

 private:
  Shape shape_;
  DType dtype_ = DType::F32;
  std::shared_ptr<Storage> storage_;
};

// Bytes of one row of a frozen matrix (quantized or F16) with `cols` columns.
int64_t frozen_row_bytes(DType t, int64_t cols);
// Row r of a CPU matrix [rows, cols] that is frozen (dequantised or widened exactly as GGML does) or real (of
// the requested type, copied).
void matrix_row(float* out, const Tensor& m, int64_t r);
void matrix_row(double* out, const Tensor& m, int64_t r);

}  // namespace q4t::ag
