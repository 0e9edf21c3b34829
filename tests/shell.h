// Running a shell command from a test: its exit code and its stdout and stderr together.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace q4t::test {

struct CmdResult {
  int code;         // the exit code, or -1 when the command did not exit normally
  std::string out;  // stdout and stderr together
};

inline CmdResult run_shell(const std::string& cmd) {
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

}  // namespace q4t::test
