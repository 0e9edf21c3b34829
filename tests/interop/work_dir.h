// The work directory of an interop test: the files both tools read and write, kept when the comparison fails.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

namespace q4t::interop {

// <system temp>/<prefix>-<the running test's name>-<pid>, made empty.
inline std::filesystem::path fresh_work_dir(const std::string& prefix) {
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();  // "Test/variant"
  std::replace(test.begin(), test.end(), '/', '-');
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "-" + test + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// At the end of a test: its work directory is removed, or kept (and named) when the test failed.
inline void remove_unless_failed(const std::filesystem::path& dir) {
  if (::testing::Test::HasFailure())
    std::printf("files of the failed comparison kept in %s\n", dir.c_str());
  else
    std::filesystem::remove_all(dir);
}

}  // namespace q4t::interop
