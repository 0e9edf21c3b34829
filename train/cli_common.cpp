#include "train/cli_common.h"

#include <CLI/CLI.hpp>
#include <memory>

#include "kernels/cpu/threads.h"
#include "train/device_choice.h"

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

const char* const kPrecisionHelp =
    "auto (mixed where the device has cooperative matrices, f32 elsewhere), mixed or f32. Mixed on a GPU: the "
    "products of 32 tokens or more take f16 inputs with f32 sums (norms, softmax, the loss, the adapters and AdamW "
    "stay f32); on the CPU: the frozen products of fewer than 12 tokens (generation) round their inputs to 8-bit "
    "blocks as llama.cpp does and sum in integers";

std::shared_ptr<DeviceFlags> add_device_flags(CLI::App* cmd, bool with_precision) {
  auto f = std::make_shared<DeviceFlags>();
  cmd->add_option("--device", f->device,
                  "auto (the best Vulkan GPU, else the CPU kernels; a CPU-emulated Vulkan device such as lavapipe only when named), cpu, vulkan (best Vulkan device), or vulkan:N "
                  "(see `q4tune devices`)")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU worker threads (0: one per core)")->check(CLI::NonNegativeNumber);
  if (!with_precision) return f;
  f->precision = "auto";
  cmd->add_option("--precision", f->precision, kPrecisionHelp)
      ->check(CLI::IsMember({"auto", "mixed", "f32"}))
      ->capture_default_str();
  return f;
}

DeviceChoice DeviceFlags::open() const {
  cpu::set_num_threads(rank_threads(threads));
  DeviceChoice dev = choose_rank_device(device, allow_shared_device);
  if (!precision.empty()) dev.set_precision(precision);
  return dev;
}

}  // namespace q4t
