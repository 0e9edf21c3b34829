// q4tune: LoRA fine-tuning of quantized GGUF models on Vulkan GPUs or the CPU. Entry point and CLI.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "kernels/cpu/threads.h"
#include "kernels/shapes.h"
#include "kernels/vulkan/device.h"
#include "train/commands.h"
#include "train/device_choice.h"
#include "train/cli_common.h"
#include "train/generate.h"
#include "train/suggest.h"
#include "train/train.h"

using q4t::did_you_mean;

namespace {

struct DeviceFlags {
  std::string device = "auto";
  std::string precision;  // "" where the command has no --precision
  int threads = 0;
  // --precision, for the commands that run a model (train has its own: train_cli.cpp).
  void add_precision(CLI::App* app) {
    precision = "auto";
    app->add_option("--precision", precision,
                    "auto (mixed where the device has cooperative matrices, f32 elsewhere), mixed (f16 inputs with f32 "
                    "sums for the products of 32 tokens or more) or f32")
        ->check(CLI::IsMember({"auto", "mixed", "f32"}))
        ->capture_default_str();
  }
  void add(CLI::App* app) {
    app->add_option("--device", device,
                    "auto (the best Vulkan GPU, else the CPU kernels; a CPU-emulated Vulkan device such as lavapipe only when named), cpu, vulkan (best Vulkan device), or vulkan:N "
                    "(see `q4tune devices`)")
        ->capture_default_str();
    app->add_option("--threads", threads, "CPU worker threads (0: one per core)")->check(CLI::NonNegativeNumber);
  }
  q4t::DeviceChoice open() const {
    q4t::cpu::set_num_threads(threads);
    q4t::DeviceChoice dev = q4t::choose_device(device);
    if (!precision.empty()) dev.set_precision(precision);
    return dev;
  }
};

int list_devices() {
  const auto devs = q4t::vk::Device::list();
  std::cout << "cpu          the CPU kernels (" << q4t::cpu::num_threads() << " threads; f32)\n";
  if (devs.empty()) std::cout << "(no Vulkan devices)\n";
  for (const auto& d : devs)
    std::cout << "vulkan:" << d.index << "     " << d.name << " (" << d.type << ", Vulkan "
              << VK_API_VERSION_MAJOR(d.api_version) << "." << VK_API_VERSION_MINOR(d.api_version) << "; "
              << (d.coop_matrix ? "tensor cores: --precision auto is mixed" : "no tensor cores: --precision auto is f32")
              << ")\n";
  return 0;
}

// `q4tune train` with neither --config nor --model runs the embedded configs/demo.toml.
std::vector<std::string> with_demo_config(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2 || args[1] != "train") return args;
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return args;
    if (a == "-m" || a.rfind("-m=", 0) == 0) return args;
    for (const char* name : {"--config", "--model"})
      if (a == name || a.rfind(std::string(name) + "=", 0) == 0) return args;
  }
  args.push_back("--config");
  args.push_back(q4t::demo_config_path());
  return args;
}

std::vector<CLI::App*> subcommands_of(CLI::App& app) {
  return app.get_subcommands([](CLI::App*) { return true; });
}

std::vector<std::string> names_of(const std::vector<CLI::App*>& apps) {
  std::vector<std::string> n;
  for (const CLI::App* a : apps) n.push_back(a->get_name());
  return n;
}

// The deepest subcommand the parse reached (app itself when none), and its words ("bench train") in *path.
CLI::App* parsed_command(CLI::App& app, std::string* path) {
  for (CLI::App* sub : subcommands_of(app))
    if (sub->parsed()) {
      *path += (path->empty() ? "" : " ") + sub->get_name();
      return parsed_command(*sub, path);
    }
  return &app;
}

// The first argument after the command's own name that names no option of it: "--lr=1" is checked as "--lr".
std::string first_unknown_option(CLI::App& cmd, const std::vector<std::string>& args,
                                 std::vector<std::string>* option_names) {
  for (const CLI::Option* o : cmd.get_options()) {
    for (const std::string& l : o->get_lnames()) option_names->push_back("--" + l);
    for (const std::string& sn : o->get_snames()) option_names->push_back("-" + sn);
  }
  for (const std::string& a : args) {
    if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9') || a[1] == '.') continue;  // not negative numbers
    const std::string name = a.substr(0, a.find('='));
    if (std::find(option_names->begin(), option_names->end(), name) == option_names->end()) return name;
  }
  return "";
}

constexpr int kUsageError = 2;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"q4tune: fine-tune LoRA adapters for quantized GGUF models on any Vulkan GPU or the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "q4tune 0.1.0");

  auto* devices = app.add_subcommand("devices", "List the devices --device can name");
  q4t::set_examples(devices, "  q4tune devices");

  DeviceFlags selftest_dev;
  auto* selftest = app.add_subcommand("selftest",
                                      "Check every kernel on a device against a double-precision reference; "
                                      "exits non-zero on any failure");
  selftest_dev.add(selftest);
  q4t::set_examples(selftest, "  q4tune selftest --device vulkan");

  DeviceFlags gradcheck_dev;
  auto* gradcheck = app.add_subcommand("gradcheck",
                                       "Check every autograd op's gradients against finite differences (double) "
                                       "and the f32 CPU and Vulkan device against the double-precision CPU");
  gradcheck_dev.add(gradcheck);
  gradcheck_dev.precision = "f32";
  gradcheck->add_option("--precision", gradcheck_dev.precision,
                        "f32 (the checks against double precision), or mixed: also every case's forward and "
                        "gradients in mixed precision against f32 on the device, within the case's stated bound")
      ->check(CLI::IsMember({"f32", "mixed"}))
      ->capture_default_str();
  q4t::set_examples(gradcheck, "  q4tune gradcheck --device cpu");

  std::string info_path;
  auto* info = app.add_subcommand("info", "Print a GGUF file's metadata and tensors, and which tensor types q4tune supports");
  q4t::add_model_argument(info, info_path, "GGUF file (a model or an adapter)");
  q4t::set_examples(info, "  q4tune info -m model.gguf");

  q4t::InitModelOptions init_opt;
  auto* init_model = app.add_subcommand("init-model",
                                        "Write a small random-initialised GGUF of a supported architecture (byte-level vocabulary)");
  init_model->add_option("-o,--out", init_opt.out, "output GGUF file")->required();
  init_model->add_option("--arch", init_opt.arch, "llama, qwen2, qwen3, gemma2, gemma3 or phi3")->capture_default_str();
  init_model->add_option("--type", init_opt.type, "weight types: f32 or a format (every matrix: " + q4t::format_list() + "), or a mix as llama-quantize writes it (q2_k, q3_k_m, q4_k_m, q5_k_s, q5_k_m: the output matrix Q6_K, attn_v/ffn_down/attn_output as llama-quantize picks them; rows that are not whole super-blocks fall back as it does)")->capture_default_str();
  init_model->add_option("--dim", init_opt.dim, "embedding length")->capture_default_str();
  init_model->add_option("--layers", init_opt.layers, "number of transformer blocks")->capture_default_str();
  init_model->add_option("--heads", init_opt.heads, "attention heads")->capture_default_str();
  init_model->add_option("--kv-heads", init_opt.kv_heads, "key/value heads (grouped-query attention)")->capture_default_str();
  init_model->add_option("--ff", init_opt.ff, "feed-forward length")->capture_default_str();
  init_model->add_option("--context-length", init_opt.ctx, "the model's context length")->capture_default_str();
  init_model->add_option("--head-dim", init_opt.head_dim, "head size (attention.key_length; default dim / heads)");
  init_model->add_option("--rope-dims", init_opt.rope_dims, "rotated dims of a head (rope.dimension_count; default all; fewer: partial rotary as phi-4-mini, for phi3 and gemma)");
  init_model->add_option("--rope-base", init_opt.rope_base, "RoPE frequency base")->capture_default_str();
  init_model->add_flag("--rope-freqs", init_opt.rope_freqs, "llama: add a rope_freqs.weight of llama 3.1's per-pair factors (factor 8, original context --context-length)");
  init_model->add_option("--rope-scaling", init_opt.rope_scaling, "RoPE context scaling linear:FACTOR or yarn:FACTOR (original context --context-length)");
  init_model->add_option("--sliding-window", init_opt.sliding_window, "gemma: the local layers' attention window (0: the architecture's default; gemma3: no local layers)")->capture_default_str();
  init_model->add_option("--swa-pattern", init_opt.swa_pattern, "gemma: every N-th layer is global, the others local (default gemma2 2, gemma3 6)");
  init_model->add_option("--attn-softcap", init_opt.attn_softcap, "gemma2: attention-logit soft-cap (default 50)");
  init_model->add_option("--final-softcap", init_opt.final_softcap, "gemma: final-logit soft-cap (default gemma2 30, gemma3 none)");
  init_model->add_option("--longrope", init_opt.longrope, "phi3: LongRoPE factors (rope_factors_short/long) for this original context (longer contexts take the long ones)");
  init_model->add_flag("--tied", init_opt.tied, "no output.weight: token_embd is the output matrix");
  init_model->add_option("--seed", init_opt.seed, "random seed")->capture_default_str();
  q4t::set_examples(init_model, "  q4tune init-model -o tiny.gguf --dim 256 --layers 4 --heads 8 --kv-heads 4 --ff 704 --type q4_k_m");

  std::string quant_in, quant_out, quant_type = "q4_0";
  auto* quantize = app.add_subcommand("quantize", "Convert the 2-D F32/F16 weights of a GGUF as llama-quantize would (other tensors are copied)");
  q4t::add_model_argument(quantize, quant_in, "input GGUF");
  auto* quant_out_pos = quantize->add_option("OUT", quant_out, "output GGUF (or -o)");
  quantize->add_option("-o,--out", quant_out, "output GGUF")->excludes(quant_out_pos);
  quantize->add_option("--type", quant_type, "a llama-quantize file type, with its choice of type per matrix (the output matrix Q6_K but in q8_0 and bf16; attn_v, ffn_down and attn_output per mix): q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k_m, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs, bf16, or another format for every matrix; rows that are not whole super-blocks fall back as llama-quantize does (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K/Q3_K to Q4_0, IQ4_XS to IQ4_NL), rows that are not whole blocks stay F32")->capture_default_str();
  q4t::set_examples(quantize, "  q4tune quantize -m model-f16.gguf -o model-q4_k_m.gguf --type q4_k_m");

  q4t::MergeOptions merge_opt;
  auto* merge = app.add_subcommand("merge",
                                   "Fold LoRA adapters into their base model and write one GGUF that llama.cpp runs as "
                                   "it is: W' = dequant(W) + scale·B·A for each adapted weight, quantized again");
  merge->add_option("-m,--model", merge_opt.model, "the base GGUF model")->required();
  merge->add_option("--adapter,--lora", merge_opt.adapters,
                    "a GGUF LoRA adapter, a training run's --out directory (its newest complete checkpoint) or a "
                    "checkpoint; give it again to merge several")
      ->required()
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  merge->add_option("--adapter-scale", merge_opt.scales, "the scale of each adapter, in the order of --adapter (default 1)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  merge->add_option("-o,--out", merge_opt.out, "the merged GGUF (written whole or not at all)")->required();
  merge->add_option("--type", merge_opt.type,
                    "same (each tensor keeps its type), or a llama-quantize file type or format for every matrix: " +
                        std::string("f32, f16, bf16, q4_k_m, q8_0, ... (as quantize --type)"))
      ->capture_default_str();
  q4t::set_examples(merge, "  q4tune merge -m model-q4_k_m.gguf --lora my-run/adapter.gguf -o merged-q4_k_m.gguf\n"
                           "  q4tune merge -m model.gguf --lora my-run --type f16 -o merged-f16.gguf    (the run's newest checkpoint)");

  DeviceFlags logits_dev;
  q4t::LogitsOptions logits_opt;
  auto* logits = app.add_subcommand("logits", "Run the model on token ids and write the logits at every position as JSON");
  logits_dev.add(logits);
  logits_dev.add_precision(logits);
  q4t::add_model_argument(logits, logits_opt.model, "GGUF model");
  auto* ids_opt = logits->add_option("--ids", logits_opt.ids, "comma-separated token ids")->delimiter(',');
  logits->add_option("--ids-file", logits_opt.ids_file, "JSON array of token ids")->excludes(ids_opt);
  logits->add_option("--adapter,--lora", logits_opt.adapter, "GGUF LoRA adapter to apply");
  logits->add_option("--adapter-scale", logits_opt.adapter_scale, "scale of the adapter")->capture_default_str();
  logits->add_flag("--llama-cpp-numerics", logits_opt.llama_cpp_numerics,
                   "round the input of each quantized matrix to 8-bit blocks as llama.cpp's CPU matmuls do (Q8_0 or Q8_K, "
                   "by the format's vec_dot_type; F16 and BF16 inputs are not rounded): the logits then agree with "
                   "llama.cpp's to about 1e-6 of their largest, until an activation lies within float rounding of an "
                   "8-bit step, which the two may then round to neighbouring steps; gemma's GELU, which llama.cpp "
                   "looks up in an f16 table, is computed exactly, so gemma models agree to about 1e-2 (the default "
                   "keeps f32 activations, as training does)");
  logits->add_option("-o,--out", logits_opt.out, "write {\"logits\": [[...], ...]} here instead of stdout");
  q4t::set_examples(logits, "  q4tune logits -m model.gguf --ids 1,15043,3186 -o logits.json");

  q4t::TokenizeOptions tok_opt;
  auto* tokenize = app.add_subcommand("tokenize", "Print the token ids of a text with the model's tokenizer");
  q4t::add_model_argument(tokenize, tok_opt.model, "GGUF model", &tok_opt.text);
  auto* tok_text = tokenize->add_option("TEXT", tok_opt.text, "text to tokenize");
  auto* tok_file = tokenize->add_option("--file", tok_opt.file, "tokenize this file's contents")->excludes(tok_text);
  tokenize->add_option("--json-in", tok_opt.json_in, "JSON array of strings: write a JSON array of id arrays")
      ->excludes(tok_text)
      ->excludes(tok_file);
  tokenize->add_option("-o,--out", tok_opt.out, "with --json-in: write here instead of stdout");
  tokenize->add_flag("--decode", tok_opt.decode, "also print the text the ids decode to");
  tokenize->add_flag("--parse-special", tok_opt.parse_special, "recognise control tokens (\"<s>\", ...) written in the text");
  tokenize->add_flag("--add-special", tok_opt.add_special, "add BOS/EOS as the model's add_bos_token/add_eos_token say");
  q4t::set_examples(tokenize, "  q4tune tokenize -m model.gguf \"Hello world\" --decode");

  DeviceFlags bench_dev;
  q4t::BenchOptions bench_opt;
  auto* bench = app.add_subcommand("bench",
                                   "Benchmark the copy roofline and the Q4_0 kernels (GEMV, GEMM at --tokens, dx at "
                                   "T=1 and at --tokens) on model-sized shapes");
  bench_dev.add(bench);
  bench->add_option("--kernels", bench_opt.kernels, "comma-separated subset of copy,q4_0_gemv,q4_0_gemm,q4_0_dx (the default set) and "
                    "<format>_gemv, <format>_gemm, <format>_dx for every other format (" + q4t::format_list() + "); "
                    "f16_coop_gemm (the plain f16 tensor-core GEMM: the ceiling each product at --tokens is compared "
                    "with); lora_hs, lora_y, lora_dh, lora_db, lora_da, lora_dxa (a rank-16 adapter's products); <format>_mixed_gemm, <format>_mixed_dx (each tile decoded in the GEMM) and "
                    "<format>_decoded_gemm, <format>_decoded_dx (W decoded to f16 first), f16_coop_gemm and the "
                    "<format>_mixed_* kernels with a tile suffix " + q4t::mixed_tile_suffixes() + " (Vulkan only)")
      ->delimiter(',');
  bench->add_option_function<std::string>(
            "--precision", [&](const std::string& v) { bench_opt.precision = q4t::parse_precision(v, "--precision"); },
            "f32 or mixed: the numerics of the gemm and dx kernels at --tokens (default f32)");
  bench->add_option("--shapes", bench_opt.shapes,
                    "comma-separated N_OUTxN_IN shapes (default 4096x4096,4096x14336,14336x4096,16384x16384)")
      ->delimiter(',');
  bench->add_option("--json", bench_opt.json_path, "also write the results as a JSON array to this file");
  bench->add_option("--tokens", bench_opt.tokens, "tokens (T) of the GEMM and dx cases")->capture_default_str();
  bench->add_option("--seconds", bench_opt.seconds_per_case, "time budget per case")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();
  q4t::set_examples(bench, "  q4tune bench --kernels copy,q4_k_gemv,q4_k_gemm --shapes 4096x4096 --precision mixed");
  DeviceFlags bench_train_dev;
  q4t::BenchTrainOptions bt_opt;
  auto* bench_train = bench->add_subcommand(
      "train",
      "Time full LoRA training steps (forward, backward, clip, AdamW) on a random model of a named shape made in "
      "memory (Q4_0 weights unless --type says otherwise): tokens/s and peak memory per batch size");
  bench_train_dev.add(bench_train);
  bench_train_dev.add_precision(bench_train);
  bench_train->add_option("--type", bt_opt.type,
                          "the random model's weights: q4_0, q8_0 or f16 (every matrix), or q4_k_m (llama-quantize's "
                          "Q4_K_M mix: Q4_K, with Q6_K for the output matrix and attn_v/ffn_down of some layers)")
      ->check(CLI::IsMember({"q4_0", "q4_k_m", "q8_0", "f16"}))
      ->capture_default_str();
  bench_train->add_option("--shape", bt_opt.shape, "small (dim 512, 8 layers), tinyllama-1.1b or llama-7b")
      ->capture_default_str();
  bench_train->add_option("--seq-len", bt_opt.seq_len, "tokens per row")->capture_default_str();
  bench_train->add_option("--batch-sizes", bt_opt.batch_sizes, "comma-separated batch sizes, each timed on its own (default 1,4)")
      ->delimiter(',');
  bench_train->add_option("--steps", bt_opt.steps, "timed steps per batch size")->capture_default_str();
  bench_train->add_option("--warmup", bt_opt.warmup, "untimed steps before them")->capture_default_str();
  bench_train->add_option("--lora-rank", bt_opt.lora_rank, "LoRA rank on all seven targets (alpha = 2 * rank)")
      ->capture_default_str();
  bench_train->add_flag("--profile", bt_opt.profile,
                        "Vulkan: also print the GPU time per op (forward and backward) of the timed steps");
  bench_train->add_flag("--grad-checkpoint", bt_opt.grad_checkpoint,
                        "keep each layer's output, attention inputs and output and residual from the forward and "
                        "recompute the ffn's activations in the backward");
  bench_train->add_option("--keep-ffn-layers", bt_opt.keep_ffn_layers,
                          "with --grad-checkpoint: the last N layers keep their ffn gate and up outputs instead of "
                          "recomputing them")
      ->capture_default_str();
  bench_train->add_option("--json", bt_opt.json_path, "also write the results as a JSON array to this file");
  q4t::set_examples(bench_train, "  q4tune bench train --shape tinyllama-1.1b --type q4_k_m --batch-sizes 1,4 --grad-checkpoint");

  q4t::TrainOptions train_opt;
  auto* train = app.add_subcommand("train",
                                   "Train LoRA adapters on a frozen GGUF model; writes adapter.gguf, peft/, metrics.jsonl, "
                                   "loss.svg and checkpoints/ under --out. With no --model and no --config, runs the "
                                   "embedded demo (configs/demo.toml)");
  q4t::add_train_options(train, train_opt);
  q4t::set_examples(train, "  q4tune train                                   (the embedded demo)\n"
                           "  q4tune train -m model.gguf --data chats.jsonl -o my-run --lora-rank 16 --steps 500\n"
                           "  q4tune train --config configs/tiny.toml --data my.jsonl\n"
                           "  q4tune train --config my-run.toml --resume");

  DeviceFlags eval_dev;
  q4t::EvalOptions eval_opt;
  auto* eval = app.add_subcommand("eval", "Loss and perplexity of a model, with or without an adapter, on a dataset");
  eval_dev.add(eval);
  eval_dev.add_precision(eval);
  q4t::add_model_argument(eval, eval_opt.model, "GGUF base model", nullptr, /*required=*/false);
  eval->add_option("--run", eval_opt.run,
                   "a training run's --out directory (or one of its checkpoints): its model, chat template, seq-len "
                   "and newest complete checkpoint's adapters, for what is not given");
  eval->add_option("--data", eval_opt.data, "data: .txt, .jsonl or .json, read as by train")->required();
  eval->add_option("--adapter,--lora", eval_opt.adapter, "GGUF LoRA adapter to apply");
  eval->add_option("--adapter-scale", eval_opt.adapter_scale, "scale of the adapter")->capture_default_str();
  eval->add_option("-c,--seq-len", eval_opt.seq_len, "tokens per row (default: the run's, else 512)");
  eval->add_option("--batch-size", eval_opt.batch_size, "rows per forward pass")->capture_default_str();
  eval->add_option("--eval-batches", eval_opt.eval_batches, "stop after this many batches (0: all)")->capture_default_str();
  eval->add_flag("--pack", eval_opt.pack, "pack several examples into each row");
  eval->add_flag("--train-on-prompt", eval_opt.train_on_prompt, "count prompts and non-assistant turns too");
  eval->add_option("--chat-template", eval_opt.chat_template, "chat template for messages data");
  q4t::add_data_format_options(eval, eval_opt.data_format, "Options");
  q4t::set_examples(eval, "  q4tune eval -m model.gguf --data val.jsonl --lora my-run/adapter.gguf\n"
                          "  q4tune eval --run my-run --data val.jsonl      (the run's model, seq-len and newest adapters)");

  q4t::ExportOptions export_opt;
  auto* exp = app.add_subcommand("export", "Write a checkpoint's adapters as a GGUF LoRA (llama.cpp --lora) or a PEFT folder");
  auto* exp_ckpt = exp->add_option("CHECKPOINT", export_opt.checkpoint,
                                   "a training run's --out directory (its newest complete checkpoint) or a checkpoint "
                                   "(OUT/checkpoints/step-N)");
  exp->add_option("--run", export_opt.checkpoint, "the same as CHECKPOINT")->excludes(exp_ckpt);
  exp->add_option("--format", export_opt.format, "gguf or peft")->capture_default_str();
  exp->add_option("-o,--out", export_opt.out,
                  "output file (gguf) or directory (peft); default CHECKPOINT/adapter.gguf or CHECKPOINT/peft");
  exp->add_option("-m,--model", export_opt.model, "the base model, when it has moved since training");
  exp->add_option("--hf-base-model", export_opt.hf_base_model,
                  "peft: base_model_name_or_path, the Hugging Face id of the base model (default: the model file's "
                  "general.source.* or general.base_model.* repository, else its general.name)");
  q4t::set_examples(exp, "  q4tune export my-run --format peft -o my-adapter-peft\n"
                         "  q4tune export my-run/checkpoints/step-200 -o step200.gguf");

  q4t::GenerateOptions gen_opt;
  auto* gen = q4t::add_generate_command(app, gen_opt);

  std::vector<std::string> help_topic;
  auto* help_cmd = app.add_subcommand("help", "Show the commands, or a command's options: q4tune help [COMMAND]");
  help_cmd->add_option("COMMAND", help_topic, "a command (bench train: the training benchmark)");
  q4t::set_examples(help_cmd, "  q4tune help train");

  std::vector<std::string> args = with_demo_config(argc, argv);
  args.erase(args.begin());  // the program name
  if (args.empty()) {  // no command: what there is to run
    std::cout << app.get_formatter()->make_help(&app, "q4tune", CLI::AppFormatMode::Normal);
    return 0;
  }
  // A first word that is no command is a typo far more often than anything else: say which command was meant.
  const std::vector<std::string> commands = names_of(subcommands_of(app));
  if (args[0][0] != '-' && std::find(commands.begin(), commands.end(), args[0]) == commands.end()) {
    std::cerr << "q4tune: error: unknown command '" << args[0] << "'" << did_you_mean(args[0], commands)
              << "; q4tune help lists the commands\n";
    return kUsageError;
  }
  const std::vector<std::string> in_order = args;
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string path;
    CLI::App* cmd = parsed_command(app, &path);
    const std::string where = cmd == &app ? "q4tune" : "q4tune " + path;
    const std::string what = cmd == &app ? "" : path + ": ";
    std::vector<std::string> option_names;
    const std::string unknown = first_unknown_option(*cmd, in_order, &option_names);
    if (dynamic_cast<const CLI::ExtrasError*>(&e) && !unknown.empty())
      std::cerr << "q4tune: error: " << where << " has no option '" << unknown << "'"
                << did_you_mean(unknown, option_names) << "; q4tune help"
                << (cmd == &app ? std::string() : " " + path) << " lists them\n";
    else if (cmd == &app && !unknown.empty())
      std::cerr << "q4tune: error: unknown option '" << unknown << "'; q4tune help lists the commands\n";
    else
      std::cerr << "q4tune: error: " << what << e.what() << "\n";
    return kUsageError;
  }
  if (*help_cmd) {
    CLI::App* topic = &app;
    std::string usage = "q4tune";
    for (const std::string& word : help_topic) {
      const std::vector<CLI::App*> subs = subcommands_of(*topic);
      auto it = std::find_if(subs.begin(), subs.end(), [&](CLI::App* a) { return a->get_name() == word; });
      if (it == subs.end()) {
        std::cerr << "q4tune: error: help: unknown command '" << word << "'" << did_you_mean(word, names_of(subs))
                  << "\n";
        return kUsageError;
      }
      topic = *it;
      usage += " " + word;
    }
    // The formatter itself: App::help() would describe the help command, the one parsed.
    std::cout << topic->get_formatter()->make_help(topic, usage, CLI::AppFormatMode::Normal);
    return 0;
  }
  try {
    if (*train) return q4t::run_train(train_opt, std::cout);
    if (*eval) return q4t::run_eval(eval_opt, eval_dev.open(), std::cout);
    if (*exp) return q4t::run_export(export_opt, std::cout);
    if (*gen) return q4t::run_generate(gen_opt, std::cout);
    if (*devices) return list_devices();
    if (*selftest) return q4t::run_selftest(selftest_dev.open(), std::cout);
    if (*gradcheck) return q4t::run_gradcheck_cmd(gradcheck_dev.open(), std::cout);
    if (*info) return q4t::run_info(info_path, std::cout);
    if (*init_model) return q4t::run_init_model(init_opt, std::cout);
    if (*quantize) return q4t::run_quantize(quant_in, quant_out, quant_type, std::cout);
    if (*merge) return q4t::run_merge(merge_opt, std::cout);
    if (*logits) return q4t::run_logits(logits_opt, logits_dev.open(), std::cout);
    if (*tokenize) return q4t::run_tokenize(tok_opt, std::cout);
    if (*bench_train) {
      if (!bench_opt.kernels.empty() || !bench_opt.shapes.empty() || !bench_opt.json_path.empty())
        throw std::invalid_argument("bench train: give its options after `train` (--kernels and --shapes belong to the kernel bench)");
      return q4t::run_bench_train(bench_train_dev.open(), bt_opt, std::cout);
    }
    if (*bench) return q4t::run_bench(bench_dev.open(), bench_opt, std::cout);
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::cerr << "q4tune: error: out of host memory: the model, --seq-len or --batch-size asks for more than this "
                 "machine has\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "q4tune: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
