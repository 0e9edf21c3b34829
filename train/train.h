// q4tune train, eval and export: the training loop over a frozen quantized model with LoRA adapters, AdamW,
// the LR schedule, checkpoints with exact resume, evaluation and the adapter exports.
//
// One optimizer step = grad_accum micro-batches of [batch_size, seq_len] tokens. The loss of the step is the
// mean over every counted token of all its micro-batches: micro-batch i (n_i counted tokens of N in the step)
// backpropagates its own mean with the seed n_i / N into gradients that sum across the micro-batches, so
// padding and how the examples fall into micro-batches change nothing.
//
// The rows of a micro-batch run as one sequence of batch_size * seq_len tokens whose segment ids keep attention
// inside each example (data/dataset.h): one graph of fixed shape, recorded once.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/model/model.h"

namespace CLI {
class App;
}

namespace q4t {

struct DeviceChoice;

// Every option of `q4tune train` (the CLI flag --foo-bar is the config key foo-bar).
struct TrainOptions {
  std::string config;  // the TOML file the other options came from, if any
  // What to train on, where to write.
  std::string model, data, val_data, out;
  double val_fraction = 0;
  std::string device = "auto";
  bool allow_shared_device = false;  // data parallel: more ranks on a machine than its GPUs share them
  double grad_bucket_mb = 4;          // data parallel: the gradients are summed over the ranks in parts this size
  int threads = 0;
  std::string precision = "auto";  // auto, mixed or f32 (DeviceChoice::set_precision)
  // LoRA.
  int64_t lora_rank = 16;
  double lora_alpha = 32, lora_dropout = 0;
  std::vector<std::string> lora_targets = model::all_lora_targets();
  bool rslora = false;
  std::string lora_init = "kaiming";
  // Optimizer and schedule.
  double lr = 2e-4;
  std::string schedule = "cosine";
  int64_t warmup_steps = 0;
  double warmup_ratio = 0, min_lr = 0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8, weight_decay = 0, grad_clip = 1.0;
  // Data and batching.
  int64_t batch_size = 1, grad_accum = 1, seq_len = 512;
  bool pack = false, train_on_prompt = false, no_truncate = false;
  std::string chat_template;
  data::DataFormat data_format;  // --data-format and the --*-field names
  int64_t steps = 0;  // 0: from epochs
  double epochs = 1;
  // Evaluation, checkpoints, logging.
  int64_t eval_every = 0, eval_batches = 0, save_every = 0, keep_checkpoints = 3, log_every = 10;
  uint64_t seed = 42;
  bool resume = false;
  std::string resume_dir;  // "" with resume: the newest checkpoint under out
  std::vector<std::string> sample_prompts;  // answered by the base model and with the adapter at the end
  int64_t sample_tokens = 64;
  std::string hf_base_model;  // PEFT's base_model_name_or_path (default: from the model file, base_model_name)
  std::string tensorboard;  // also write the metrics as TensorBoard event files into this directory
  int64_t vocab_tile = 4096;  // rows of the output matrix per tile of the fused loss
  bool grad_checkpoint = false;  // recompute the ffn activations in the backward (ModelGraph::hidden)
  int64_t keep_ffn_layers = 0;   // with grad_checkpoint: the last N layers keep their ffn gate and up outputs
  bool print_config = false;     // run_train prints effective_config and returns, touching nothing
  std::string effective_config;  // with print_config: every option as TOML that --config loads (train_cli.cpp)
};

// Registers every train option on cmd, plus --config FILE.toml (every flag is a key; flags override the file;
// an unknown key is an error). Without --config and without --model, the embedded configs/demo.toml applies.
void add_train_options(CLI::App* cmd, TrainOptions& o);
// --data-format, --text-field, --prompt-field, --completion-field and --messages-field, in group (train and eval).
void add_data_format_options(CLI::App* cmd, data::DataFormat& f, const std::string& group);
// The embedded configs/demo.toml, and the path it is written to for CLI11 to read.
std::string demo_config_path();

// Checks the options before any work (files, ranges, names, the output directory); throws
// std::invalid_argument with one message naming the option.
void validate_train_options(const TrainOptions& o);

// Runs training as configured; progress on `out`. Returns the exit code (130 after an interrupt, which saves a
// checkpoint). Throws std::runtime_error for errors (non-finite loss, I/O), leaving earlier checkpoints intact.
int run_train(const TrainOptions& o, std::ostream& out);

struct EvalOptions {
  std::string model, data, adapter;
  std::string run;  // a training run's --out (or one of its checkpoints): its model, template, seq-len, adapters
  double adapter_scale = 1.0;
  int64_t seq_len = 0, batch_size = 1, eval_batches = 0;  // seq_len 0: the run's, else 512
  bool pack = false, train_on_prompt = false;
  std::string chat_template;
  data::DataFormat data_format;
};
// Loss and perplexity of the model (with the adapter, if any) over every example of data.
int run_eval(const EvalOptions& o, const DeviceChoice& dev, std::ostream& out);

struct ExportOptions {
  std::string checkpoint, format = "gguf", out, model;  // model: overrides the path recorded in the checkpoint
  std::string hf_base_model;  // PEFT's base_model_name_or_path (default: from the model file, base_model_name)
};
// Writes a checkpoint's adapters (o.checkpoint: a checkpoint, or a run directory: its newest complete checkpoint)
// as a GGUF LoRA (out: a file) or a PEFT folder (out: a directory).
int run_export(const ExportOptions& o, std::ostream& out);

// A training run (the --out of q4tune train) as eval, generate and export read it: its newest complete
// checkpoint (or the checkpoint named), and the options the run recorded there.
struct RunInfo {
  std::string dir, checkpoint;
  CheckpointState state;
  nlohmann::json config;      // the run's options, by flag name
  std::string model, chat_template;  // its --model and --chat-template ("" when not given)
  int64_t seq_len = 0;
};
// Throws std::invalid_argument naming dir when it holds no complete checkpoint.
RunInfo read_run(const std::string& dir);
// The LoRA options the run trained with (targets, rank, alpha, rsLoRA, dropout); throws std::runtime_error naming
// the checkpoint's state.json when one is missing. Their scale is cfg.scale().
model::LoraSpec run_lora_spec(const RunInfo& run);
// Adds the run's adapters to mg with the checkpoint's values, their output scaled by `scale`.
void load_run_adapters(model::ModelGraph& mg, const RunInfo& run, double scale = 1.0);
// The chat template the run trained with: its --chat-template, else the family of the model's
// tokenizer.chat_template, else "".
std::string run_chat_template(const RunInfo& run, const tok::Tokenizer& tok);

// Throws std::runtime_error naming the file when the tokenizer has more tokens than the model's embedding rows.
void check_vocab(const tok::Tokenizer& tok, const model::Model& m, const std::string& path);

// A checkpoint's tensors (ts, from its file `what`) in params order, matched by name and shape; throws
// std::runtime_error naming dir, the file and the tensor on a missing, extra or misshapen tensor.
std::vector<std::vector<float>> checkpoint_values(const std::string& dir, const std::string& what,
                                                  const ag::Graph& g, const std::vector<ag::Var>& params,
                                                  const std::vector<NamedTensor>& ts);

// The embedded file `name` (train/embedded.h) copied once into the cache directory as STEM-<content hash>.ext.
std::string cached_embedded_copy(const std::string& name, const std::string& stem);

// "builtin:..." names: the demo model (made by init-model on first use and cached) and the shipped demo data.
// Returns the path to use for a model or data option (unchanged unless it is a builtin name).
std::string resolve_builtin(const std::string& name, std::ostream& log);

}  // namespace q4t
