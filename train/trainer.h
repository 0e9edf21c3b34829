// One run of `q4tune train` (train.h): setup and resume, the optimizer step, evaluation, checkpoints, and the
// end-of-run exports, summary and samples; as one process or as each rank of a data-parallel run
// (train/distributed.h), where every rank computes and only rank 0 writes and prints. run_train (train.cpp) drives it:
//   Trainer t(options, out);  // device, model, data, graph; a resume restores the checkpoint's state
//   while (!t.done()) { t.step(); /* t.evaluate(), t.save(why) when due */ }
//   t.finish();               // final evaluation and checkpoint, adapter.gguf and peft/, summary, samples
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/backend.h"
#include "autograd/flat_grads.h"
#include "autograd/optim.h"
#include "data/dataset.h"
#include "data/gguf.h"
#include "data/tokenizer.h"
#include "train/device_choice.h"
#include "train/distributed.h"
#include "train/generate.h"
#include "train/loss_graph.h"
#include "train/run_log.h"
#include "train/schedule.h"
#include "train/train.h"

namespace q4t {

class Trainer {
 public:
  // Resolves the builtin names; with opt.resume, finds the checkpoint and throws std::invalid_argument listing
  // every option it was written with that differs. Then opens the device, loads the model and the data, builds
  // the graph, restores the checkpoint's adapters, optimizer, data cursor and counters, and opens the run log.
  // Reports on out. opt must outlive the trainer.
  Trainer(const TrainOptions& opt, std::ostream& out);

  bool done() const { return step_ >= total_steps_; }
  int64_t steps_done() const { return step_; }

  // One optimizer step over grad_accum micro-batches, logged to metrics.jsonl, the progress line and loss.svg.
  // Throws std::runtime_error, saving nothing, when the loss or the gradient norm is not finite.
  void step();
  // The validation loss, logged (nothing without validation data).
  void evaluate();
  // A checkpoint of the current step under OUT/checkpoints; why ("final", "interrupted", ...) goes in the message.
  void save(const std::string& why);
  // Whether to stop after this step: `interrupted` (Ctrl-C here) on any rank.
  bool stop_requested(bool interrupted) const { return world_.any(interrupted); }
  // After Ctrl-C: saves a checkpoint and says how to continue.
  void stop_interrupted();
  // After the last step: the final evaluation and checkpoint, the adapter exports, the summary and the samples.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;

  void setup(const TrainOptions& opt, std::ostream& out);
  void check_ranks_agree() const;
  std::string adapters_digest() const;
  void load_model();
  void load_data();
  void build_graph();
  void restore(const std::string& dir, const CheckpointState& ckpt);
  void open_log(bool resumed);
  void redraw();
  [[noreturn]] void fail_not_finite(const std::string& what, double value) const;
  std::pair<int64_t, int64_t> next_micro_batches();
  void export_adapters();
  void print_summary();
  std::vector<ChatPrompt> sample_prompts() const;
  int64_t sample_context() const;
  void check_sample_prompts() const;
  void print_samples();

  const TrainOptions& opt_;
  std::ostream& out_;
  const dist::World& world_;
  std::string model_path_, data_path_, val_path_;  // with the builtin names resolved
  nlohmann::json identity_;                        // the options a resume must match (identity_json)
  nlohmann::json data_digests_;                    // the data files' XXH3, which a resume must match too
  DeviceChoice dev_;
  std::unique_ptr<ag::Backend> be_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::unique_ptr<model::Model> model_;
  std::optional<data::Datasets> ds_;
  int64_t total_steps_ = 0;
  std::unique_ptr<LossGraph> lg_;
  std::unique_ptr<ag::AdamW> adam_;
  std::unique_ptr<ag::FlatGrads> flat_;  // data parallel: the gradients the ranks sum
  train::ScheduleConfig sched_;
  nlohmann::json schedule_json_;  // the schedule as checkpoints record it

  bool ckpt_resumed_ = false;
  int64_t step_ = 0;
  uint64_t micro_index_ = 0;  // micro-batches so far: the dropout salt's counter
  int64_t tokens_seen_ = 0;
  double elapsed_before_ = 0;  // training seconds of the runs this one resumes
  std::optional<train::MetricsLog> metrics_;
  std::optional<train::Progress> progress_;

  std::vector<data::Batch> micro_;  // grad_accum micro-batches of [batch_size, seq_len]
  ag::Tensor salt_tensor_;          // the dropout salt (undefined without dropout)
  Clock::time_point loop_start_;
  int64_t first_step_ = 0, loop_tokens_ = 0;  // of this process's steps, for the summary
  double first_loss_ = std::nan(""), last_loss_ = std::nan("");
};

}  // namespace q4t
