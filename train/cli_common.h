// Command-line pieces that several commands share: the model argument, the device flags and the examples in --help.
#pragma once
#include <memory>
#include <string>

namespace CLI {
class App;
}

namespace q4t {

struct DeviceChoice;

// MODEL as a positional argument or as -m/--model, written to `model`; giving both, or neither when `required`, is
// a usage error (exit code 2). When `text` is given (tokenize MODEL TEXT), `-m F TEXT` reads the positional as
// the text.
void add_model_argument(CLI::App* cmd, std::string& model, const std::string& description,
                        std::string* text = nullptr, bool required = true);

// The text with the escapes \n, \t and \\ read as newline, tab and backslash (others stay as written).
std::string unescape(const std::string& s);

// The "Example:" lines at the end of a command's --help.
void set_examples(CLI::App* cmd, const std::string& lines);

// --device, --threads and --precision of the commands that run on a device; open() gives the device they name.
// train and generate have their own (train_cli.cpp, generate_cli.cpp).
struct DeviceFlags {
  std::string device = "auto";
  std::string precision;  // "" where the command has no --precision
  int threads = 0;
  bool allow_shared_device = false;  // under mpirun (choose_rank_device)
  DeviceChoice open() const;
};
// Registers --device and --threads on cmd, and --precision auto|mixed|f32 when `with_precision`; the command's run
// keeps the flags.
std::shared_ptr<DeviceFlags> add_device_flags(CLI::App* cmd, bool with_precision);
// The help of every --precision (auto|mixed|f32): what mixed means on a GPU and on the CPU.
extern const char* const kPrecisionHelp;

}  // namespace q4t
