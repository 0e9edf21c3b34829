// A test process's scratch directory: <system temp>/<prefix><pid>, made on first use and removed with everything
// in it when the process exits (for files its tests share, such as models made once).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace q4t::test {

inline std::string process_scratch_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  struct Made {
    std::vector<fs::path> dirs;
    ~Made() {
      std::error_code ec;
      for (const fs::path& d : dirs) fs::remove_all(d, ec);
    }
  };
  static Made made;
  const fs::path d = fs::temp_directory_path() / (prefix + std::to_string(::getpid()));
  if (std::find(made.dirs.begin(), made.dirs.end(), d) == made.dirs.end()) {
    fs::create_directories(d);
    made.dirs.push_back(d);
  }
  return d.string();
}

}  // namespace q4t::test
