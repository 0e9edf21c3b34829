// The linear kernels behind one interface taking host arrays, for whichever device was chosen: the CPU
// kernels, or the Vulkan kernels (upload, one recorded sequence, download). Used by `q4tune selftest` and the
// tests, which check every device against the same double-precision reference.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kernels/vulkan/device.h"
#include "kernels/vulkan/linear_kernels.h"

namespace q4t {

class HostKernels {
 public:
  virtual ~HostKernels() = default;
  virtual std::string device_name() const = 0;
  // Contracts as in kernels/cpu/linear.h (W in GGML's layout; the Vulkan side converts it to the device's).
  virtual void frozen_gemm(Format f, std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X,
                           int64_t T, int64_t n_out, int64_t n_in) = 0;
  virtual void frozen_dx(Format f, std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY,
                         int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) = 0;
  virtual void gemm_nt(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M,
                       int64_t N, int64_t K, bool accumulate, float alpha = 1) = 0;
  virtual void gemm_nn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M,
                       int64_t N, int64_t K, bool accumulate, float alpha = 1) = 0;
  virtual void gemm_tn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M,
                       int64_t N, int64_t K, bool accumulate, float alpha = 1) = 0;
};

std::unique_ptr<HostKernels> make_cpu_host_kernels();
// Borrows dev, which must outlive the result. gemm_tile forces the tiled GEMMs' tile edge (64 or 128; 0: each
// product picks its own, see vk::LinearKernels::force_gemm_tile); integer_dot picks when the GEMVs take the
// integer-dot path (vk::LinearKernels::set_integer_dot); f16_decode false keeps the one-token dx on its f32
// decode (vk::LinearKernels::set_f16_decode).
std::unique_ptr<HostKernels> make_vulkan_host_kernels(
    vk::Device& dev, uint32_t gemm_tile = 0,
    vk::LinearKernels::IntegerDot integer_dot = vk::LinearKernels::IntegerDot::Auto, bool f16_decode = true);

}  // namespace q4t
