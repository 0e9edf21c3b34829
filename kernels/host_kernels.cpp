#include "kernels/host_kernels.h"

#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/quant/k_quants.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/linear_kernels.h"

namespace q4t {

namespace {

class CpuHostKernels final : public HostKernels {
 public:
  std::string device_name() const override { return "cpu"; }
  void q4_0_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    cpu::q4_0_gemm(Y, w, X, T, n_out, n_in);
  }
  void q4_0_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    cpu::q4_0_dx(dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void q8_0_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    cpu::q8_0_gemm(Y, w, X, T, n_out, n_in);
  }
  void q8_0_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    cpu::q8_0_dx(dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void f16_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                int64_t n_in) override {
    cpu::f16_gemm(Y, w, X, T, n_out, n_in);
  }
  void f16_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
              int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    cpu::f16_dx(dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void q4_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    cpu::q4_k_gemm(Y, w, X, T, n_out, n_in);
  }
  void q4_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    cpu::q4_k_dx(dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void q6_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    cpu::q6_k_gemm(Y, w, X, T, n_out, n_in);
  }
  void q6_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    cpu::q6_k_dx(dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
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

  void q4_0_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    frozen_gemm(kQ4_0, &vk::LinearKernels::q4_0_gemm, Y, w, X, T, n_out, n_in);
  }
  void q4_0_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    frozen_dx(kQ4_0, &vk::LinearKernels::q4_0_dx, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void q8_0_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    frozen_gemm(kQ8_0, &vk::LinearKernels::q8_0_gemm, Y, w, X, T, n_out, n_in);
  }
  void q8_0_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    frozen_dx(kQ8_0, &vk::LinearKernels::q8_0_dx, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void f16_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                int64_t n_in) override {
    frozen_gemm(kF16, &vk::LinearKernels::f16_gemm, Y, w, X, T, n_out, n_in);
  }
  void f16_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
              int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    frozen_dx(kF16, &vk::LinearKernels::f16_dx, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void q4_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    frozen_gemm(kQ4_K, &vk::LinearKernels::q4_k_gemm, Y, w, X, T, n_out, n_in);
  }
  void q4_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    frozen_dx(kQ4_K, &vk::LinearKernels::q4_k_dx, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }
  void q6_k_gemm(std::span<float> Y, std::span<const uint8_t> w, std::span<const float> X, int64_t T, int64_t n_out,
                 int64_t n_in) override {
    frozen_gemm(kQ6_K, &vk::LinearKernels::q6_k_gemm, Y, w, X, T, n_out, n_in);
  }
  void q6_k_dx(std::span<float> dX, std::span<const uint8_t> w, std::span<const float> dY, int64_t T, int64_t n_out,
               int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) override {
    frozen_dx(kQ6_K, &vk::LinearKernels::q6_k_dx, dX, w, dY, T, n_out, n_in, j_start, j_end, accumulate);
  }

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
  using FrozenGemmFn = void (vk::LinearKernels::*)(vk::Sequence&, const vk::Buffer&, const vk::Buffer&,
                                                   const vk::Buffer&, int64_t, int64_t, int64_t, const vk::Buffer*);
  using FrozenDxFn = void (vk::LinearKernels::*)(vk::Sequence&, const vk::Buffer&, const vk::Buffer&,
                                                 const vk::Buffer&, const vk::Buffer*, int64_t, int64_t, int64_t,
                                                 int64_t, int64_t, bool);
  // The host-side checks and scratch size of one frozen weight format.
  struct Format {
    q4t::Format format;
    const char* gemm_name;
    const char* dx_name;
    void (*check)(const char* kernel, int64_t n_out, int64_t n_in, int64_t T);
    int64_t (*row_bytes)(int64_t n_in);
    std::vector<uint8_t> (*to_device)(std::span<const uint8_t>);  // nullptr: GGML's bytes as they are
  };
  static constexpr Format kQ4_0{q4t::Format::Q4_0, "q4_0_gemm", "q4_0_dx", check_q4_0_linear, q4_0_row_bytes, nullptr};
  static constexpr Format kQ8_0{q4t::Format::Q8_0, "q8_0_gemm", "q8_0_dx", check_q8_0_linear, q8_0_row_bytes, nullptr};
  static constexpr Format kQ4_K{q4t::Format::Q4_K, "q4_k_gemm", "q4_k_dx", check_q4_k_linear, q4_k_row_bytes, nullptr};
  static constexpr Format kQ6_K{q4t::Format::Q6_K, "q6_k_gemm", "q6_k_dx", check_q6_k_linear, q6_k_row_bytes,
                                quant::q6_k_to_device};
  static constexpr Format kF16{q4t::Format::F16, "f16_gemm", "f16_dx", check_f16_linear, f16_row_bytes, nullptr};

  template <class T>
  vk::Buffer upload(std::span<const T> v) {
    vk::Buffer b(dev_, v.size_bytes());
    b.upload(v.data(), v.size_bytes());
    return b;
  }
  vk::Buffer upload_weight(const Format& f, std::span<const uint8_t> w) {
    return f.to_device ? upload(std::span<const uint8_t>(f.to_device(w))) : upload(w);
  }
  template <class F>
  void run(F&& record) {
    vk::Sequence s(dev_);
    s.begin();
    record(s);
    s.end();
    s.run();
  }
  void frozen_gemm(const Format& f, FrozenGemmFn fn, std::span<float> Y, std::span<const uint8_t> w,
                   std::span<const float> X, int64_t T, int64_t n_out, int64_t n_in) {
    f.check(f.gemm_name, n_out, n_in, T);
    check_size(f.gemm_name, "W", w.size(), size_t(n_out * f.row_bytes(n_in)));
    check_size(f.gemm_name, "X", X.size(), size_t(T * n_in), "floats");
    check_size(f.gemm_name, "Y", Y.size(), size_t(T * n_out), "floats");
    vk::Buffer bw = upload_weight(f, w), bx = upload(X), by(dev_, Y.size_bytes());
    const size_t bytes = kernels_.frozen_scratch_bytes(f.format, T, n_out, n_in);
    vk::Buffer scratch(dev_, std::max<size_t>(bytes, 4));
    run([&](vk::Sequence& s) { (kernels_.*fn)(s, by, bw, bx, T, n_out, n_in, bytes ? &scratch : nullptr); });
    by.download(Y.data(), Y.size_bytes());
  }
  void frozen_dx(const Format& f, FrozenDxFn fn, std::span<float> dX, std::span<const uint8_t> w,
                 std::span<const float> dY, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
                 bool accumulate) {
    f.check(f.dx_name, n_out, n_in, T);
    check_j_range(f.dx_name, j_start, j_end, n_out);
    check_size(f.dx_name, "W", w.size(), size_t(n_out * f.row_bytes(n_in)));
    check_size(f.dx_name, "dY", dY.size(), size_t(T * n_out), "floats");
    check_size(f.dx_name, "dX", dX.size(), size_t(T * n_in), "floats");
    vk::Buffer bw = upload_weight(f, w), bdy = upload(dY), bdx = upload(std::span<const float>(dX));
    const size_t bytes = kernels_.frozen_scratch_bytes(f.format, T, j_end - j_start, n_in);
    vk::Buffer scratch(dev_, std::max<size_t>(bytes, 4));
    run([&](vk::Sequence& s) {
      (kernels_.*fn)(s, bdx, bw, bdy, &scratch, T, n_out, n_in, j_start, j_end, accumulate);
    });
    bdx.download(dX.data(), dX.size_bytes());
  }
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
