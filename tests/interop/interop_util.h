// What the interop tests share: running a command with its output captured, quoting paths for the shell,
// and reading the {"logits": [[...] per position]} files that `q4tune logits` and llama_ref.mjs write.
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "../shell.h"

namespace q4t::interop {

using test::CmdResult;
using test::quoted;
inline CmdResult run(const std::string& cmd) { return test::run_shell(cmd); }

using Logits = std::vector<std::vector<double>>;

inline Logits read_logits(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  return nlohmann::json::parse(in).at("logits").get<Logits>();
}

}  // namespace q4t::interop
