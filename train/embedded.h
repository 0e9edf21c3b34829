// Files compiled into the binary (cmake/Embed.cmake): configs/demo.toml and the demo dataset, so the embedded
// default runs from any directory.
#pragma once
#include <string>
#include <string_view>

namespace q4t {
// The bytes of an embedded file by its name ("demo.toml", "demo.jsonl"); throws std::out_of_range otherwise.
std::string_view embedded_file(const std::string& name);
}  // namespace q4t
