// The SPIR-V of every kernels/glsl/*.comp, compiled at build time and embedded (cmake/Shaders.cmake).
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>

namespace q4t::vk {
// name (the .comp file's stem) -> SPIR-V words.
const std::map<std::string, std::span<const uint32_t>>& shader_table();
}  // namespace q4t::vk
