// The `q4tune generate` subcommand's options (apart from generate.cpp, which does not need CLI11).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "data/chat_template.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/generate.h"

namespace q4t {

Command add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  GenerateOptions& opt = *o;
  auto* cmd = app.add_subcommand("generate",
                                 "Continue a prompt with the model (and a LoRA adapter), printing the text as it comes; "
                                 "or chat with it (--chat)");
  add_model_argument(cmd, opt.model, "GGUF model", nullptr, /*required=*/false);
  cmd->add_option("-p,--prompt", opt.prompt,
                  "the text to continue (\\n and \\t are read as newline and tab); with --chat, the user's message (without it, --chat reads one message per "
                  "line from the input and keeps the conversation)");
  cmd->add_option("--run", opt.run,
                  "a training run's --out directory (or one of its checkpoints): its model, chat template and newest "
                  "complete checkpoint's adapters");
  cmd->add_option("--adapter,--lora", opt.adapter, "GGUF LoRA adapter to apply");
  cmd->add_option("--adapter-scale", opt.adapter_scale, "scale of the adapter")->capture_default_str();
  cmd->add_flag("--chat", opt.chat,
                "apply the chat template (--chat-template, else the adapter's or run's, else the model's) and print "
                "only the assistant's reply");
  cmd->add_option("--system", opt.system, "with --chat: a system message first");
  cmd->add_option("--chat-template", opt.chat_template, "with --chat: " + chat::known_template_names());
  cmd->add_option("-n,--max-tokens", opt.sample.max_tokens, "new tokens at most (per reply with --chat)")
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
  cmd->add_option("-c,--seq-len", opt.seq_len, "context length (prompt + generated tokens); 0: the model's")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--device", opt.device,
                  "auto (the best Vulkan GPU, else the CPU kernels; a CPU-emulated Vulkan device such as lavapipe only when named), cpu, vulkan (best Vulkan device), or vulkan:N "
                  "(see `q4tune devices`)")
      ->capture_default_str();
  cmd->add_option("--threads", opt.threads, "CPU worker threads (0: one per core)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--precision", opt.precision, kPrecisionHelp)
      ->check(CLI::IsMember({"auto", "mixed", "f32"}))
      ->capture_default_str();
  cmd->final_callback([&opt] {
    opt.prompt = unescape(opt.prompt);
    opt.system = unescape(opt.system);
  });
  set_examples(cmd,
               "  q4tune generate -m model.gguf -p \"Once upon a time\" -n 64\n"
               "  q4tune generate --run my-run --chat -p \"What is LoRA?\"      (the run's model, template, adapter)\n"
               "  q4tune generate -m model.gguf --lora my-run/adapter.gguf --chat --system \"Be brief.\"   (interactive)");
  return {cmd, [o] { return run_generate(*o, std::cout); }};
}

}  // namespace q4t
