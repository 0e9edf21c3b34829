// q4tune train: the loop (see train.h), checkpoints and resume, the end-of-run exports and summary.
#include "train/train.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/optim.h"
#include "data/atomic_file.h"
#include "data/chat_template.h"
#include "data/dataset_cache.h"
#include "data/gguf.h"
#include "data/splitmix.h"
#include "data/tokenizer.h"
#include "kernels/cpu/threads.h"
#include "train/checkpoint.h"
#include "train/commands.h"
#include "train/device_choice.h"
#include "train/embedded.h"
#include "train/export.h"
#include "train/generate.h"
#include "train/loss_graph.h"
#include "train/run_log.h"
#include "train/schedule.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace q4t {

namespace {

std::atomic<int> g_interrupts{0};

extern "C" void on_interrupt(int) {
  // The first Ctrl-C asks the loop to save and stop after the current step; a second one ends the process now.
  if (g_interrupts.fetch_add(1) >= 1) _exit(130);
}

struct InterruptGuard {
  struct sigaction old_int {}, old_term {};
  InterruptGuard() {
    g_interrupts = 0;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~InterruptGuard() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

// The shape of the builtin demo model (`q4tune init-model` with these options).
InitModelOptions demo_model_options() {
  InitModelOptions m;
  m.arch = "llama";
  m.type = "q4_0";
  m.dim = 128;
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.ff = 384;
  m.ctx = 512;
  m.seed = 7;
  return m;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void fail_option(const std::string& name, const std::string& what) {
  throw std::invalid_argument("--" + name + ": " + what);
}

// The options that decide the numbers a run computes: a resume must match all of them.
json identity_json(const TrainOptions& o, const std::string& model_path, const std::string& data_path) {
  json j;
  std::error_code ec;
  const auto size = fs::file_size(model_path, ec);
  j["model"] = model_path;
  j["model_bytes"] = ec ? -1 : int64_t(size);
  j["data"] = data_path;
  j["val-data"] = o.val_data;
  j["val-fraction"] = o.val_fraction;
  j["lora-rank"] = o.lora_rank;
  j["lora-alpha"] = o.lora_alpha;
  j["lora-dropout"] = o.lora_dropout;
  j["lora-targets"] = o.lora_targets;
  j["rslora"] = o.rslora;
  j["lora-init"] = o.lora_init;
  j["lr"] = o.lr;
  j["schedule"] = o.schedule;
  j["warmup-steps"] = o.warmup_steps;
  j["warmup-ratio"] = o.warmup_ratio;
  j["min-lr"] = o.min_lr;
  j["adam-beta1"] = o.adam_beta1;
  j["adam-beta2"] = o.adam_beta2;
  j["adam-eps"] = o.adam_eps;
  j["weight-decay"] = o.weight_decay;
  j["grad-clip"] = o.grad_clip;
  j["batch-size"] = o.batch_size;
  j["grad-accum"] = o.grad_accum;
  j["seq-len"] = o.seq_len;
  j["pack"] = o.pack;
  j["train-on-prompt"] = o.train_on_prompt;
  j["no-truncate"] = o.no_truncate;
  j["chat-template"] = o.chat_template;
  j["data-format"] = o.data_format.format;
  j["text-field"] = o.data_format.text_field;
  j["prompt-field"] = o.data_format.prompt_field;
  j["completion-field"] = o.data_format.completion_field;
  j["messages-field"] = o.data_format.messages_field;
  j["steps"] = o.steps;
  j["epochs"] = o.epochs;
  j["seed"] = o.seed;
  j["vocab-tile"] = o.vocab_tile;
  j["grad-checkpoint"] = o.grad_checkpoint;  // (--keep-ffn-layers is not here: it changes what is kept, no number)
  return j;
}

// Checkpoint state of the trainable tensors and the optimizer.
std::vector<NamedTensor> named(const ag::Graph& g, const std::vector<ag::Var>& params,
                               const std::vector<std::vector<float>>& values) {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < params.size(); ++i) out.push_back({g.node(params[i].id).name, params[i].shape(), values[i]});
  return out;
}

std::vector<std::vector<float>> param_values(ag::Backend& be, const std::vector<ag::Var>& params) {
  std::vector<std::vector<float>> out;
  for (const ag::Var& p : params) {
    const std::vector<double> d = be.to_host(p.value());
    out.emplace_back(d.begin(), d.end());
  }
  return out;
}

}  // namespace

void check_vocab(const tok::Tokenizer& tok, const model::Model& m, const std::string& path) {
  if (tok.n_vocab() > m.config().n_vocab)
    throw std::runtime_error(path + ": tokenizer.ggml.tokens has " + std::to_string(tok.n_vocab()) +
                             " tokens but token_embd.weight only " + std::to_string(m.config().n_vocab) + " rows");
}

std::vector<std::vector<float>> checkpoint_values(const std::string& dir, const std::string& what,
                                                  const ag::Graph& g, const std::vector<ag::Var>& params,
                                                  const std::vector<NamedTensor>& ts) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : ts) by_name[t.name] = &t;
  if (ts.size() != params.size())
    throw std::runtime_error(dir + ": " + what + " holds " + train::plural(int64_t(ts.size()), "tensor") +
                             ", this run trains " + std::to_string(params.size()));
  std::vector<std::vector<float>> out;
  for (const ag::Var& p : params) {
    const std::string& name = g.node(p.id).name;
    auto it = by_name.find(name);
    if (it == by_name.end()) throw std::runtime_error(dir + ": " + what + " has no tensor '" + name + "'");
    if (it->second->shape != p.shape())
      throw std::runtime_error(dir + ": " + what + " tensor '" + name + "' is " + ag::shape_str(it->second->shape) +
                               ", this run's is " + ag::shape_str(p.shape()));
    out.push_back(it->second->values);
  }
  return out;
}

std::string cached_embedded_copy(const std::string& name, const std::string& stem) {
  const std::string_view text = embedded_file(name);
  const std::string dir = data::cache_dir(data::DatasetOptions{});
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create the cache directory: " + ec.message());
  const std::string path = dir + "/" + stem + "-" + hex64(fnv1a(text)).substr(0, 12) + fs::path(name).extension().string();
  if (!fs::exists(path)) write_file_atomic(path, text);
  return path;
}

std::string resolve_builtin(const std::string& name, std::ostream& log) {
  const std::string prefix = "builtin:";
  if (name.rfind(prefix, 0) != 0) return name;
  const std::string what = name.substr(prefix.size());
  const std::string dir = data::cache_dir(data::DatasetOptions{});
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create the cache directory: " + ec.message());
  if (what == "demo-model") {
    const InitModelOptions m = demo_model_options();
    const std::string key = m.arch + m.type + std::to_string(m.dim) + "." + std::to_string(m.layers) + "." +
                            std::to_string(m.heads) + "." + std::to_string(m.kv_heads) + "." + std::to_string(m.ff) +
                            "." + std::to_string(m.ctx) + "." + std::to_string(m.seed);
    const std::string path = dir + "/demo-model-" + hex64(fnv1a(key)).substr(0, 12) + ".gguf";
    if (!fs::exists(path)) {
      InitModelOptions make = m;
      make.out = path;
      log << "making the demo model (q4tune init-model --dim " << m.dim << " --layers " << m.layers << " --heads "
          << m.heads << " --kv-heads " << m.kv_heads << " --ff " << m.ff << ") at " << path << "\n";
      std::ostringstream quiet;
      run_init_model(make, quiet);
    }
    return path;
  }
  if (what == "demo-data.jsonl") return cached_embedded_copy("demo.jsonl", "demo-data");
  if (what == "demo-val.jsonl") return cached_embedded_copy("demo-val.jsonl", "demo-val");
  throw std::invalid_argument("'" + name + "' is not a builtin (builtin:demo-model, builtin:demo-data.jsonl, "
                              "builtin:demo-val.jsonl)");
}

void validate_train_options(const TrainOptions& o) {
  if (o.model.empty()) fail_option("model", "no model given (a GGUF file, or builtin:demo-model)");
  if (o.model.rfind("builtin:", 0) != 0 && !fs::is_regular_file(o.model))
    fail_option("model", "'" + o.model + "' does not exist or is not a file");
  if (o.data.empty()) fail_option("data", "no training data given (a .txt or .jsonl file)");
  if (o.data.rfind("builtin:", 0) != 0 && !fs::is_regular_file(o.data))
    fail_option("data", "'" + o.data + "' does not exist or is not a file");
  if (!o.val_data.empty() && o.val_data.rfind("builtin:", 0) != 0 && !fs::is_regular_file(o.val_data))
    fail_option("val-data", "'" + o.val_data + "' does not exist or is not a file");
  if (o.out.empty()) fail_option("out", "no output directory given");
  if (o.lora_rank < 1) fail_option("lora-rank", "must be at least 1, not " + std::to_string(o.lora_rank));
  if (!(o.lora_alpha > 0)) fail_option("lora-alpha", "must be positive");
  if (!(o.lora_dropout >= 0 && o.lora_dropout < 1)) fail_option("lora-dropout", "must lie in [0, 1)");
  if (o.lora_targets.empty()) fail_option("lora-targets", "no targets");
  for (const std::string& t : o.lora_targets) {
    const auto& all = model::all_lora_targets();
    if (std::find(all.begin(), all.end(), t) == all.end() && t != "qkv" && t != "gate_up")
      fail_option("lora-targets", "'" + t + "' is not one of q, k, v, o, gate, up, down (qkv, gate_up: fused projections)");
  }
  if (o.lora_init != "kaiming" && o.lora_init != "gaussian")
    fail_option("lora-init", "'" + o.lora_init + "' is not kaiming or gaussian");
  if (!(o.lr >= 0)) fail_option("lr", "must be non-negative");
  train::ScheduleConfig sc{o.schedule, o.warmup_steps, o.warmup_ratio, o.min_lr};
  try {
    train::validate(sc, o.lr);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("schedule: ") + e.what());
  }
  if (!(o.adam_beta1 >= 0 && o.adam_beta1 < 1)) fail_option("adam-beta1", "must lie in [0, 1)");
  if (!(o.adam_beta2 >= 0 && o.adam_beta2 < 1)) fail_option("adam-beta2", "must lie in [0, 1)");
  if (!(o.adam_eps >= 0)) fail_option("adam-eps", "must be non-negative");
  if (!(o.weight_decay >= 0)) fail_option("weight-decay", "must be non-negative");
  if (!(o.grad_clip >= 0)) fail_option("grad-clip", "must be non-negative (0: no clipping)");
  if (o.batch_size < 1) fail_option("batch-size", "must be at least 1");
  if (o.grad_accum < 1) fail_option("grad-accum", "must be at least 1");
  if (o.seq_len < 2) fail_option("seq-len", "must be at least 2");
  if (o.steps < 0) fail_option("steps", "must be non-negative (0: from --epochs)");
  if (o.steps == 0 && !(o.epochs > 0)) fail_option("epochs", "must be positive when --steps is not given");
  if (o.eval_every < 0 || o.save_every < 0 || o.eval_batches < 0)
    fail_option(o.eval_every < 0 ? "eval-every" : o.save_every < 0 ? "save-every" : "eval-batches", "must be non-negative");
  if (o.keep_checkpoints < 0) fail_option("keep-checkpoints", "must be non-negative (0: keep all)");
  if (o.log_every < 1) fail_option("log-every", "must be at least 1");
  if (o.vocab_tile < 1) fail_option("vocab-tile", "must be at least 1");
  if (o.keep_ffn_layers < 0) fail_option("keep-ffn-layers", "must be non-negative");
  if (o.keep_ffn_layers > 0 && !o.grad_checkpoint)
    fail_option("keep-ffn-layers", "applies only with --grad-checkpoint (without it every activation is kept)");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) fail_option("val-fraction", "must lie in [0, 1)");
  if (o.sample_tokens < 0) fail_option("sample-max-tokens", "must be non-negative");
  // The output directory: created if missing, and writable (a probe file, removed at once).
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec || !fs::is_directory(o.out))
    fail_option("out", "cannot create directory '" + o.out + "'" + (ec ? ": " + ec.message() : ""));
  const std::string probe = (fs::path(o.out) / ".q4tune-write-probe").string();
  {
    std::ofstream f(probe);
    if (!f || !(f << "probe") || !f.flush())
      fail_option("out", "directory '" + o.out + "' is not writable");
  }
  fs::remove(probe, ec);
  if (o.resume && !o.resume_dir.empty() && !fs::is_directory(o.resume_dir))
    fail_option("resume", "'" + o.resume_dir + "' is not a directory");
  if (!o.tensorboard.empty()) {
    fs::create_directories(o.tensorboard, ec);
    if (ec || !fs::is_directory(o.tensorboard))
      fail_option("tensorboard", "cannot create directory '" + o.tensorboard + "'" + (ec ? ": " + ec.message() : ""));
  }
}

namespace {

// The text on one line and printable: newlines and tabs as \n and \t, other control bytes and bytes that are not
// UTF-8 as \xNN (a random model's output can be anything).
std::string one_line(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    for (size_t k = 1; k < len; ++k)
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) len = 0;
    if (c == '\n' || c == '\t') {
      out += c == '\n' ? "\\n" : "\\t";
    } else if (len == 0 || c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", unsigned(c));
      out += hex;
      len = 1;
    } else {
      out.append(s, i, len);
    }
    i += std::max<size_t>(len, 1);
  }
  return out;
}

// The directories a start creates (--out and --tensorboard with their missing parents, deepest first), removed
// again when the run leaves them empty, so that a failed start leaves nothing behind.
struct RemoveIfEmpty {
  std::vector<fs::path> dirs;
  void add(const std::string& dir) {
    std::error_code ec;
    for (fs::path p = fs::absolute(dir, ec); !ec && !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      dirs.push_back(p);
      if (p == p.parent_path()) break;
    }
  }
  ~RemoveIfEmpty() {
    std::error_code ec;
    for (const fs::path& d : dirs)
      if (fs::is_directory(d, ec) && fs::is_empty(d, ec)) fs::remove(d, ec);
  }
};

}  // namespace

int run_train(const TrainOptions& opt, std::ostream& out) {
  if (opt.print_config) {
    out << opt.effective_config;
    return 0;
  }
  RemoveIfEmpty made;
  made.add(opt.out);
  if (!opt.tensorboard.empty()) made.add(opt.tensorboard);
  validate_train_options(opt);
  using Clock = std::chrono::steady_clock;

  // Checkpoints of an earlier run in OUT are never overwritten by a new run.
  std::vector<std::string> warnings;
  std::optional<std::string> ckpt_dir;
  if (opt.resume) {
    ckpt_dir = opt.resume_dir.empty() ? newest_checkpoint(opt.out, &warnings) : std::optional(opt.resume_dir);
    for (const auto& w : warnings) out << "warning: " << w << "\n";
    if (!ckpt_dir) out << "no complete checkpoint under " << opt.out << "/checkpoints: starting from step 0\n";
  } else if (newest_checkpoint(opt.out)) {
    throw std::invalid_argument("--out: '" + opt.out + "' holds checkpoints of an earlier run: pass --resume to "
                                "continue it, or choose another output directory");
  }

  const std::string model_path = resolve_builtin(opt.model, out);
  const std::string data_path = resolve_builtin(opt.data, out);
  const json identity = identity_json(opt, model_path, data_path);
  std::optional<CheckpointState> ckpt;
  if (ckpt_dir) {
    ckpt = load_checkpoint(*ckpt_dir);
    const json had = json::parse(ckpt->config_json);
    // A key that an older checkpoint does not record had its default then.
    const json defaults = identity_json(TrainOptions{}, model_path, data_path);
    std::string diff;
    for (auto it = identity.begin(); it != identity.end(); ++it) {
      const json& was = had.contains(it.key()) ? had[it.key()] : defaults[it.key()];
      if (was != it.value())
        diff += (diff.empty() ? "" : ", ") + it.key() + " was " + was.dump() + ", now " + it.value().dump();
    }
    if (!diff.empty())
      throw std::invalid_argument("--resume: checkpoint " + *ckpt_dir + " is from a run with other options (" + diff +
                                  "); resume with the same options, or start a new run in another --out");
  }

  // Device, model, tokenizer, data.
  q4t::cpu::set_num_threads(opt.threads);
  DeviceChoice dev = choose_device(opt.device);
  dev.set_precision(opt.precision);
  auto be = dev.is_cpu() ? ag::Backend::cpu() : ag::Backend::vulkan(*dev.vulkan, dev.precision);
  auto file = gguf::File::open(model_path);
  auto tok = tok::Tokenizer::from_gguf(*file);
  auto model = model::Model::load(model_path, *be);
  check_vocab(*tok, *model, model_path);
  const model::ModelConfig& mc = model->config();
  if (opt.keep_ffn_layers > mc.n_layer)
    fail_option("keep-ffn-layers", std::to_string(opt.keep_ffn_layers) + " exceeds the model's layer count (" +
                                       std::to_string(mc.n_layer) + ")");
  out << "model " << model_path << ": " << mc.arch << ", " << train::plural(mc.n_layer, "layer") << ", dim " << mc.n_embd << ", "
      << train::fmt_bytes(model->weight_bytes()) << " of weights on " << dev.name() << ", " << dev.precision_text()
      << "\n";

  data::DatasetOptions dopt;
  dopt.seq_len = opt.seq_len;
  dopt.pack = opt.pack;
  dopt.train_on_prompt = opt.train_on_prompt;
  dopt.no_truncate = opt.no_truncate;
  dopt.chat_template = opt.chat_template;
  dopt.format = opt.data_format;
  dopt.val_fraction = opt.val_fraction;
  dopt.val_file = opt.val_data.empty() ? "" : resolve_builtin(opt.val_data, out);
  dopt.seed = opt.seed;
  data::Datasets ds = data::load_datasets(data_path, *tok, dopt, out);
  if (ds.train.size() == 0) throw std::runtime_error(data_path + ": no training examples");
  out << data::padding_report(ds.train) << "\n";

  const int64_t B = opt.batch_size, K = opt.grad_accum;
  const int64_t rows_per_step = B * K;
  const int64_t total_steps =
      opt.steps > 0 ? opt.steps : std::max<int64_t>(1, int64_t(std::ceil(opt.epochs * double(ds.train.size()) / double(rows_per_step))));

  // The graph: the model, adapters on the targets, the fused loss.
  LossGraph lg(*model, B, opt.seq_len, opt.vocab_tile,
               opt.grad_checkpoint ? LossGraph::Memory::Recompute : LossGraph::Memory::Planned);
  lg.model_graph().keep_ffn_layers(opt.keep_ffn_layers);
  model::LoraSpec spec;
  spec.targets = opt.lora_targets;
  spec.cfg.rank = opt.lora_rank;
  spec.cfg.alpha = opt.lora_alpha;
  spec.cfg.dropout = opt.lora_dropout;
  spec.cfg.rslora = opt.rslora;
  spec.cfg.init = opt.lora_init == "gaussian" ? ag::LoraConfig::Init::Gaussian : ag::LoraConfig::Init::Kaiming;
  std::mt19937 init_rng(uint32_t(opt.seed));
  lg.model_graph().add_adapters(spec, init_rng);
  lg.build();
  ag::Graph& g = lg.graph();
  ag::AdamW adam(g, {opt.lr, opt.adam_beta1, opt.adam_beta2, opt.adam_eps, opt.weight_decay});
  const std::vector<ag::Var>& params = adam.params();
  int64_t n_trainable = 0;
  for (const ag::Var& p : params) n_trainable += p.value().numel();

  const train::ScheduleConfig sched{opt.schedule, opt.warmup_steps, opt.warmup_ratio, opt.min_lr};
  json schedule_json = {{"schedule", opt.schedule}, {"warmup_steps", opt.warmup_steps},
                        {"warmup_ratio", opt.warmup_ratio}, {"min_lr", opt.min_lr}, {"total_steps", total_steps}};

  int64_t step = 0;
  uint64_t micro_index = 0;  // micro-batches so far: the dropout salt's counter
  int64_t tokens_seen = 0;
  double elapsed_before = 0;
  if (ckpt) {
    const auto lora = checkpoint_values(*ckpt_dir, "lora.bin", g, params, ckpt->lora);
    for (size_t i = 0; i < params.size(); ++i) be->upload(g.node(params[i].id).value, lora[i]);
    adam.load_state(checkpoint_values(*ckpt_dir, "adam_m.bin", g, params, ckpt->adam_m),
                    checkpoint_values(*ckpt_dir, "adam_v.bin", g, params, ckpt->adam_v), ckpt->adam_t);
    ds.train.set_cursor(ckpt->cursor);
    step = ckpt->step;
    if (ckpt->rng_state.size() != 2 || ckpt->rng_state[0] != opt.seed)
      throw std::runtime_error(*ckpt_dir + "/state.json: rng_state does not hold this run's (seed, micro-batch) pair");
    micro_index = ckpt->rng_state[1];
    const json sj = json::parse(ckpt->schedule_json);
    tokens_seen = sj.value("tokens_seen", int64_t(0));
    // Checkpoints written before state.json had elapsed_s kept it in schedule_json.
    elapsed_before = ckpt->elapsed_s > 0 ? ckpt->elapsed_s : sj.value("elapsed_s", 0.0);
    out << "resuming from " << *ckpt_dir << " (step " << step << " of " << total_steps << ")\n";
  }
  out << "training " << train::plural(int64_t(params.size() / 2), "adapter") << " ("
      << train::plural(n_trainable, "parameter") << ", rank " << opt.lora_rank << ") for "
      << train::plural(total_steps, "step") << " of " << K << " x [" << B << ", " << opt.seq_len << "] tokens, "
      << train::plural(int64_t(ds.train.size()), "row") << " per epoch\n";

  // Run log: metrics.jsonl (a resumed run keeps the lines up to its checkpoint), loss.svg, progress.
  const std::string metrics_path = (fs::path(opt.out) / "metrics.jsonl").string();
  const std::string svg_path = (fs::path(opt.out) / "loss.svg").string();
  train::MetricsLog metrics =
      train::MetricsLog::open(metrics_path, ckpt ? std::optional<int64_t>(step) : std::nullopt);
  if (!opt.tensorboard.empty())
    metrics.tee_tensorboard(
        train::TfEventsWriter::create(opt.tensorboard, ckpt ? std::optional<int64_t>(step) : std::nullopt));
  const std::string title = "q4tune train: " + fs::path(opt.out).filename().string();
  auto redraw = [&] {
    const train::LossSeries& series = metrics.series();
    train::write_loss_svg(svg_path, series.train, series.val, title, series.lr);
  };
  out.flush();
  train::ProgressOptions popt;
  popt.total_steps = total_steps;
  popt.start_step = step;
  popt.log_every = opt.log_every;
  popt.elapsed_before = elapsed_before;
  train::Progress progress(stdout, popt);

  auto save = [&](const std::string& why) {
    CheckpointState s;
    s.step = step;
    s.lora = named(g, params, param_values(*be, params));
    s.adam_m = named(g, params, adam.moments_m());
    s.adam_v = named(g, params, adam.moments_v());
    s.adam_t = adam.t();
    s.lr_base = opt.lr;
    json sj = schedule_json;
    sj["tokens_seen"] = tokens_seen;
    s.schedule_json = sj.dump();
    s.elapsed_s = progress.elapsed_s();
    s.rng_state = {opt.seed, micro_index};
    s.cursor = ds.train.cursor();
    s.config_json = identity.dump();
    save_checkpoint(opt.out, s, int(opt.keep_checkpoints));
    progress.message("saved checkpoint " + opt.out + "/checkpoints/step-" + std::to_string(step) + " (" + why + ")");
  };

  auto run_eval_now = [&] {
    if (!ds.val) return;
    const EvalResult r = evaluate(lg, *ds.val, opt.eval_batches);
    if (!std::isfinite(r.loss)) {
      progress.message("eval at step " + std::to_string(step) + ": no counted tokens in the validation set");
      return;
    }
    metrics.log_eval(step, r.loss, {{"val_tokens", r.tokens}});
    char line[160];
    std::snprintf(line, sizeof line, "eval at step %lld: val_loss %.4f, perplexity %.2f (%s)",
                  static_cast<long long>(step), r.loss, std::exp(r.loss),
                  train::plural(int64_t(r.tokens), "token").c_str());
    progress.message(line);
    redraw();
  };

  InterruptGuard guard;
  std::vector<data::Batch> micro(static_cast<size_t>(K));
  const ag::Tensor salt_tensor = lg.model_graph().dropout_salt().g ? lg.model_graph().dropout_salt().value() : ag::Tensor();
  const auto loop_start = Clock::now();
  const int64_t first_step = step;
  int64_t loop_tokens = 0;
  double first_loss = std::nan(""), last_loss = std::nan("");
  bool interrupted = false;

  while (step < total_steps) {
    if (g_interrupts > 0) {
      interrupted = true;
      break;
    }
    const auto t0 = Clock::now();
    const double lr = train::lr_at(step, total_steps, opt.lr, sched);
    for (auto& b : micro) b = ds.train.next_batch(B);
    const StepLoss sl = accumulate_gradients(lg, micro, [&](size_t i) {
      if (!salt_tensor.defined()) return;
      const uint64_t salt = splitmix64(opt.seed ^ splitmix64(micro_index + i));
      const int32_t s[2] = {int32_t(uint32_t(salt)), int32_t(uint32_t(salt >> 32))};
      ag::Tensor t = salt_tensor;
      be->upload_i32(t, s);
    });
    micro_index += uint64_t(K);
    const double loss = sl.loss;
    const int64_t n_real = sl.real_tokens;
    if (!std::isfinite(loss))
      throw std::runtime_error("step " + std::to_string(step + 1) + ": the loss is " + std::to_string(loss) +
                               "; stopped without saving (the last good checkpoint, if any, is kept under " +
                               opt.out + "/checkpoints)");
    const double norm = opt.grad_clip > 0 ? adam.clip(opt.grad_clip) : adam.grad_norm();
    if (!std::isfinite(norm))
      throw std::runtime_error("step " + std::to_string(step + 1) + ": the gradient norm is " + std::to_string(norm) +
                               "; stopped without saving (the last good checkpoint, if any, is kept under " +
                               opt.out + "/checkpoints)");
    adam.step(lr);
    ++step;
    tokens_seen += n_real;
    loop_tokens += n_real;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double tok_s = double(n_real) / std::max(dt, 1e-9);
    if (step == first_step + 1) first_loss = loss;
    last_loss = loss;
    metrics.log_train(step, loss, lr, tok_s,
                      {{"grad_norm", norm}, {"tokens", tokens_seen}, {"epoch", ds.train.cursor().epoch},
                       {"elapsed_s", progress.elapsed_s()}});
    progress.update(step, loss, lr, double(loop_tokens) / std::chrono::duration<double>(Clock::now() - loop_start).count());
    if (step % opt.log_every == 0 || step == total_steps) redraw();
    if (opt.eval_every > 0 && step % opt.eval_every == 0 && step < total_steps) run_eval_now();
    if (opt.save_every > 0 && step % opt.save_every == 0 && step < total_steps) save("every " + train::plural(opt.save_every, "step"));
  }

  if (interrupted) {
    save("interrupted");
    progress.finish();
    out << "interrupted at step " << step << " of " << total_steps << "; continue with --resume\n";
    return 130;
  }
  run_eval_now();
  save("final");
  redraw();
  progress.finish();

  // Exports.
  const model::ModelGraph& mg = lg.model_graph();
  const std::string gguf_path = (fs::path(opt.out) / "adapter.gguf").string();
  export_gguf_adapter(mg, opt.lora_alpha, gguf_path, ds.chat_template);
  ExportInfo info;
  info.alpha = opt.lora_alpha;
  info.rslora = opt.rslora;
  info.dropout = opt.lora_dropout;
  info.base_model = opt.hf_base_model.empty() ? base_model_name(*file) : opt.hf_base_model;
  export_peft(mg, info, (fs::path(opt.out) / "peft").string());

  const double train_s = std::chrono::duration<double>(Clock::now() - loop_start).count();
  out << "wrote " << gguf_path << " (llama.cpp --lora) and " << (fs::path(opt.out) / "peft").string()
      << "/ (PEFT)\n";
  const std::string steps_run = step == first_step + 1
                                    ? "step " + std::to_string(step)
                                    : "steps " + std::to_string(first_step + 1) + ".." + std::to_string(step);
  char line[256];
  std::snprintf(line, sizeof line, "loss %.4f -> %.4f over %s; %s in %.1f s (%.1f tok/s)", first_loss, last_loss,
                steps_run.c_str(), train::plural(loop_tokens, "token").c_str(), train_s,
                double(loop_tokens) / std::max(train_s, 1e-9));
  out << line << "\n";
  out << "peak memory: " << dev.name() << " "
      << (dev.is_cpu() ? train::fmt_bytes(train::peak_rss_bytes()) + " (process RSS)"
                       : train::fmt_bytes(dev.vulkan->peak_bytes_allocated()) + " allocated; host " +
                             train::fmt_bytes(train::peak_rss_bytes()) + " RSS")
      << "\n";

  if (!opt.sample_prompts.empty() && opt.sample_tokens > 0) {
    // Each prompt answered greedily by the base model and with the adapter. Conversations trained through a chat
    // template: the prompt is a user turn in that template, and the answer ends with the turn.
    auto text_of = [&](int32_t id) { return id >= 0 ? tok->token_text(id) : std::string(); };
    std::optional<chat::Template> tmpl;
    if (!ds.chat_template.empty()) tmpl = chat::template_by_name(ds.chat_template);
    const int64_t ctx = std::min<int64_t>(mc.n_ctx, 1024);
    model::Decoder base(*model, {}, ctx), adapted(*model, model::adapter_weights(mg), ctx);
    SampleOptions so;
    so.max_tokens = opt.sample_tokens;
    so.temperature = 0;
    out << "samples (greedy" << (tmpl ? ", " + ds.chat_template + " template" : std::string())
        << "), by the base model and with the adapter:\n";
    for (size_t i = 0; i < opt.sample_prompts.size(); ++i) {
      const std::string& user = opt.sample_prompts[i];
      std::string prompt = user;
      PromptOptions po;
      if (tmpl) {
        prompt = chat::generation_prompt(*tmpl, {{"user", user}}, text_of(tok->bos()), text_of(tok->eos()));
        po = {true, chat::turn_end(*tmpl, text_of(tok->eos()))};
      }
      const std::string base_text = generate(base, *tok, prompt, so, nullptr, po).text;
      const std::string adapted_text = generate(adapted, *tok, prompt, so, nullptr, po).text;
      out << "  " << one_line(user) << "\n    base model:   " << one_line(base_text)
          << "\n    with adapter: " << one_line(adapted_text) << "\n";
    }
  }
  return 0;
}

}  // namespace q4t
