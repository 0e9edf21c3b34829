// Writing a file so that readers only ever see the old or the complete new contents: write PATH.tmp-XXXXXX in
// the same directory, fsync, rename over PATH. On failure the temp file is removed and PATH is untouched.
#pragma once
#include <string_view>
#include <string>

namespace q4t {
// Throws std::runtime_error naming the path and the system error.
void write_file_atomic(const std::string& path, std::string_view contents);
}  // namespace q4t
