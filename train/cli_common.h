// Command-line pieces that several commands share: the model argument and the examples in --help.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace q4t {

// MODEL as a positional argument or as -m/--model, written to `model`; giving both, or neither when `required`, is
// a usage error (exit code 2). When `text` is given (tokenize MODEL TEXT), `-m F TEXT` reads the positional as
// the text.
void add_model_argument(CLI::App* cmd, std::string& model, const std::string& description,
                        std::string* text = nullptr, bool required = true);

// The text with the escapes \n, \t and \\ read as newline, tab and backslash (others stay as written).
std::string unescape(const std::string& s);

// The "Example:" lines at the end of a command's --help.
void set_examples(CLI::App* cmd, const std::string& lines);

}  // namespace q4t
