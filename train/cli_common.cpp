#include "train/cli_common.h"

#include <CLI/CLI.hpp>
#include <memory>

namespace q4t {

void add_model_argument(CLI::App* cmd, std::string& model, const std::string& description, std::string* text,
                        bool required) {
  auto positional = std::make_shared<std::string>();
  CLI::Option* pos = cmd->add_option("MODEL", *positional, description + " (or -m)");
  CLI::Option* flag = cmd->add_option("-m,--model", model, description);
  cmd->parse_complete_callback([&model, positional, pos, flag, text, required] {
    if (pos->count() > 0 && flag->count() > 0) {
      if (text && text->empty()) {
        *text = *positional;
        return;
      }
      throw CLI::ValidationError("the model is given twice: as MODEL ('" + *positional + "') and as -m/--model ('" +
                                 model + "')");
    }
    if (pos->count() > 0) model = *positional;
    if (required && model.empty()) throw CLI::RequiredError("a model: -m/--model FILE.gguf (or MODEL)");
  });
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = i + 1 < s.size() && s[i] == '\\' ? s[i + 1] : 0;
    if (c == 'n' || c == 't' || c == '\\') {
      out += c == 'n' ? '\n' : c == 't' ? '\t' : '\\';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

void set_examples(CLI::App* cmd, const std::string& lines) { cmd->footer("\nExample:\n" + lines); }

}  // namespace q4t
