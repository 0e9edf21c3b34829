// Helpers shared by the ops' Vulkan halves.
#pragma once
#include <array>
#include <cstdint>

namespace q4t::ag {

inline uint32_t ceil_div_u32(int64_t a, int64_t b) { return uint32_t((a + b - 1) / b); }

// Workgroups for n invocations of `wg` each, spread over x and y so neither exceeds 65535; shaders rebuild
// the index as (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * wg + local id.
inline std::array<uint32_t, 3> groups_for(int64_t n, uint32_t wg) {
  const int64_t g = (n + wg - 1) / wg;
  if (g <= 65535) return {uint32_t(g), 1, 1};
  return {65535, uint32_t((g + 65534) / 65535), 1};
}

}  // namespace q4t::ag
