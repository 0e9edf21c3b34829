// Scratch directories of tests: one per test process, <system temp>/<prefix><pid>, made on first use and removed
// with everything in it when the process exits (for files its tests share, such as models made once); and a fresh
// one per test.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
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

// A fresh, empty directory <system temp>/<prefix>XXXXXX for one test, removed with its contents when the test
// is done with it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix)
      : path_((std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string()) {
    if (::mkdtemp(path_.data()) == nullptr)
      throw std::system_error(errno, std::generic_category(), "cannot create " + path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace q4t::test
