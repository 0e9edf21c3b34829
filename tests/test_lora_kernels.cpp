// The Vulkan kernels of a LoRA adapter's products (vk::LinearKernels::lora_rows, lora_cols, lora_wide) against the
// double-precision reference, on ranks from 1 to the largest, row counts that fill no workgroup evenly, widths that
// are not multiples of 4, token sums split over workgroups or not, with and without accumulating.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "kernels/cpu/reference.h"
#include "kernels/random_inputs.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/linear_kernels.h"

namespace q4t {
namespace {

constexpr double kBound = 1e-5;  // f32 sums of at most 5000 terms

class LoraKernels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { device_ = vk::Device::open({-1, /*validation=*/true}).release(); }
  static void TearDownTestSuite() { delete device_; }
  void TearDown() override {
    const auto msgs = device_->validation_messages();
    EXPECT_TRUE(msgs.empty()) << "validation: " << (msgs.empty() ? "" : msgs.front());
  }
  vk::Buffer upload(const std::vector<float>& v) {
    vk::Buffer b(*device_, v.size() * 4);
    b.upload(v);
    return b;
  }
  template <class F>
  void run(F&& record) {
    vk::Sequence s(*device_);
    s.begin();
    record(s);
    s.end();
    s.run();
  }
  static vk::Device* device_;
  std::mt19937 rng_{5};
};
vk::Device* LoraKernels::device_ = nullptr;

const int64_t kRanks[] = {1, 5, 16, 64};

// hs = s·X·Aᵀ (B [r, K]) and dh = s·dY·B (B [K, r]), X read with a row stride of K rounded up to 4 or wider, K
// split over workgroups (with the scratch) or summed by one (without).
TEST_F(LoraKernels, RowsMatchTheReferenceSplitOrNot) {
  vk::LinearKernels k(*device_);
  for (int64_t r : kRanks)
    for (const auto& [M, K] : {std::pair<int64_t, int64_t>{1, 7}, {37, 300}, {300, 1000}, {100, 5000}})
      for (bool b_kr : {false, true})
        for (bool acc : {false, true}) {
          const int64_t ldx = acc ? (K + 3) / 4 * 4 : K + 3;  // rows on 16 bytes or not
          const auto x = random_floats(rng_, M * ldx), b = random_floats(rng_, r * K), c0 = random_floats(rng_, M * r);
          std::vector<float> xk(size_t(M * K));  // X without its padding, for the reference
          for (int64_t m = 0; m < M; ++m)
            for (int64_t i = 0; i < K; ++i) xk[size_t(m * K + i)] = x[size_t(m * ldx + i)];
          vk::Buffer bx = upload(x), bb = upload(b), bc = upload(c0);
          const size_t bytes = vk::LinearKernels::lora_rows_scratch_bytes(M, K, r);
          vk::Buffer scratch(*device_, std::max<size_t>(bytes, 4));
          const bool split = acc;  // half the cases each way
          run([&](vk::Sequence& s) {
            k.lora_rows(s, bc, bx, bb, M, K, ldx, r, b_kr, acc, 0.75f, split && bytes ? &scratch : nullptr);
          });
          const auto want = b_kr ? ref::gemm_nn(xk.data(), b.data(), acc ? c0.data() : nullptr, M, r, K, 0.75)
                                 : ref::gemm_nt(xk.data(), b.data(), acc ? c0.data() : nullptr, M, r, K, 0.75);
          EXPECT_LE(ref::max_rel_error(bc.download_as<float>(size_t(M * r)).data(), want), kBound)
              << "r=" << r << " M=" << M << " K=" << K << " b_kr=" << b_kr << " accumulate=" << acc
              << " split=" << (split && bytes);
        }
}

// dB = dYᵀ·hs ([N, r]) and dA = dhᵀ·X ([r, N]) over T tokens, the tokens split over workgroups (with the scratch)
// or summed by one (without), X read with a row stride of N rounded up to 4 or wider.
TEST_F(LoraKernels, ColumnSumsMatchTheReferenceSplitOrNot) {
  vk::LinearKernels k(*device_);
  for (int64_t r : kRanks)
    for (const auto& [T, N] : {std::pair<int64_t, int64_t>{1, 9}, {100, 257}, {5000, 300}})
      for (bool out_rn : {false, true})
        for (bool split : {false, true}) {
          const int64_t ldx = split ? (N + 3) / 4 * 4 : N + 5;  // rows on 16 bytes or not
          const double alpha = split ? 0.5 : 1.0;
          const auto x = random_floats(rng_, T * ldx), h = random_floats(rng_, T * r), c0 = random_floats(rng_, N * r);
          std::vector<float> xn(size_t(T * N));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) xn[size_t(t * N + n)] = x[size_t(t * ldx + n)];
          vk::Buffer bx = upload(x), bh = upload(h), bc = upload(c0);
          const size_t bytes = vk::LinearKernels::lora_cols_scratch_bytes(T, N, r);
          vk::Buffer scratch(*device_, std::max<size_t>(bytes, 4));
          run([&](vk::Sequence& s) {
            k.lora_cols(s, bc, bx, bh, T, N, ldx, r, out_rn, true, float(alpha), split && bytes ? &scratch : nullptr);
          });
          // out_rn: C[j][n] = Σ_t H[t][j]·X[t][n] = (Hᵀ·X) [r, N]; else C[n][j] = (Xᵀ·H) [N, r].
          const auto want = out_rn ? ref::gemm_tn(h.data(), xn.data(), c0.data(), r, N, T, alpha)
                                   : ref::gemm_tn(xn.data(), h.data(), c0.data(), N, r, T, alpha);
          EXPECT_LE(ref::max_rel_error(bc.download_as<float>(size_t(N * r)).data(), want), kBound)
              << "r=" << r << " T=" << T << " N=" << N << " out_rn=" << out_rn << " split=" << (split && bytes);
        }
  ASSERT_GT(vk::LinearKernels::lora_cols_scratch_bytes(5000, 300, 16), 0u);  // the split does apply
  ASSERT_GT(vk::LinearKernels::lora_rows_scratch_bytes(100, 5000, 16), 0u);
}

// y += hs·Bᵀ (B [N, r]) and dX += dh·A (B [r, N]), widths with and without whole vec4s.
TEST_F(LoraKernels, WideProductsMatchTheReference) {
  vk::LinearKernels k(*device_);
  for (int64_t r : kRanks)
    for (const auto& [M, N] : {std::pair<int64_t, int64_t>{1, 3}, {33, 1030}, {70, 4096}})
      for (bool b_rn : {false, true})
        for (bool acc : {false, true}) {
          const auto h = random_floats(rng_, M * r), b = random_floats(rng_, N * r), c0 = random_floats(rng_, M * N);
          vk::Buffer bh = upload(h), bb = upload(b), bc = upload(c0);
          run([&](vk::Sequence& s) { k.lora_wide(s, bc, bh, bb, M, N, r, b_rn, acc, 0.5f); });
          const auto want = b_rn ? ref::gemm_nn(h.data(), b.data(), acc ? c0.data() : nullptr, M, N, r, 0.5)
                                 : ref::gemm_nt(h.data(), b.data(), acc ? c0.data() : nullptr, M, N, r, 0.5);
          EXPECT_LE(ref::max_rel_error(bc.download_as<float>(size_t(M * N)).data(), want), kBound)
              << "r=" << r << " M=" << M << " N=" << N << " b_rn=" << b_rn << " accumulate=" << acc;
        }
}

TEST_F(LoraKernels, RanksAboveTheLargestAreRefused) {
  vk::LinearKernels k(*device_);
  vk::Buffer any(*device_, 1 << 16);
  vk::Sequence s(*device_);
  s.begin();
  EXPECT_THROW(k.lora_rows(s, any, any, any, 4, 4, 4, 65, false, false, 1.0f, nullptr), ShapeError);
  EXPECT_THROW(k.lora_wide(s, any, any, any, 4, 4, 0, false, false, 1.0f), ShapeError);
  s.end();
}

}  // namespace
}  // namespace q4t
