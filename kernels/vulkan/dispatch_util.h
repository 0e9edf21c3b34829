// Small helpers of the kernels' host side (linear_kernels.cpp, mixed_kernels.cpp): workgroup counts, the 32-bit
// addressing check, and how a product of few output tiles splits over K.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/shapes.h"

namespace q4t::vk {

// Workgroup counts are uint32_t: here ceil_div is kernels/shapes.h's, in that type.
inline constexpr auto& ceil_div = q4t::ceil_div<uint32_t>;

// A 1-D count of workgroups spread over x and y so that neither exceeds 65535 (the guaranteed limit).
inline std::array<uint32_t, 3> groups_1d(int64_t n_groups) {
  if (n_groups <= 65535) return {uint32_t(n_groups), 1, 1};
  return {65535, ceil_div(n_groups, 65535), 1};
}

inline void check_fits_u32(const char* kernel, const char* what, int64_t elems) {
  if (elems > int64_t(UINT32_MAX / 4))
    throw ShapeError(std::string(kernel) + ": " + what + " of " + std::to_string(elems) +
                     " elements exceeds the 4 GiB a kernel can address");
}

// {slices, k_slice} of a split over K: about target_groups workgroups from `tiles` output tiles, slices of at
// least min_slice, k_slice a multiple of `step` (the shader's K step). 1 slice means no split.
inline std::pair<int64_t, int64_t> split_k(int64_t tiles, int64_t target_groups, int64_t K, int64_t min_slice,
                                           int64_t step) {
  const int64_t want = std::min((target_groups + tiles - 1) / tiles, K / min_slice);
  if (want < 2) return {1, 0};
  const int64_t k_slice = ((K + want - 1) / want + step - 1) / step * step;
  return {(K + k_slice - 1) / k_slice, k_slice};
}

}  // namespace q4t::vk
