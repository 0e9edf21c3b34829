// What the interop tests share: running a command with its output captured, quoting paths for the shell,
// and reading the {"logits": [[...] per position]} files that `q4tune logits` and llama_ref.mjs write.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace q4t::interop {

struct CmdResult {
  int code;
  std::string out;  // stdout and stderr together
};

inline CmdResult run(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed: " + cmd};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The path in single quotes, embedded quotes escaped: safe for any file name.
inline std::string quoted(const std::filesystem::path& p) {
  std::string q = "'";
  for (char c : p.string()) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

using Logits = std::vector<std::vector<double>>;

inline Logits read_logits(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  return nlohmann::json::parse(in).at("logits").get<Logits>();
}

}  // namespace q4t::interop
