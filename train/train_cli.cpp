// The flags of `q4tune train` (CLI11; each flag is also a key of the --config TOML file) and the embedded demo.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>

#include "train/config_file.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/train.h"

namespace q4t {

std::string demo_config_path() { return cached_embedded_copy("demo.toml", "demo"); }

namespace {

// The options a config file may not set, and --print-config leaves out.
const std::vector<std::string> kNotInConfigFiles = {"config", "help", "print-config"};

}  // namespace

void add_data_format_options(CLI::App* cmd, data::DataFormat& f, const std::string& group) {
  cmd->add_option("--data-format", f.format,
                  "record shape of .jsonl/.json data: auto (per record, from its fields), text, completion "
                  "(prompt + completion), chat (messages), alpaca (instruction, input, output) or sharegpt "
                  "(conversations of from/value)")
      ->check(CLI::IsMember(data::data_format_names()))
      ->capture_default_str()->group(group);
  cmd->add_option("--text-field", f.text_field, "the record field holding text data")->capture_default_str()->group(group);
  cmd->add_option("--prompt-field", f.prompt_field, "the record field holding the prompt")
      ->capture_default_str()->group(group);
  cmd->add_option("--completion-field", f.completion_field, "the record field holding the completion")
      ->capture_default_str()->group(group);
  cmd->add_option("--messages-field", f.messages_field,
                  "the record field holding the conversation, for chat and sharegpt records (default: messages for "
                  "chat, conversations for sharegpt)")
      ->group(group);
}

namespace {

// --config and --print-config (no group: they head the list); returns --config.
CLI::Option* add_config_options(CLI::App* cmd, TrainOptions& o) {
  auto* config = cmd->add_option("--config", o.config,
                                 "TOML file of options: each key is a flag without its dashes (lora-rank = 8); flags "
                                 "given on the command line win. With neither --config nor --model, the embedded "
                                 "configs/demo.toml is used");
  cmd->add_flag("--print-config", o.print_config,
                "print every option as TOML (the command line over --config over the defaults; --config loads it "
                "back) and exit without reading the data or the model or using a device");
  return config;
}

void add_data_options(CLI::App* cmd, TrainOptions& o) {
  const char* g = "Data and model";
  cmd->add_option("-m,--model", o.model, "GGUF base model (frozen; quantized weights stay quantized), or builtin:demo-model")
      ->group(g);
  cmd->add_option("--data", o.data, "training data: .txt (one document), .jsonl (one record per line: text, "
                                    "prompt/completion, messages, alpaca or sharegpt) or .json (an array of such "
                                    "records), or builtin:demo-data.jsonl")
      ->group(g);
  cmd->add_option("--val-data", o.val_data, "validation data, read like --data")->group(g);
  cmd->add_option("--val-fraction", o.val_fraction, "hold out this fraction of --data for validation when there is no --val-data")
      ->capture_default_str()->group(g);
  cmd->add_option("-o,--out", o.out, "output directory: adapter.gguf, peft/, metrics.jsonl, loss.svg, checkpoints/")->group(g);
  cmd->add_option("-c,--seq-len", o.seq_len, "tokens per row (longer examples are truncated)")->capture_default_str()->group(g);
  cmd->add_flag("--pack", o.pack, "pack several examples into each row (attention stays inside each example)")->group(g);
  cmd->add_flag("--train-on-prompt", o.train_on_prompt, "count prompts and non-assistant turns in the loss too")->group(g);
  cmd->add_flag("--no-truncate", o.no_truncate, "an example longer than --seq-len is an error instead of being cut")->group(g);
  cmd->add_option("--chat-template", o.chat_template, "chat template for messages data (default: recognised from the model)")
      ->group(g);
  add_data_format_options(cmd, o.data_format, g);
}

void add_device_options(CLI::App* cmd, TrainOptions& o) {
  const char* g = "Device";
  cmd->add_option("--device", o.device, "auto (the best Vulkan GPU, else the CPU kernels; a CPU-emulated Vulkan device such as lavapipe only when named), cpu, vulkan or vulkan:N; under mpirun, auto and vulkan take the GPU of the rank's place on its machine")
      ->capture_default_str()->group(g);
  cmd->add_flag("--allow-shared-device", o.allow_shared_device,
                "under mpirun: let more ranks run on a machine than it has GPUs (they share them)")->group(g);
  cmd->add_option("--grad-bucket-mb", o.grad_bucket_mb,
                  "under mpirun: the ranks sum their gradients in parts of this many MB, on a GPU each part while the "
                  "backward goes on with the layers before it (0: all at once after the backward)")
      ->check(CLI::Range(0.0, 1048576.0))
      ->capture_default_str()->group(g);
  cmd->add_option("--threads", o.threads, "CPU worker threads (0: one per core, divided among the ranks on the machine)")->capture_default_str()->group(g);
  cmd->add_option("--precision", o.precision, kPrecisionHelp)
      ->check(CLI::IsMember({"auto", "mixed", "f32"}))
      ->capture_default_str()->group(g);
}

void add_lora_options(CLI::App* cmd, TrainOptions& o) {
  const char* g = "LoRA";
  cmd->add_option("--lora-rank", o.lora_rank, "rank r of every adapter")->check(CLI::Range(int64_t(1), int64_t(65536)))
      ->capture_default_str()->group(g);
  cmd->add_option("--lora-alpha", o.lora_alpha, "alpha: the adapter output is scaled by alpha/r (alpha/sqrt(r) with --rslora)")
      ->capture_default_str()->group(g);
  cmd->add_option("--lora-dropout", o.lora_dropout, "dropout on each adapter's input while training")
      ->capture_default_str()->group(g);
  cmd->add_option("--lora-targets", o.lora_targets, "comma-separated projections to adapt: q,k,v,o,gate,up,down (phi3's fused qkv and gate_up: q, k or v adapts qkv, gate or up gate_up)")
      ->delimiter(',')->capture_default_str()->group(g);
  cmd->add_flag("--rslora", o.rslora, "rank-stabilised scale alpha/sqrt(r)")->group(g);
  cmd->add_option("--lora-init", o.lora_init, "A's initialisation: kaiming (uniform, as PEFT) or gaussian (N(0, 1/r)); B starts at 0")
      ->capture_default_str()->group(g);
}

// AdamW and the learning-rate schedule.
void add_optimizer_options(CLI::App* cmd, TrainOptions& o) {
  const char* g = "Optimizer";
  cmd->add_option("--lr", o.lr, "peak learning rate (AdamW)")->capture_default_str()->group(g);
  cmd->add_option("--schedule", o.schedule, "constant, linear or cosine decay after the warmup")->capture_default_str()->group(g);
  cmd->add_option("--warmup-steps", o.warmup_steps, "linear warmup steps from 0")->capture_default_str()->group(g);
  cmd->add_option("--warmup-ratio", o.warmup_ratio, "warmup as a fraction of the steps (when --warmup-steps is 0)")
      ->capture_default_str()->group(g);
  cmd->add_option("--min-lr", o.min_lr, "where linear and cosine decay end")->capture_default_str()->group(g);
  cmd->add_option("--adam-beta1", o.adam_beta1, "AdamW beta1")->capture_default_str()->group(g);
  cmd->add_option("--adam-beta2", o.adam_beta2, "AdamW beta2")->capture_default_str()->group(g);
  cmd->add_option("--adam-eps", o.adam_eps, "AdamW epsilon")->capture_default_str()->group(g);
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")->capture_default_str()->group(g);
  cmd->add_option("--grad-clip", o.grad_clip, "clip the global gradient norm to this (0: no clipping)")
      ->capture_default_str()->group(g);
}

// What one step is and how many run, and what the step keeps in memory.
void add_step_options(CLI::App* cmd, TrainOptions& o) {
  const char* g = "Steps";
  cmd->add_option("--batch-size", o.batch_size, "rows per micro-batch (of each rank, under mpirun)")->capture_default_str()->group(g);
  cmd->add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step (the loss is the mean over all their "
                                                "counted tokens)")
      ->capture_default_str()->group(g);
  cmd->add_option("--steps", o.steps, "optimizer steps (0: from --epochs)")->capture_default_str()->group(g);
  cmd->add_option("--epochs", o.epochs, "passes over the training rows, when --steps is 0")->capture_default_str()->group(g);
  cmd->add_option("--seed", o.seed, "seed of the adapters' initialisation, the data order and the dropout masks")
      ->capture_default_str()->group(g);
  cmd->add_option("--vocab-tile", o.vocab_tile, "vocabulary rows per tile of the fused output projection + loss")
      ->capture_default_str()->group(g);
  cmd->add_flag("--grad-checkpoint", o.grad_checkpoint,
                "keep each layer's output, attention inputs and output and residual from the forward and compute "
                "the ffn's activations again in the backward (less memory, about half a forward more per step)")
      ->group(g);
  cmd->add_option("--keep-ffn-layers", o.keep_ffn_layers,
                  "with --grad-checkpoint: the last N layers keep their ffn gate and up outputs instead of computing "
                  "them again (faster; 8 bytes per token per ffn unit per layer more)")
      ->capture_default_str()->group(g);
}

const char* const kOutputGroup = "Evaluation, checkpoints and output";

// Evaluation, checkpoints, the log and --resume; returns --resume.
CLI::Option* add_checkpoint_options(CLI::App* cmd, TrainOptions& o) {
  const char* g = kOutputGroup;
  cmd->add_option("--eval-every", o.eval_every, "evaluate on the validation data every N steps (0: only at the end)")
      ->capture_default_str()->group(g);
  cmd->add_option("--eval-batches", o.eval_batches, "batches per evaluation (0: the whole validation set)")
      ->capture_default_str()->group(g);
  cmd->add_option("--save-every", o.save_every, "write a checkpoint every N steps (0: only at the end and on Ctrl-C)")
      ->capture_default_str()->group(g);
  cmd->add_option("--keep-checkpoints", o.keep_checkpoints, "keep the newest K checkpoints (0: all)")
      ->capture_default_str()->group(g);
  cmd->add_option("--log-every", o.log_every, "a plain log line every N steps when the output is not a terminal")
      ->capture_default_str()->group(g);
  cmd->add_option("--tensorboard", o.tensorboard,
                  "also write the metrics as TensorBoard event files into DIR (a new file per run, a resume "
                  "included): tensorboard --logdir DIR")
      ->type_name("DIR")->group(g);
  return cmd->add_option("--resume", o.resume_dir, "continue from the newest complete checkpoint under --out, or from DIR")
      ->expected(0, 1)->group(g);
}

// What the end of the run adds: the samples and the PEFT export's base model.
void add_end_of_run_options(CLI::App* cmd, TrainOptions& o) {
  const char* g = kOutputGroup;
  cmd->add_option("--sample-prompt", o.sample_prompts,
                  "after training, answer this prompt greedily with the base model and with the adapter (\\n and \\t "
                  "are read as newline and tab; give it again for more prompts; a list in the config file); a run on "
                  "conversations puts it in a user turn of their chat template")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(g);
  cmd->add_option("--sample-max-tokens", o.sample_tokens, "new tokens of the sample at most")->capture_default_str()->group(g);
  cmd->add_option("--hf-base-model", o.hf_base_model,
                  "the PEFT export's base_model_name_or_path: the Hugging Face id of the base model (default: the "
                  "model file's general.source.* or general.base_model.* repository, else its general.name)")
      ->group(g);
}

}  // namespace

void add_train_options(CLI::App* cmd, TrainOptions& o) {
  // CLI11 reads config files for the top-level app only, so the subcommand applies its own (see the callback).
  auto* config = add_config_options(cmd, o);
  add_data_options(cmd, o);
  add_device_options(cmd, o);
  add_lora_options(cmd, o);
  add_optimizer_options(cmd, o);
  add_step_options(cmd, o);
  auto* resume = add_checkpoint_options(cmd, o);
  add_end_of_run_options(cmd, o);
  cmd->callback([cmd, &o, resume, config] {
    if (config->count() > 0) apply_config_file(cmd, o.config, kNotInConfigFiles);
    if (o.print_config) o.effective_config = options_as_toml(cmd, kNotInConfigFiles);
    o.resume = resume->count() > 0;
    for (std::string& p : o.sample_prompts) p = unescape(p);
  });
}

Command add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand("train",
                                 "Train LoRA adapters on a frozen GGUF model; writes adapter.gguf, peft/, metrics.jsonl, "
                                 "loss.svg and checkpoints/ under --out. With no --model and no --config, runs the "
                                 "embedded demo (configs/demo.toml)");
  add_train_options(cmd, *o);
  set_examples(cmd, "  q4tune train                                   (the embedded demo)\n"
                    "  q4tune train -m model.gguf --data chats.jsonl -o my-run --lora-rank 16 --steps 500\n"
                    "  q4tune train --config configs/tiny.toml --data my.jsonl\n"
                    "  q4tune train --config my-run.toml --resume");
  return {cmd, [o] { return run_train(*o, std::cout); }};
}

}  // namespace q4t
