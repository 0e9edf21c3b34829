// q4tune bench train: full LoRA training steps (forward, backward, gradient clip, AdamW) on a random model of a
// named shape made in memory (--type: its weights), timed after warm-up; tokens/s and peak memory per batch size.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <span>
#include <stdexcept>

#include "autograd/flat_grads.h"
#include "autograd/optim.h"
#include "kernels/cpu/threads.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/device_choice.h"
#include "train/distributed.h"
#include "train/loss_graph.h"
#include "train/model/model.h"
#include "train/run_log.h"

namespace q4t {

namespace {

struct NamedShape {
  const char* name;
  int64_t dim, layers, heads, kv_heads, ff, vocab;
};
const NamedShape kShapes[] = {
    {"small", 512, 8, 8, 4, 1408, 32000},
    {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000},
    {"llama-7b", 4096, 32, 32, 32, 11008, 32000},
};

model::ModelConfig shape_config(const std::string& name, int64_t seq_len) {
  for (const NamedShape& s : kShapes) {
    if (name != s.name) continue;
    model::ModelConfig c;
    c.arch = "llama";
    c.n_vocab = s.vocab;
    c.n_embd = s.dim;
    c.n_layer = s.layers;
    c.n_ff = s.ff;
    c.n_head = s.heads;
    c.n_head_kv = s.kv_heads;
    c.head_dim = s.dim / s.heads;
    c.n_ctx = std::max<int64_t>(2048, seq_len);
    return c;
  }
  std::string known;
  for (const NamedShape& s : kShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  throw std::invalid_argument("--shape: unknown shape '" + name + "' (known: " + known + ")");
}

// One row of B x T random tokens: every position counted, one example per row.
data::Batch random_batch(int64_t B, int64_t T, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab - 1));
  data::Batch b;
  b.B = B;
  b.T = T;
  const size_t n = size_t(B * T);
  b.ids.resize(n);
  b.labels.resize(n);
  for (size_t i = 0; i < n; ++i) {
    b.ids[i] = tok(rng);
    b.labels[i] = tok(rng);
  }
  b.attn_mask.assign(n, 1);
  b.segment_ids.assign(n, 1);
  b.positions.resize(n);
  for (size_t i = 0; i < n; ++i) b.positions[i] = int32_t(int64_t(i) % T);
  return b;
}

// GPU ms per step by op, largest first; the optimizer's wall time (the clip's norm and scaling, AdamW: each one
// submit that the host waits for); and what the step spent elsewhere (uploads, the loss read back, host work).
std::string format_profile(const std::map<std::string, ag::Graph::OpTime>& times, int64_t steps, double seconds,
                           double optimizer_seconds) {
  std::vector<std::pair<std::string, ag::Graph::OpTime>> rows(times.begin(), times.end());
  auto total = [](const ag::Graph::OpTime& t) { return t.forward_ns + t.backward_ns; };
  std::sort(rows.begin(), rows.end(), [&](const auto& a, const auto& b) { return total(a.second) > total(b.second); });
  const double step_ms = 1e3 * seconds / double(steps);
  std::string s = "    op                      fwd ms    bwd ms   of step\n";
  double sum_ms = 0;
  char buf[160];
  for (const auto& [name, t] : rows) {
    const double f = t.forward_ns * 1e-6 / double(steps), b = t.backward_ns * 1e-6 / double(steps);
    sum_ms += f + b;
    std::snprintf(buf, sizeof buf, "    %-22s %8.2f  %8.2f  %6.1f%%\n", name.c_str(), f, b, 100.0 * (f + b) / step_ms);
    s += buf;
  }
  const double opt_ms = 1e3 * optimizer_seconds / double(steps);
  std::snprintf(buf, sizeof buf, "    %-22s %18.2f  %6.1f%%\n", "(clip + AdamW)", opt_ms, 100.0 * opt_ms / step_ms);
  s += buf;
  std::snprintf(buf, sizeof buf, "    %-22s %18.2f  %6.1f%%\n", "(elsewhere)", step_ms - sum_ms - opt_ms,
                100.0 * (step_ms - sum_ms - opt_ms) / step_ms);
  return s + buf;
}

// GPU ms per step by kernel (pipeline), largest first, each command timed alone: their sum is more than a step
// without the timing, where commands of one level run side by side.
// Levels: GPU ms per step by level (the kernels that run side by side between two barriers, by name), the levels'
// time from the end of the level before; the largest kLevelRows.
std::string format_kernels(const std::map<std::string, ag::Graph::KernelTime>& times, int64_t steps, bool levels,
                           double seconds) {
  constexpr size_t kLevelRows = 60;
  std::vector<std::pair<std::string, ag::Graph::KernelTime>> rows(times.begin(), times.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  double sum_ns = 0, runs = 0;
  for (const auto& row : rows) sum_ns += row.second.ns, runs += double(row.second.runs);
  std::string s = levels ? "    level (its kernels, side by side)        ms   runs/step   of the sum\n"
                         : "    kernel (each command alone)               ms   runs/step   of the sum\n";
  char buf[400];
  for (size_t i = 0; i < rows.size() && (!levels || i < kLevelRows); ++i) {
    const auto& [name, t] = rows[i];
    std::snprintf(buf, sizeof buf, "    %-38s %9.2f  %9.1f  %6.1f%%\n", name.c_str(), t.ns * 1e-6 / double(steps),
                  double(t.runs) / double(steps), 100.0 * t.ns / sum_ns);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "    %-38s %9.2f  %9.1f   (the step: %.2f ms)\n", "(sum)",
                sum_ns * 1e-6 / double(steps), runs / double(steps), 1e3 * seconds / double(steps));
  return s + buf;
}

struct Result {
  int64_t batch_size = 0;
  double seconds = 0, tokens_per_s = 0, ms_per_step = 0, loss = 0;
  // Data parallel: copying the gradients out of the graph, summing them over the ranks, copying them back.
  double exchange_s = 0;      // the sum's wall time after the backward (the loss's and what the backward left)
  int64_t overlapped = 0;     // timed steps whose backward summed every bucket while it ran
  size_t buckets = 0;
  int64_t peak_bytes = 0, trainable = 0;
};

// Times opt.steps training steps of B rows per rank (after the warm-up); the profile table when asked for.
Result time_steps(const model::Model& model, const DeviceChoice& dev, const BenchTrainOptions& opt, int64_t B,
                  std::string& profile_table) {
  const dist::World& world = dist::World::get();
  const model::ModelConfig& cfg = model.config();
  Result r;
  r.batch_size = B;
  LossGraph lg(model, B, opt.seq_len, 4096,
               opt.grad_checkpoint ? LossGraph::Memory::Recompute : LossGraph::Memory::Planned);
  model::LoraSpec spec;
  spec.cfg.rank = opt.lora_rank;
  spec.cfg.alpha = 2.0 * double(opt.lora_rank);
  std::mt19937 init_rng(7);
  lg.model_graph().add_adapters(spec, init_rng);
  lg.model_graph().keep_ffn_layers(opt.keep_ffn_layers);
  lg.build("--batch-sizes");
  ag::AdamW adam(lg.graph(), {1e-4, 0.9, 0.999, 1e-8, 0.0});
  for (const ag::Var& p : adam.params()) r.trainable += p.value().numel();
  const std::vector<data::Batch> micro{
      random_batch(B, opt.seq_len, cfg.n_vocab, uint32_t(B) + 7919u * uint32_t(world.rank()))};
  std::unique_ptr<ag::FlatGrads> flat;
  if (world.distributed()) {
    flat = std::make_unique<ag::FlatGrads>(lg.graph(), lg.loss(), adam.params(),
                                           [&world](std::span<float> v) { world.sum(v); },
                                           ag::bucket_floats(opt.grad_bucket_mb));
    r.buckets = flat->bucket_count();
  }
  double optimizer_s = 0;  // wall time of the clip and AdamW
  auto step = [&] {
    StepLoss sl = accumulate_gradients(lg, micro, {}, micro[0].n_label_tokens() * world.size(), flat.get());
    if (flat) {
      const auto t = std::chrono::steady_clock::now();
      world.sum(std::span<double>(&sl.loss, 1));
      flat->exchange();
      r.exchange_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      r.overlapped += flat->overlapped();
    }
    const auto t_opt = std::chrono::steady_clock::now();
    adam.clip(1.0);
    adam.step(1e-4);
    optimizer_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
    return sl.loss;
  };
  const bool profile = opt.profile && !dev.is_cpu();
  const bool levels = opt.profile_levels && !dev.is_cpu();
  using Timing = vk::Sequence::Timing;
  if (profile || levels)
    lg.graph().set_profiling(true, levels ? Timing::Levels : opt.profile_kernels ? Timing::Commands : Timing::Off);
  for (int64_t i = 0; i < opt.warmup; ++i) step();
  lg.graph().clear_op_times();
  optimizer_s = 0;
  r.exchange_s = 0;
  r.overlapped = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < opt.steps; ++i) r.loss = step();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (profile) profile_table = format_profile(lg.graph().op_times(), opt.steps, r.seconds, optimizer_s);
  if ((profile && opt.profile_kernels) || levels)
    profile_table += format_kernels(lg.graph().kernel_times(), opt.steps, levels, r.seconds);
  return r;
}

}  // namespace

int run_bench_train(const DeviceChoice& dev, const BenchTrainOptions& opt, std::ostream& log) {
  const model::ModelConfig cfg = shape_config(opt.shape, opt.seq_len);
  if (opt.seq_len < 2) throw std::invalid_argument("--seq-len: must be at least 2");
  if (opt.batch_sizes.empty()) throw std::invalid_argument("--batch-sizes: give at least one");
  for (int64_t b : opt.batch_sizes)
    if (b < 1) throw std::invalid_argument("--batch-sizes: " + std::to_string(b) + " is not a positive batch size");
  if (opt.steps < 1) throw std::invalid_argument("--steps: must be at least 1");
  if (opt.warmup < 0) throw std::invalid_argument("--warmup: must be 0 or more");
  if (opt.lora_rank < 1) throw std::invalid_argument("--lora-rank: must be at least 1");
  if (opt.keep_ffn_layers < 0 || opt.keep_ffn_layers > cfg.n_layer)
    throw std::invalid_argument("--keep-ffn-layers: " + std::to_string(opt.keep_ffn_layers) + " is outside 0.." +
                                std::to_string(cfg.n_layer) + " (the shape's layers)");
  if (opt.keep_ffn_layers > 0 && !opt.grad_checkpoint)
    throw std::invalid_argument("--keep-ffn-layers: applies only with --grad-checkpoint");
  const dist::World& world = dist::World::get();
  BenchJson json(world.root() ? opt.json_path : "");
  std::ostream quiet(nullptr);  // the other ranks of a data-parallel run: rank 0 reports
  std::ostream& out = world.root() ? log : quiet;

  auto be = dev.backend();
  const auto t_model = std::chrono::steady_clock::now();
  auto model = model::Model::random(cfg, *be, 1234, model::Model::parse_random_weights("--type", opt.type));
  const double model_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_model).count();
  out << "bench train on " << dev.name();
  if (dev.is_cpu()) out << " (" << cpu::num_threads() << " threads)";
  out << ": " << opt.shape << " (dim " << cfg.n_embd << ", " << train::plural(cfg.n_layer, "layer") << ", " << cfg.n_head << "/"
      << cfg.n_head_kv << " heads, ff " << cfg.n_ff << ", vocab " << cfg.n_vocab << "), random " << opt.type << " weights "
      << train::fmt_bytes(model->weight_bytes()) << " (made in " << std::fixed << std::setprecision(1) << model_s
      << " s); LoRA r=" << opt.lora_rank << " on q,k,v,o,gate,up,down; seq " << opt.seq_len << "; " << opt.warmup
      << " warm-up + " << opt.steps << " timed steps"
      << (opt.grad_checkpoint ? "; layers recomputed in the backward (--grad-checkpoint)" : "") << "; "
      << dev.precision_text();
  if (world.distributed())
    out << "; data parallel over " << world.size() << " ranks (tokens/s of all of them; batch size per rank)";
  if (opt.keep_ffn_layers > 0) out << ", the ffn gate and up outputs of the last " << opt.keep_ffn_layers << " kept";
  out << "\n";
  out.unsetf(std::ios::floatfield);

  nlohmann::json rows = nlohmann::json::array();
  for (int64_t B : opt.batch_sizes) {
    if (!dev.is_cpu()) dev.vulkan->reset_peak();
    std::string profile_table;
    Result r = time_steps(*model, dev, opt, B, profile_table);
    r.tokens_per_s = double(B * opt.seq_len * opt.steps * world.size()) / r.seconds;
    r.ms_per_step = 1e3 * r.seconds / double(opt.steps);
    r.peak_bytes = dev.is_cpu() ? train::peak_rss_bytes() : dev.vulkan->peak_bytes_allocated();
    char line[256];
    std::snprintf(line, sizeof line, "bs %-3lld %10.1f tok/s %10.1f ms/step   peak %s %s   loss %.3f",
                  (long long)B, r.tokens_per_s, r.ms_per_step, train::fmt_bytes(r.peak_bytes).c_str(),
                  dev.is_cpu() ? "(process RSS)" : "device", r.loss);
    out << line;
    if (world.distributed()) {
      const double per = 1e3 / double(opt.steps);
      out << "   gradients of " << world.size() << " ranks in " << r.buckets << " buckets, summed "
          << (r.overlapped == opt.steps ? "during the backward" : r.overlapped == 0 ? "after the backward" : "partly during it")
          << ", then " << std::fixed << std::setprecision(1) << r.exchange_s * per << " ms per step after it";
    }
    out.unsetf(std::ios::floatfield);
    out << std::endl << profile_table;
    rows.push_back({{"shape", opt.shape},
                    {"device", dev.name()},
                    {"seq_len", opt.seq_len},
                    {"batch_size", B},
                    {"steps", opt.steps},
                    {"tokens_per_s", r.tokens_per_s},
                    {"ms_per_step", r.ms_per_step},
                    {"peak_bytes", r.peak_bytes},
                    {"peak_is_process_rss", dev.is_cpu()},
                    {"weight_bytes", model->weight_bytes()},
                    {"trainable_params", r.trainable},
                    {"lora_rank", opt.lora_rank},
                    {"type", opt.type},
                    {"precision", precision_name(dev.precision)},
                    {"grad_checkpoint", opt.grad_checkpoint},
                    {"keep_ffn_layers", opt.keep_ffn_layers},
                    {"ranks", world.size()},
                    {"grad_bucket_mb", opt.grad_bucket_mb},
                    {"gradient_buckets", r.buckets},
                    {"gradient_sum_overlapped_steps", r.overlapped},
                    {"gradient_exchange_after_backward_ms", 1e3 * r.exchange_s / double(opt.steps)},
                    {"loss", r.loss}});
  }
  json.write(rows);
  return 0;
}

Command add_bench_train(CLI::App& bench) {
  auto o = std::make_shared<BenchTrainOptions>();
  auto* cmd = bench.add_subcommand(
      "train",
      "Time full LoRA training steps (forward, backward, clip, AdamW) on a random model of a named shape made in "
      "memory (Q4_0 weights unless --type says otherwise): tokens/s and peak memory per batch size");
  const auto dev = add_device_flags(cmd, /*with_precision=*/true);
  cmd->add_flag("--allow-shared-device", dev->allow_shared_device,
                "under mpirun: let more ranks run on a machine than it has GPUs (they share them)");
  cmd->add_option("--type", o->type,
                  "the random model's weights: q4_0, q8_0 or f16 (every matrix), or q4_k_m (llama-quantize's "
                  "Q4_K_M mix: Q4_K, with Q6_K for the output matrix and attn_v/ffn_down of some layers)")
      ->check(CLI::IsMember({"q4_0", "q4_k_m", "q8_0", "f16"}))
      ->capture_default_str();
  cmd->add_option("--shape", o->shape, "small (dim 512, 8 layers), tinyllama-1.1b or llama-7b")->capture_default_str();
  cmd->add_option("--seq-len", o->seq_len, "tokens per row")->capture_default_str();
  cmd->add_option("--batch-sizes", o->batch_sizes, "comma-separated batch sizes, each timed on its own (default 1,4)")
      ->delimiter(',');
  cmd->add_option("--steps", o->steps, "timed steps per batch size")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed steps before them")->capture_default_str();
  cmd->add_option("--lora-rank", o->lora_rank, "LoRA rank on all seven targets (alpha = 2 * rank)")->capture_default_str();
  CLI::Option* profile = cmd->add_flag(
      "--profile", o->profile, "Vulkan: also print the GPU time per op (forward and backward) of the timed steps");
  cmd->add_flag("--profile-kernels", o->profile_kernels,
                "Vulkan, with --profile: also the GPU time per kernel, each dispatch and transfer timed alone (the "
                "steps run slower: no two commands overlap)")
      ->needs(profile);
  cmd->add_flag("--profile-levels", o->profile_levels,
                "Vulkan: print the GPU time per level of the recorded passes (the kernels that run side by side "
                "between two barriers, as without profiling), by the level's kernels, the 60 largest")
      ->excludes(profile);
  cmd->add_flag("--grad-checkpoint", o->grad_checkpoint,
                "keep each layer's output, attention inputs and output and residual from the forward and "
                "recompute the ffn's activations in the backward");
  cmd->add_option("--keep-ffn-layers", o->keep_ffn_layers,
                  "with --grad-checkpoint: the last N layers keep their ffn gate and up outputs instead of "
                  "recomputing them")
      ->capture_default_str();
  cmd->add_option("--grad-bucket-mb", o->grad_bucket_mb,
                  "under mpirun: the ranks sum their gradients in parts of this many MB, on a GPU each part while the "
                  "backward goes on (0: all at once after the backward, to measure what the overlap saves)")
      ->check(CLI::Range(0.0, 1048576.0))
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "also write the results as a JSON array to this file");
  set_examples(cmd, "  q4tune bench train --shape tinyllama-1.1b --type q4_k_m --batch-sizes 1,4 --grad-checkpoint");
  return {cmd, [o, dev] {
            dist::World::init();
            return run_bench_train(dev->open(), *o, std::cout);
          }};
}

}  // namespace q4t
