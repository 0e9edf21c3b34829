// q4tune train: the options' checks, the builtin demo names, and run_train, which drives a Trainer (trainer.h)
// until the last step or Ctrl-C.
#include "train/train.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/atomic_file.h"
#include "data/checksum.h"
#include "data/dataset_cache.h"
#include "train/commands.h"
#include "train/distributed.h"
#include "train/embedded.h"
#include "train/run_log.h"
#include "train/schedule.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

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

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Writes and removes a small file in dir; "" when that worked, else the system's reason (a full disk says "No
// space left on device"). The probe never outlives the call.
std::string write_probe(const std::string& dir) {
  const std::string probe = (fs::path(dir) / ".q4tune-write-probe").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  const char data[] = "probe";
  const ssize_t n = ::write(fd, data, sizeof data);
  int err = n < 0 ? errno : n != ssize_t(sizeof data) ? ENOSPC : 0;
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  ::unlink(probe.c_str());
  return err == 0 ? "" : std::strerror(err);
}

void fail_option(const std::string& name, const std::string& what) {
  throw std::invalid_argument("--" + name + ": " + what);
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
  if (const std::string why = write_probe(o.out); !why.empty())
    fail_option("out", "cannot write in directory '" + o.out + "': " + why);
  if (o.resume && !o.resume_dir.empty() && !fs::is_directory(o.resume_dir))
    fail_option("resume", "'" + o.resume_dir + "' is not a directory");
  if (!o.tensorboard.empty()) {
    fs::create_directories(o.tensorboard, ec);
    if (ec || !fs::is_directory(o.tensorboard))
      fail_option("tensorboard", "cannot create directory '" + o.tensorboard + "'" + (ec ? ": " + ec.message() : ""));
  }
}

int run_train(const TrainOptions& opt, std::ostream& out) {
  if (opt.print_config) {
    out << opt.effective_config;
    return 0;
  }
  const dist::World& world = dist::World::init();
  std::ostream quiet(nullptr);  // the other ranks of a data-parallel run: rank 0 reports
  std::ostream& log = world.root() ? out : quiet;
  RemoveIfEmpty made;
  if (world.root()) made.add(opt.out);
  if (world.root() && !opt.tensorboard.empty()) made.add(opt.tensorboard);
  dist::on_every_rank(world, [&] { validate_train_options(opt); });
  Trainer trainer(opt, log);
  InterruptGuard guard;
  while (!trainer.done()) {
    if (trainer.stop_requested(g_interrupts > 0)) {
      trainer.stop_interrupted();
      return 130;
    }
    trainer.step();
    const int64_t step = trainer.steps_done();
    if (opt.eval_every > 0 && step % opt.eval_every == 0 && !trainer.done()) trainer.evaluate();
    if (opt.save_every > 0 && step % opt.save_every == 0 && !trainer.done())
      trainer.save("every " + train::plural(opt.save_every, "step"));
  }
  trainer.finish();
  return 0;
}

}  // namespace q4t
