// A backend is where a graph's tensors live and its ops run: the CPU (in float, or in double for gradient
// checks) or one Vulkan device. It allocates tensors and moves data to and from the host.
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "autograd/tensor.h"
#include "kernels/vulkan/linear_kernels.h"
#include "kernels/vulkan/pipeline.h"

namespace q4t::ag {

class Backend {
 public:
  // real: the dtype of real-valued tensors, F32 or F64 (F64 for the double-precision gradient checks).
  // `precision` Mixed (F32 tensors only): the frozen products of fewer than cpu::kMixedTokens tokens round their
  // input to 8-bit blocks and multiply in integers (kernels/cpu/int_rows.h) where the format and the CPU have those
  // loops; everything else stays f32.
  static std::unique_ptr<Backend> cpu(DType real = DType::F32, Precision precision = Precision::F32);
  // Borrows dev, which must outlive the backend. `precision`: the numerics of the products (kernels/precision.h);
  // Mixed makes every frozen product of 32 tokens or more, the loss's output product and (on cooperative matrices)
  // attention take f16 inputs with f32 sums.
  static std::unique_ptr<Backend> vulkan(vk::Device& dev, Precision precision = Precision::F32);

  bool is_cpu() const { return vk_ == nullptr; }
  // The CPU's precision, or the Vulkan kernels'.
  Precision precision() const { return linear_ ? linear_->precision() : cpu_precision_; }
  DType real() const { return real_; }
  std::string name() const;

  // Uninitialised / zero-filled tensors of the given shape and dtype.
  Tensor empty(const Shape& shape, DType dtype);
  Tensor zeros(const Shape& shape, DType dtype);
  // A tensor without memory yet: place() gives it bytes in an arena before any use (a graph's memory plan).
  Tensor unplaced(const Shape& shape, DType dtype);
  // The alignment an arena offset of t must have.
  size_t placement_alignment(const Tensor& t) const;
  // Places each unplaced tensor at its offset of one new arena of `bytes` (host memory or device memory).
  void place(const std::vector<std::pair<Tensor, size_t>>& at, size_t bytes);
  // Real tensors from host values (converted to real()), and back (as double).
  Tensor from_host(std::span<const float> v, const Shape& shape);
  Tensor from_host(std::span<const double> v, const Shape& shape);
  Tensor from_host_i32(std::span<const int32_t> v, const Shape& shape);
  // A frozen weight tensor (q4_0, q8_0, q4_k, q6_k or f16) [rows, cols] from its raw GGML bytes, and those bytes
  // back (raw_bytes). A Vulkan device keeps q6_k in its grouped layout (kernels/shapes.h): both convert.
  Tensor quantized(std::span<const uint8_t> bytes, const Shape& shape, DType dtype);
  std::vector<double> to_host(const Tensor& t) const;
  std::vector<uint8_t> raw_bytes(const Tensor& t) const;
  void upload(Tensor& t, std::span<const float> v);
  void upload_i32(Tensor& t, std::span<const int32_t> v);

  // Vulkan only.
  vk::Device& device() const { return *vk_; }
  vk::LinearKernels& linear() const { return *linear_; }
  // A pipeline for kernels/glsl/<shader>.comp with n_buffers storage buffers and push_bytes of push constants,
  // built on first use.
  const vk::Pipeline& pipeline(const std::string& shader, uint32_t n_buffers, uint32_t push_bytes,
                               const std::vector<uint32_t>& spec = {});

 private:
  Backend() = default;
  DType real_ = DType::F32;
  Precision cpu_precision_ = Precision::F32;
  vk::Device* vk_ = nullptr;
  std::unique_ptr<vk::LinearKernels> linear_;
  std::map<std::string, std::unique_ptr<vk::Pipeline>> pipelines_;
};

}  // namespace q4t::ag
