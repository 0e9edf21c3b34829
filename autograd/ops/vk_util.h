// Helpers shared by the ops' Vulkan halves.
#pragma once
#include <array>
#include <cstdint>

#include "kernels/shapes.h"

namespace q4t::ag {

inline constexpr auto& ceil_div_u32 = ceil_div<uint32_t>;  // kernels/shapes.h's, for workgroup counts

// Workgroups for n invocations of `wg` each, spread over x and y so neither exceeds 65535; shaders rebuild
// the index as (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * wg + local id.
inline std::array<uint32_t, 3> groups_for(int64_t n, uint32_t wg) {
  const int64_t g = (n + wg - 1) / wg;
  if (g <= 65535) return {uint32_t(g), 1, 1};
  return {65535, uint32_t((g + 65534) / 65535), 1};
}

}  // namespace q4t::ag
