// The layers include only downward: train -> autograd -> kernels, and data on its own. Every library exports the
// project root as its include path, so nothing but this test stops an upward include: it reads every C++ source
// of the lower layers and names each #include that points up. Also here: kernel sources keep their comments to
// the contract and the current design (history and measurements live in docs/kernels.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The layers each layer may not include.
const std::map<std::string, std::vector<std::string>> kUpward = {
    {"kernels", {"autograd", "train", "data"}},
    {"autograd", {"train", "data"}},
    {"data", {"autograd", "train"}},
};

// The top directory (layer) of an included path, as the compiler finds it: relative to the including file when
// that names a file (#include "../train/x.h"), else relative to the project root.
std::string layer_of(const fs::path& root, const fs::path& file, const std::string& include) {
  fs::path p = (file.parent_path() / include).lexically_normal();
  if (!fs::exists(p)) p = (root / include).lexically_normal();
  const fs::path rel = p.lexically_relative(root);
  return rel.empty() ? "" : rel.begin()->string();
}

// "<file>:<line>: #include ... (<layer>/ may not include <upper>/)" for every upward include under root/layer.
std::vector<std::string> upward_includes(const fs::path& root, const std::string& layer) {
  static const std::regex include_line(R"(^\s*#\s*include\s*[<"]([^">]+)[">])");
  static const std::regex cpp_source(R"(\.(h|hpp|cpp|cc|inc)$)");
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root / layer)) {
    if (!e.is_regular_file() || !std::regex_search(e.path().filename().string(), cpp_source)) continue;
    std::ifstream in(e.path());
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      std::smatch m;
      if (!std::regex_search(line, m, include_line)) continue;
      const std::string target = layer_of(root, e.path(), m[1].str());
      for (const std::string& upper : kUpward.at(layer))
        if (target == upper)
          found.push_back(e.path().lexically_relative(root).string() + ":" + std::to_string(n) + ": " + line + "  (" +
                          layer + "/ may not include " + upper + "/)");
    }
  }
  return found;
}

class Layering : public ::testing::TestWithParam<std::string> {};

TEST_P(Layering, NoSourceIncludesAHigherLayer) {
  const std::vector<std::string> found = upward_includes(Q4T_SOURCE_DIR, GetParam());
  std::string list;
  for (const std::string& f : found) list += "\n  " + f;
  EXPECT_TRUE(found.empty()) << found.size() << " upward include(s):" << list;
}

INSTANTIATE_TEST_SUITE_P(Layers, Layering, ::testing::Values("kernels", "autograd", "data"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Runs of comment lines (//, or lines inside /* */) longer than max_lines in the C++ and GLSL sources under dir.
std::vector<std::string> long_comment_blocks(const fs::path& root, const std::string& dir, int max_lines) {
  static const std::regex source(R"(\.(h|cpp|comp|glsl|inc)$)");
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root / dir)) {
    if (!e.is_regular_file() || !std::regex_search(e.path().filename().string(), source)) continue;
    std::ifstream in(e.path());
    int n = 0, run = 0, start = 0;
    bool in_block = false;
    auto close_run = [&] {
      if (run > max_lines)
        found.push_back(e.path().lexically_relative(root).string() + ":" + std::to_string(start) + ": " +
                        std::to_string(run) + " comment lines");
      run = 0;
    };
    for (std::string line; std::getline(in, line);) {
      ++n;
      const size_t first = line.find_first_not_of(" \t");
      const std::string s = first == std::string::npos ? "" : line.substr(first);
      const bool comment = in_block || s.rfind("//", 0) == 0 || s.rfind("/*", 0) == 0;
      if (s.rfind("/*", 0) == 0 && s.find("*/") == std::string::npos) in_block = true;
      else if (in_block && s.find("*/") != std::string::npos) in_block = false;
      if (!comment) {
        close_run();
        continue;
      }
      if (run++ == 0) start = n;
    }
    close_run();
  }
  return found;
}

TEST(HouseRules, KernelCommentBlocksAreAtMostTwelveLines) {
  const std::vector<std::string> found = long_comment_blocks(Q4T_SOURCE_DIR, "kernels", 12);
  std::string list;
  for (const std::string& f : found) list += "\n  " + f;
  EXPECT_TRUE(found.empty()) << found.size() << " long comment block(s) (move history to docs/kernels.md):" << list;
}

}  // namespace
