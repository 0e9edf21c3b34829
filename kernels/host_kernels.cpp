#include "kernels/host_kernels.h"

#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/linear_kernels.h"

namespace q4t {

namespace {

class CpuHostKernels final : public HostKernels {
 public:
  std::string device_name() const override { return "cpu"; }
  void frozen_gemm(Format f, std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
                   int64_t n_out, int64_t n_in) override {
    cpu::frozen_gemm(f, Y, w, X, T, n_out, n_in);
  }
  void frozen_dx(Format f, std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
                 int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    cpu::frozen_dx(f, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void gemm_nt(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
               int64_t K, bool accumulate, float alpha) override {
    cpu::gemm_nt(C, A, B, M, N, K, accumulate, alpha);
  }
  void gemm_nn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
               int64_t K, bool accumulate, float alpha) override {
    cpu::gemm_nn(C, A, B, M, N, K, accumulate, alpha);
  }
  void gemm_tn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
               int64_t K, bool accumulate, float alpha) override {
    cpu::gemm_tn(C, A, B, M, N, K, accumulate, alpha);
  }
};

class VulkanHostKernels final : public HostKernels {
 public:
  VulkanHostKernels(vk::Device& dev, uint32_t gemm_tile, vk::LinearKernels::IntegerDot integer_dot, bool f16_decode)
      : dev_(dev), kernels_(dev) {
    kernels_.force_gemm_tile(gemm_tile);
    kernels_.set_integer_dot(integer_dot);
    kernels_.set_f16_decode(f16_decode);
  }
  std::string device_name() const override { return dev_.name(); }

  void gemm_nt(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
               int64_t K, bool accumulate, float alpha) override {
    f32_gemm(&vk::LinearKernels::gemm_nt, C, A, B, M, N, K, accumulate, alpha);
  }
  void gemm_nn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
               int64_t K, bool accumulate, float alpha) override {
    f32_gemm(&vk::LinearKernels::gemm_nn, C, A, B, M, N, K, accumulate, alpha);
  }
  void gemm_tn(std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M, int64_t N,
               int64_t K, bool accumulate, float alpha) override {
    f32_gemm(&vk::LinearKernels::gemm_tn, C, A, B, M, N, K, accumulate, alpha);
  }

 private:
  using GemmFn = void (vk::LinearKernels::*)(vk::Sequence&, const vk::Buffer&, const vk::Buffer&,
                                             const vk::Buffer&, int64_t, int64_t, int64_t, bool, const vk::Buffer*,
                                             float);
  template <class T>
  vk::Buffer upload(std::span<const T> v) {
    vk::Buffer b(dev_, v.size_bytes());
    b.upload(v.data(), v.size_bytes());
    return b;
  }
  template <class F>
  void run(F&& record) {
    vk::Sequence s(dev_);
    s.begin();
    record(s);
    s.end();
    s.run();
  }

 public:
  void frozen_gemm(Format f, std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T,
                   int64_t n_out, int64_t n_in) override {
    const std::string k = std::string(format_name(f)) + "_gemm";
    check_gpu_frozen_linear(f, k.c_str(), n_out, n_in, T);
    check_size(k.c_str(), "W", w.size(), size_t(n_out * row_bytes(f, n_in)));
    check_size(k.c_str(), "X", X.size(), size_t(T * n_in), "floats");
    check_size(k.c_str(), "Y", Y.size(), size_t(T * n_out), "floats");
    vk::Buffer bw = upload(std::span<const uint8_t>(to_device_layout(f, w))), bx = upload(X), by(dev_, Y.size_bytes());
    const size_t bytes = kernels_.frozen_scratch_bytes(f, T, n_out, n_in);
    vk::Buffer scratch(dev_, std::max<size_t>(bytes, 4));
    run([&](vk::Sequence& s) { kernels_.gemm(f, s, by, bw, bx, T, n_out, n_in, bytes ? &scratch : nullptr); });
    by.download(Y.data(), Y.size_bytes());
  }
  void frozen_dx(Format f, std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T,
                 int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    const std::string k = std::string(format_name(f)) + "_dx";
    check_gpu_frozen_linear(f, k.c_str(), n_out, n_in, T);
    check_j_range(k.c_str(), j_start, j_end, n_out);
    check_size(k.c_str(), "W", w.size(), size_t(n_out * row_bytes(f, n_in)));
    check_size(k.c_str(), "dY", dY.size(), size_t(T * n_out), "floats");
    check_size(k.c_str(), "dX", dX.size(), size_t(T * n_in), "floats");
    vk::Buffer bw = upload(std::span<const uint8_t>(to_device_layout(f, w))), bdy = upload(dY),
               bdx = upload(std::span<const float>(dX));
    const size_t bytes = kernels_.frozen_scratch_bytes(f, T, j_end - j_start, n_in);
    vk::Buffer scratch(dev_, std::max<size_t>(bytes, 4));
    run([&](vk::Sequence& s) { kernels_.dx(f, s, bdx, bw, bdy, &scratch, T, n_out, n_in, j_start, j_end, accumulate); });
    bdx.download(dX.data(), dX.size_bytes());
  }

 private:
  void f32_gemm(GemmFn fn, std::span<float> C, std::span<const float> A, std::span<const float> B, int64_t M,
                int64_t N, int64_t K, bool accumulate, float alpha) {
    check_gemm("gemm", M, N, K);
    check_size("gemm", "A", A.size(), size_t(M * K), "floats");
    check_size("gemm", "B", B.size(), size_t(K * N), "floats");
    check_size("gemm", "C", C.size(), size_t(M * N), "floats");
    vk::Buffer ba = upload(A), bb = upload(B), bc = upload(std::span<const float>(C));
    // The split-K scratch when the product is skinny enough to be split (see LinearKernels).
    const size_t split = vk::LinearKernels::gemm_split_scratch_bytes(M, N, K);
    vk::Buffer scratch(dev_, std::max<size_t>(split, 4));
    run([&](vk::Sequence& s) { (kernels_.*fn)(s, bc, ba, bb, M, N, K, accumulate, split ? &scratch : nullptr, alpha); });
    bc.download(C.data(), C.size_bytes());
  }

  vk::Device& dev_;
  vk::LinearKernels kernels_;
};

}  // namespace

std::unique_ptr<HostKernels> make_cpu_host_kernels() { return std::make_unique<CpuHostKernels>(); }
std::unique_ptr<HostKernels> make_vulkan_host_kernels(vk::Device& dev, uint32_t gemm_tile,
                                                      vk::LinearKernels::IntegerDot integer_dot, bool f16_decode) {
  return std::make_unique<VulkanHostKernels>(dev, gemm_tile, integer_dot, f16_decode);
}

}  // namespace q4t
