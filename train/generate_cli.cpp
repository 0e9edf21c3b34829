// The `q4tune generate` subcommand's options (apart from generate.cpp, which does not need CLI11).
#include <CLI/CLI.hpp>

#include "train/generate.h"

namespace q4t {

CLI::App* add_generate_command(CLI::App& app, GenerateOptions& opt) {
  auto* cmd = app.add_subcommand("generate",
                                 "Continue a prompt with the model (and a LoRA adapter), printing the text as it comes");
  cmd->add_option("MODEL", opt.model, "GGUF model")->required();
  cmd->add_option("--prompt", opt.prompt, "the text to continue")->required();
  cmd->add_option("--adapter", opt.adapter, "GGUF LoRA adapter to apply");
  cmd->add_option("--adapter-scale", opt.adapter_scale, "scale of the adapter")->capture_default_str();
  cmd->add_option("--max-tokens", opt.sample.max_tokens, "new tokens at most")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--temperature", opt.sample.temperature, "sampling temperature; 0: greedy (always the likeliest token)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-k", opt.sample.top_k, "sample among the k likeliest tokens; 0: all")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-p", opt.sample.top_p,
                  "then among the fewest likeliest tokens whose probability reaches p (nucleus); 1: all")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--seed", opt.sample.seed, "random seed of the sampler")->capture_default_str();
  cmd->add_option("--ctx", opt.ctx, "context length (prompt + generated tokens); 0: the model's")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--device", opt.device,
                  "auto (the best Vulkan GPU, else the CPU kernels; a CPU-emulated Vulkan device such as lavapipe only when named), cpu, vulkan (best Vulkan device), or vulkan:N "
                  "(see `q4tune devices`)")
      ->capture_default_str();
  cmd->add_option("--threads", opt.threads, "CPU worker threads (0: one per core)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--precision", opt.precision,
                  "auto (mixed where the device has cooperative matrices, f32 elsewhere), mixed (f16 inputs with f32 "
                  "sums for the prompt's products of 32 tokens or more) or f32")
      ->check(CLI::IsMember({"auto", "mixed", "f32"}))
      ->capture_default_str();
  return cmd;
}

}  // namespace q4t
