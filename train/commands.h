// The q4tune subcommands implemented in train/: how each registers on the command line, and what it runs (each
// run_* returns the process exit code).
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "kernels/precision.h"

namespace CLI {
class App;
}

namespace q4t {

struct DeviceChoice;

// A subcommand as main runs it: `cmd`, registered on the app with its options bound to state that `run` owns, and
// `run`, which runs the command once the command line is parsed and returns the exit code.
struct Command {
  CLI::App* cmd;
  std::function<int()> run;
};
// Each add_<command> registers `q4tune <command>` (its options, --help text and examples) on app, next to the
// code that runs it; bench registers `bench train` under itself.
Command add_devices(CLI::App& app);        // device_choice.cpp
Command add_selftest(CLI::App& app);       // selftest.cpp
Command add_gradcheck(CLI::App& app);      // gradcheck_cmd.cpp
Command add_info(CLI::App& app);           // info_cmd.cpp
Command add_init_model(CLI::App& app);     // model_cmds.cpp
Command add_quantize(CLI::App& app);       // model_cmds.cpp
Command add_merge(CLI::App& app);          // merge.cpp
Command add_logits(CLI::App& app);         // model_cmds.cpp
Command add_tokenize(CLI::App& app);       // tokenize_cmd.cpp
Command add_bench(CLI::App& app);          // bench.cpp
Command add_bench_train(CLI::App& bench);  // bench_train.cpp
Command add_train(CLI::App& app);          // train_cli.cpp
Command add_eval(CLI::App& app);           // eval_export.cpp
Command add_export(CLI::App& app);         // eval_export.cpp
Command add_generate(CLI::App& app);       // generate_cli.cpp

// Runs every kernel on the device against the double-precision reference; one line per kernel.
int run_selftest(const DeviceChoice& dev, std::ostream& out);

// Runs every autograd gradient-check case (CPU f32, and the Vulkan device unless dev is the CPU).
int run_gradcheck_cmd(const DeviceChoice& dev, std::ostream& out);

// Prints a GGUF file's version, metadata and tensors (shape, type, bytes, whether q4tune supports the type).
int run_info(const std::string& path, std::ostream& out);

struct InitModelOptions {
  std::string arch = "llama", type = "q4_0", out;
  int64_t dim = 64, layers = 2, heads = 4, kv_heads = 2, ff = 128, ctx = 256;
  int64_t head_dim = 0;  // 0: dim / heads
  int64_t rope_dims = 0;  // rotated dims of a head (0: all; fewer: partial rotary, not for llama)
  bool tied = false;
  bool rope_freqs = false;     // llama: a rope_freqs.weight of llama 3.1's factors (factor 8 over an original --ctx)
  std::string rope_scaling;    // "", or "linear:F" / "yarn:F" (original context --ctx)
  // gemma2, gemma3: the local layers' window and its layer pattern (0: the architecture's default), the soft-caps
  // (negative: the architecture's default; 0: none)
  int64_t sliding_window = 16, swa_pattern = 0;
  int64_t longrope = 0;  // phi3: LongRoPE factors (short and long) with this original context (0: none)
  double attn_softcap = -1, final_softcap = -1;
  uint32_t seed = 42;
  double rope_base = 10000.0;
};
// Writes a small random-initialised GGUF of one of the supported architectures with a byte-level vocabulary.
int run_init_model(const InitModelOptions& o, std::ostream& out);
// The type a llama-quantize file type or format name (q4_k_m, q8_0, f16, ...; `flag` names it in errors) gives
// each tensor of f, as llama-quantize chooses them: its 2-D matrices (only the F32 and F16 ones unless
// `requantize`) by the mix, every other tensor its own type; and the file's general.file_type.
struct TypePlan {
  std::vector<gguf::GgmlType> types;  // one per tensor of f, in file order
  gguf::GgmlType base;                // the type of most matrices
  uint32_t file_type = 0;
};
TypePlan plan_types(const gguf::File& f, const std::string& flag, const std::string& type_name, bool requantize);

// Converts the 2-D F32/F16 weights of a GGUF to `type` (q4_0, q4_k_m, q8_0) as llama-quantize picks the type of
// each matrix; everything else is copied. Every type is chosen before anything is written.
int run_quantize(const std::string& in, const std::string& out_path, const std::string& type, std::ostream& out);

struct MergeOptions {
  std::string model, out;
  std::vector<std::string> adapters;  // GGUF LoRAs, training runs (their newest complete checkpoint) or checkpoints
  std::vector<double> scales;         // one per adapter, or none (1 each)
  std::string type = "same";          // same (each tensor its own type), or a llama-quantize file type / format
  std::string calibration;            // a dataset: quantize the merged weights against the inputs they see on it
  int64_t calibration_tokens = 2048;
  int64_t calibration_seq_len = 512;
};
// Folds the adapters into the model's weights (W' = dequant(W) + Σ scale·B·A, quantized again) and writes one GGUF
// atomically, streaming one tensor at a time. A mismatched adapter is one std::invalid_argument naming it, before
// anything is written.
int run_merge(const MergeOptions& o, std::ostream& out);

struct LogitsOptions {
  std::string model, ids_file, adapter, out;
  std::vector<int32_t> ids;
  double adapter_scale = 1.0;
  bool llama_cpp_numerics = false;
};
// Forward on the token ids; writes {"logits": [[n_vocab floats] per position]} to out (or stdout).
int run_logits(const LogitsOptions& o, const DeviceChoice& dev, std::ostream& out);

struct TokenizeOptions {
  std::string model, text, file, json_in, out;
  bool decode = false, parse_special = false, add_special = false;
};
// Prints the ids of the text (or file) on one line, and with decode the text they decode to; with json_in
// (a JSON array of strings) writes a JSON array of id arrays to out (or stdout). BOS/EOS only with add_special.
int run_tokenize(const TokenizeOptions& o, std::ostream& out);

struct BenchOptions {
  std::vector<std::string> kernels;  // empty: all
  std::vector<std::string> shapes;   // "n_outxn_in"; empty: the default set
  std::string json_path;             // empty: no JSON
  double seconds_per_case = 0.25;
  int64_t tokens = 512;  // T of the GEMM and dx cases
  Precision precision = Precision::F32;  // of the routed gemm and dx
};
int run_bench(const DeviceChoice& dev, const BenchOptions& opt, std::ostream& out);
// The tile-shape suffixes bench's mixed kernels take ("_t128x128w4, ... or _t256x128k16"), for help and errors.
std::string mixed_tile_suffixes();

// A benchmark's --json FILE: opened (as FILE.tmp) before the run, so an unwritable path fails at once, and
// renamed over FILE once the results are written. An empty path writes nothing.
class BenchJson {
 public:
  explicit BenchJson(const std::string& path);
  void write(const nlohmann::json& rows);

 private:
  std::string path_;
  std::ofstream file_;
};

// q4tune bench train (train/bench_train.cpp).
struct BenchTrainOptions {
  std::string shape = "small";  // small, tinyllama-1.1b or llama-7b
  std::string type = "q4_0";    // the random model's weights: q4_0, q4_k_m, q8_0 or f16
  int64_t seq_len = 512;
  std::vector<int64_t> batch_sizes{1, 4};
  int64_t steps = 5, warmup = 2;  // timed steps, and untimed ones before them
  int64_t lora_rank = 16;
  bool profile = false;   // Vulkan: GPU time per op of the graph's passes
  bool profile_kernels = false;  // Vulkan: also the GPU time of each kernel, every command timed alone
  bool profile_levels = false;   // Vulkan: the GPU time of each level of the passes, by its kernels
  bool grad_checkpoint = false;  // as TrainOptions::grad_checkpoint
  int64_t keep_ffn_layers = 0;   // with grad_checkpoint: the last N layers keep their ffn gate and up outputs
  double grad_bucket_mb = 4;     // under mpirun: as TrainOptions::grad_bucket_mb
  std::string json_path;  // empty: no JSON
};
int run_bench_train(const DeviceChoice& dev, const BenchTrainOptions& opt, std::ostream& out);

}  // namespace q4t
