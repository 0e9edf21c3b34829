// libFuzzer target: a TOML file as `q4tune train --config FILE --print-config` reads it (apply_config_file over
// train's options, then options_as_toml), and the effective config it prints read back: it must load again and
// print the same text. A bad file must end in a CLI11 error (its ConfigError "PATH:LINE:COL: ..."); anything
// else is a finding.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_input.h"
#include "train/train.h"

namespace {

using namespace q4t;

// The effective config of a train command line given only the config file; throws CLI::Error.
std::string effective_config(const std::string& path) {
  CLI::App app("q4tune");
  TrainOptions o;
  add_train_options(app.add_subcommand("train"), o);
  const char* const argv[] = {"q4tune", "train", "--config", path.c_str(), "--print-config"};
  app.parse(5, argv);
  return o.effective_config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_input(data, size, ".toml");
  std::string first;
  try {
    first = effective_config(path);
  } catch (const CLI::Error&) {
    return 0;
  }
  const uint8_t* text = reinterpret_cast<const uint8_t*>(first.data());
  const std::string again_path = fuzz::write_input(text, first.size(), ".again.toml");
  std::string again;
  try {
    again = effective_config(again_path);
  } catch (const CLI::Error& e) {
    std::fprintf(stderr, "the printed config does not load again: %s\n%s", e.what(), first.c_str());
    std::abort();
  }
  if (again != first) {
    std::fprintf(stderr, "the printed config prints differently when loaded again:\n%s\n---\n%s", first.c_str(),
                 again.c_str());
    std::abort();
  }
  return 0;
}
