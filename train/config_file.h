// A CLI11 command's options as a TOML 1.0 file (toml++): each key is a long option name without its dashes, and
// tables, dotted keys and inline tables join their keys with '-' ([lora] rank = 8 is lora-rank = 8).
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace q4t {

// Feeds each key of the TOML file at path to the option of cmd it names, through CLI11's own conversion and
// checks; an option the command line gave keeps its value. The options named in `reserved` may not be set.
// Throws CLI::ConfigError with one line "PATH:LINE:COL: message" for a syntax error, an unknown, reserved or
// repeated key, a value of the wrong type or one the option's check rejects; CLI::FileError "PATH: ..." when the
// file cannot be read.
void apply_config_file(CLI::App* cmd, const std::string& path, const std::vector<std::string>& reserved);

// Every option of cmd except those in `skip`, one "key = value" line each in the order they were added: what
// was given (the command line or the file) else the default. apply_config_file reads it back to the same values.
std::string options_as_toml(const CLI::App* cmd, const std::vector<std::string>& skip);

}  // namespace q4t
