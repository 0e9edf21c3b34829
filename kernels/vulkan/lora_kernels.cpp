// The products of a LoRA adapter (linear_kernels.h: lora_rows, lora_cols, lora_wide; lora_*.comp).
#include <algorithm>
#include <stdexcept>

#include "kernels/shapes.h"
#include "kernels/vulkan/dispatch_util.h"
#include "kernels/vulkan/linear_kernels.h"

namespace q4t::vk {

namespace {

void check_rank(const char* k, int64_t r) {
  if (r < 1 || r > LinearKernels::kLoraMaxRank)
    throw ShapeError(std::string(k) + ": rank " + std::to_string(r) + " is outside 1.." +
                     std::to_string(LinearKernels::kLoraMaxRank));
}

// lora_cols.comp splits the tokens over workgroups along y where its column groups alone would leave a large GPU
// idle: into about kColsTargetGroups workgroups, chunks of at least kColsMinChunk tokens (a multiple of its
// staging step of 32).
constexpr int64_t kColsTargetGroups = 264;
constexpr int64_t kColsMinChunk = 64;

std::pair<int64_t, int64_t> cols_split(int64_t T, int64_t N) {  // {chunks, tokens per chunk}
  const int64_t col_groups = (N + 255) / 256;
  const int64_t chunks = std::clamp<int64_t>(kColsTargetGroups / col_groups, 1, std::max<int64_t>(1, T / kColsMinChunk));
  const int64_t t_chunk = ((T + chunks - 1) / chunks + 31) / 32 * 32;
  return {(T + t_chunk - 1) / t_chunk, t_chunk};
}

// lora_rows.comp's rows per workgroup (256 invocations, 4 columns each), and how it splits K over workgroups along y
// where its row groups alone would leave a large GPU idle: about kRowsTargetGroups workgroups, slices of at least
// kRowsMinSlice (a multiple of its K step of 32).
int64_t rows_per_group(int64_t r) { return 256 / ((r + 3) / 4); }
constexpr int64_t kRowsTargetGroups = 528;
constexpr int64_t kRowsMinSlice = 256;

std::pair<int64_t, int64_t> rows_split(int64_t M, int64_t K, int64_t r) {  // {slices, K per slice}
  const int64_t groups = (M + rows_per_group(r) - 1) / rows_per_group(r);
  const int64_t slices = std::clamp<int64_t>(kRowsTargetGroups / groups, 1, std::max<int64_t>(1, K / kRowsMinSlice));
  const int64_t k_slice = ((K + slices - 1) / slices + 31) / 32 * 32;
  return {(K + k_slice - 1) / k_slice, k_slice};
}

}  // namespace

size_t LinearKernels::lora_rows_scratch_bytes(int64_t M, int64_t K, int64_t r) {
  const auto [slices, k_slice] = rows_split(M, K, r);
  return slices > 1 ? size_t(slices * M * r) * 4 : 0;
}

void LinearKernels::lora_rows(Sequence& s, const Buffer& C, const Buffer& X, const Buffer& B, int64_t M, int64_t K,
                              int64_t ldx, int64_t r, bool b_kr, bool accumulate, float alpha, const Buffer* scratch) {
  const char* k = "lora_rows";
  check_rank(k, r);
  check_gemm(k, M, r, K);
  check_fits_u32(k, "X", M * ldx);
  check_min_size(k, "X", X.size(), size_t((M - 1) * ldx + K) * 4);
  check_min_size(k, "B", B.size(), size_t(r * K) * 4);
  check_min_size(k, "C", C.size(), size_t(M * r) * 4);
  auto [slices, k_slice] = rows_split(M, K, r);
  const bool sliced = slices > 1 && scratch;
  if (!sliced) slices = 1, k_slice = K;
  if (sliced) check_min_size(k, "scratch", scratch->size(), size_t(slices * M * r) * 4);
  if (ceil_div(M, rows_per_group(r)) > 65535)
    throw ShapeError(std::string(k) + ": " + std::to_string(M) + " rows exceed 65535 workgroups");
  struct { uint32_t M, K, ldx, k_slice, sliced, accumulate; float alpha; } push{
      uint32_t(M), uint32_t(K), uint32_t(ldx), uint32_t(k_slice), sliced ? 1u : 0u, accumulate ? 1u : 0u, alpha};
  s.dispatch(pipeline("lora_rows", 3, sizeof(push), {uint32_t(r), b_kr ? 1u : 0u}), {sliced ? scratch : &C, &X, &B},
             push, {ceil_div(M, rows_per_group(r)), uint32_t(slices), 1});
  if (sliced) dx_reduce(s, C, *scratch, M * r, slices, accumulate);
}

size_t LinearKernels::lora_cols_scratch_bytes(int64_t T, int64_t N, int64_t r) {
  const auto [chunks, t_chunk] = cols_split(T, N);
  return chunks > 1 ? size_t(chunks * N * r) * 4 : 0;
}

void LinearKernels::lora_cols(Sequence& s, const Buffer& C, const Buffer& X, const Buffer& H, int64_t T, int64_t N,
                              int64_t ldx, int64_t r, bool out_rn, bool accumulate, float alpha,
                              const Buffer* scratch) {
  const char* k = "lora_cols";
  check_rank(k, r);
  check_gemm(k, N, r, T);
  check_fits_u32(k, "X", T * ldx);
  check_min_size(k, "X", X.size(), size_t((T - 1) * ldx + N) * 4);
  check_min_size(k, "H", H.size(), size_t(T * r) * 4);
  check_min_size(k, "C", C.size(), size_t(N * r) * 4);
  auto [chunks, t_chunk] = cols_split(T, N);
  const bool sliced = chunks > 1 && scratch;
  if (!sliced) chunks = 1, t_chunk = T;
  if (sliced) check_min_size(k, "scratch", scratch->size(), size_t(chunks * N * r) * 4);
  struct { uint32_t T, N, ldx, t_chunk, sliced, accumulate; float alpha; } push{
      uint32_t(T), uint32_t(N), uint32_t(ldx), uint32_t(t_chunk), sliced ? 1u : 0u, accumulate ? 1u : 0u, alpha};
  const auto& p = pipeline("lora_cols", 3, sizeof(push), {uint32_t(r), out_rn ? 1u : 0u});
  s.dispatch(p, {sliced ? scratch : &C, &X, &H}, push, {ceil_div(N, 256), uint32_t(chunks), 1});
  if (sliced) dx_reduce(s, C, *scratch, N * r, chunks, accumulate);
}

void LinearKernels::lora_wide(Sequence& s, const Buffer& C, const Buffer& H, const Buffer& B, int64_t M, int64_t N,
                              int64_t r, bool b_rn, bool accumulate, float alpha) {
  const char* k = "lora_wide";
  check_rank(k, r);
  check_gemm(k, M, N, r);
  check_fits_u32(k, "C", M * N);
  check_min_size(k, "H", H.size(), size_t(M * r) * 4);
  check_min_size(k, "B", B.size(), size_t(N * r) * 4);
  check_min_size(k, "C", C.size(), size_t(M * N) * 4);
  struct { uint32_t M, N, accumulate; float alpha; } push{uint32_t(M), uint32_t(N), accumulate ? 1u : 0u, alpha};
  if (ceil_div(M, 32) > 65535) throw ShapeError(std::string(k) + ": " + std::to_string(M) + " rows exceed 65535 tiles of 32");
  s.dispatch(pipeline("lora_wide", 3, sizeof(push), {uint32_t(r), b_rn ? 1u : 0u}), {&C, &H, &B}, push,
             {ceil_div(N, 128), ceil_div(M, 32), 1});  // lora_wide.comp's tiles of 32 rows and 128 columns
}

}  // namespace q4t::vk
