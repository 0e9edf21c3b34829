// q4tune train's run (trainer.h): setup and resume, the step, evaluation, checkpoints, exports and samples.
#include "train/trainer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "data/chat_template.h"
#include "data/checksum.h"
#include "data/splitmix.h"
#include "kernels/cpu/threads.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/generate.h"
#include "train/memory_estimate.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace q4t {

namespace {

// The options that decide the numbers a run computes: a resume must match all of them.
json identity_json(const TrainOptions& o, const std::string& model_path, const std::string& data_path) {
  // (Checkpoints of one process from before data parallelism record batch-size and grad-accum instead of
  // rows-per-step: load_matching_checkpoint reads their product.)
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
  // The rows of one optimizer step, over every rank: how they split into ranks, micro-batches and rows per
  // micro-batch changes the sums' order only, so a run may resume with another split (and other ranks).
  j["rows-per-step"] = o.batch_size * o.grad_accum * dist::World::get().size();
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

// Whether name is a temp file of base as write_file_atomic (6 letters and digits) or the GGUF writer (8 hex
// digits) names it.
bool is_temp_of(const std::string& name, const std::string& base) {
  const std::string head = base + ".tmp-";
  if (name.size() < head.size() + 6 || name.size() > head.size() + 8 || name.rfind(head, 0) != 0) return false;
  return std::all_of(name.begin() + int64_t(head.size()), name.end(), [](char c) { return std::isalnum(uint8_t(c)); });
}

// What a run killed midway leaves in OUT: hidden copies of checkpoints (one may be the only whole copy of its
// step, and is put back), half-deleted checkpoints, and the temp files of the exports, the run log and the loss
// chart. Only these names are touched.
void tidy_out_dir(const std::string& out_dir, std::ostream& out) {
  const CheckpointRepair repair = recover_checkpoints(out_dir);
  for (const std::string& dir : repair.recovered) out << "recovered " << dir << " from an interrupted save\n";
  int64_t removed = int64_t(repair.removed.size());
  const std::pair<const char*, std::vector<std::string>> written[] = {
      {"", {"adapter.gguf", "metrics.jsonl", "loss.svg"}},
      {"peft", {"adapter_model.safetensors", "adapter_config.json"}}};
  std::error_code ec;
  for (const auto& [sub, bases] : written) {
    const fs::path dir = fs::path(out_dir) / sub;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const bool temp = std::any_of(bases.begin(), bases.end(), [&](const auto& b) { return is_temp_of(name, b); });
      std::error_code rm;
      if (temp && it->is_regular_file(rm) && fs::remove(it->path(), rm)) ++removed;
    }
  }
  if (removed > 0)
    out << "removed " << train::plural(removed, "leftover") << " of an interrupted run from " << out_dir << "\n";
}

// The checkpoint a run continues from: with --resume, DIR or the newest complete one under --out (none: the run
// starts at step 0). Without --resume, checkpoints of an earlier run in --out are an error: they are never
// overwritten by a new run.
std::optional<std::string> find_checkpoint(const TrainOptions& opt, std::ostream& out) {
  tidy_out_dir(opt.out, out);
  if (!opt.resume) {
    if (newest_checkpoint(opt.out))
      throw std::invalid_argument("--out: '" + opt.out + "' holds checkpoints of an earlier run: pass --resume to "
                                  "continue it, or choose another output directory");
    return std::nullopt;
  }
  std::vector<std::string> warnings;
  std::optional<std::string> dir =
      opt.resume_dir.empty() ? newest_checkpoint(opt.out, &warnings) : std::optional(opt.resume_dir);
  for (const auto& w : warnings) out << "warning: " << w << "\n";
  if (!dir) out << "no complete checkpoint under " << opt.out << "/checkpoints: starting from step 0\n";
  return dir;
}

// A data file of the run and the XXH3 of its bytes (16 hex digits; "" when it cannot be read, which loading the
// data then reports), as checkpoints record it under key.
struct DataFile {
  std::string key, path, xxh3;
};

DataFile data_file(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {key, path, ""};
  Checksum64 h;
  std::vector<char> chunk(size_t(1) << 20);
  while (in.read(chunk.data(), std::streamsize(chunk.size())) || in.gcount() > 0)
    h.bytes(chunk.data(), size_t(in.gcount()));
  if (in.bad()) return {key, path, ""};
  return {key, path, hex64(h.digest())};
}

// Refuses a resume on data that changed since the checkpoint in dir was written (same options, other rows); a
// checkpoint from before digests were recorded resumes with a warning.
void check_data_unchanged(const std::string& dir, const json& had, const std::vector<DataFile>& files,
                          std::ostream& out) {
  if (!had.contains(files.front().key)) {
    out << "warning: checkpoint " << dir << " records no digest of its data (an older q4tune wrote it): resuming "
        << "without checking that " << files.front().path << " is unchanged\n";
    return;
  }
  for (const DataFile& f : files) {
    const json was = had.contains(f.key) ? had[f.key] : json();
    if (!f.xxh3.empty() && was != f.xxh3)
      throw std::invalid_argument("--resume: " + f.path + " has changed since checkpoint " + dir +
                                  " was written (its XXH3 was " + was.dump() + ", now \"" + f.xxh3 +
                                  "\"); resume on the data the run started with, or start a new run in another --out");
  }
}

// The checkpoint in dir; throws std::invalid_argument listing each option of identity it was written with
// otherwise, or naming a data file that changed since.
CheckpointState load_matching_checkpoint(const std::string& dir, const json& identity, const std::string& model_path,
                                         const std::vector<DataFile>& data, std::ostream& out) {
  CheckpointState ckpt = load_checkpoint(dir);
  const std::string& data_path = data.front().path;
  const json had = json::parse(ckpt.config_json);
  // A key that an older checkpoint does not record had its default then.
  const json defaults = identity_json(TrainOptions{}, model_path, data_path);
  std::string diff;
  json older = had;
  if (!older.contains("rows-per-step") && older.contains("batch-size"))
    older["rows-per-step"] = older["batch-size"].get<int64_t>() * older.value("grad-accum", int64_t(1));
  for (auto it = identity.begin(); it != identity.end(); ++it) {
    const json& was = older.contains(it.key()) ? older[it.key()] : defaults[it.key()];
    if (was != it.value())
      diff += (diff.empty() ? "" : ", ") + it.key() + " was " + was.dump() + ", now " + it.value().dump() +
              (it.key() == "rows-per-step" ? " (ranks x --batch-size x --grad-accum)" : "");
  }
  if (!diff.empty())
    throw std::invalid_argument("--resume: checkpoint " + dir + " is from a run with other options (" + diff +
                                "); resume with the same options, or start a new run in another --out");
  check_data_unchanged(dir, had, data, out);
  return ckpt;
}

model::LoraSpec lora_spec(const TrainOptions& opt) {
  model::LoraSpec spec;
  spec.targets = opt.lora_targets;
  spec.cfg.rank = opt.lora_rank;
  spec.cfg.alpha = opt.lora_alpha;
  spec.cfg.dropout = opt.lora_dropout;
  spec.cfg.rslora = opt.rslora;
  spec.cfg.init = opt.lora_init == "gaussian" ? ag::LoraConfig::Init::Gaussian : ag::LoraConfig::Init::Kaiming;
  return spec;
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

// The text on one line and printable: newlines and tabs as \n and \t, other control bytes and bytes that are not
// UTF-8 as \xNN (a random model's output can be anything).
std::string shortened(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

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

}  // namespace

Trainer::Trainer(const TrainOptions& opt, std::ostream& out)
    : opt_(opt), out_(out), world_(dist::World::init()),
      sched_{opt.schedule, opt.warmup_steps, opt.warmup_ratio, opt.min_lr} {
  setup(opt, out);
  const std::vector<ag::Var>& params = adam_->params();
  int64_t n_trainable = 0;
  for (const ag::Var& p : params) n_trainable += p.value().numel();
  out_ << "training " << train::plural(int64_t(params.size() / 2), "adapter") << " ("
       << train::plural(n_trainable, "parameter") << ", rank " << opt.lora_rank << ") for "
       << train::plural(total_steps_, "step") << " of " << opt.grad_accum << " x [" << opt.batch_size << ", "
       << opt.seq_len << "] tokens" << (world_.distributed() ? " on each of " + std::to_string(world_.size()) + " ranks" : "")
       << ", " << train::plural(int64_t(ds_->train.size()), "row") << " per epoch\n";
  if (flat_)
    out_ << "the ranks sum their gradients in " << train::plural(int64_t(flat_->bucket_count()), "bucket")
         << (flat_->sums_during_backward() ? " while the backward runs\n" : " after the backward\n");
  if (world_.root()) open_log(ckpt_resumed_);
}

// Where the run continues from, the model, the data and the graph. In a data-parallel run rank 0 alone tidies
// --out, picks the checkpoint and makes the builtin files; then every rank loads them, any rank's failure stops
// all of them with its message, and the ranks must agree on what they loaded.
void Trainer::setup(const TrainOptions& opt, std::ostream& out) {
  json picked;  // rank 0's choices, for every rank
  dist::on_every_rank(world_, [&] {
    if (!world_.root()) return;
    const std::optional<std::string> dir = find_checkpoint(opt, out);
    picked = {{"checkpoint", dir ? json(*dir) : json()},
              {"model", resolve_builtin(opt.model, out)},
              {"data", resolve_builtin(opt.data, out)},
              {"val", opt.val_data.empty() ? "" : resolve_builtin(opt.val_data, out)}};
  });
  picked = json::parse(world_.broadcast(picked.dump()));
  model_path_ = picked["model"];
  data_path_ = picked["data"];
  val_path_ = picked["val"];
  const std::optional<std::string> ckpt_dir =
      picked["checkpoint"].is_null() ? std::nullopt : std::optional<std::string>(picked["checkpoint"]);
  dist::on_every_rank(world_, [&] {
    identity_ = identity_json(opt, model_path_, data_path_);
    std::vector<DataFile> data = {data_file("data-xxh3", data_path_)};
    if (!val_path_.empty()) data.push_back(data_file("val-data-xxh3", val_path_));
    for (const DataFile& f : data) data_digests_[f.key] = f.xxh3;
    std::optional<CheckpointState> ckpt;
    if (ckpt_dir) ckpt = load_matching_checkpoint(*ckpt_dir, identity_, model_path_, data, out);
    load_model();
    load_data();
    check_sample_prompts();
    build_graph();
    if (ckpt) restore(*ckpt_dir, *ckpt);
    ckpt_resumed_ = ckpt.has_value();
  });
  check_ranks_agree();
}

// XXH3 of the adapters' values (every rank holds the same ones in a data-parallel run).
std::string Trainer::adapters_digest() const {
  Checksum64 h;
  for (const std::vector<float>& v : param_values(*be_, adam_->params())) h.bytes(v.data(), v.size() * sizeof(float));
  return hex64(h.digest());
}

// Every rank must train the same run: the same options and files, the same data rows, the same adapters. A rank
// that differs (another file at the same path on another machine, say) stops the job, named.
void Trainer::check_ranks_agree() const {
  if (!world_.distributed()) return;
  const json mine = {{"identity", identity_},         {"data", data_digests_},
                     {"rows", ds_->train.size()},     {"step", step_},
                     {"adapters", adapters_digest()}, {"steps", total_steps_}};
  const std::vector<std::string> all = world_.all_gather(mine.dump());
  const std::vector<std::string> hosts = world_.all_gather(world_.host());
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const json a = json::parse(all[0]), b = json::parse(all[r]);
    std::string what;
    for (auto it = a.begin(); it != a.end(); ++it)
      if (b.value(it.key(), json()) != it.value()) what += (what.empty() ? "" : ", ") + it.key();
    throw dist::JobError("rank " + std::to_string(r) + " (on " + hosts[r] + ") does not train what rank 0 (on " +
                         hosts[0] + ") trains: its " + what +
                         " differ; every rank needs the same model, data and options at the same paths");
  }
}

// Device, model, tokenizer.
void Trainer::load_model() {
  q4t::cpu::set_num_threads(rank_threads(opt_.threads));
  dev_ = choose_rank_device(opt_.device, opt_.allow_shared_device);
  dev_.set_precision(opt_.precision);
  be_ = dev_.backend();
  file_ = gguf::File::open(model_path_);
  tok_ = tok::Tokenizer::from_gguf(*file_);
  model_ = train::load_model_that_fits(*file_, *be_);
  check_vocab(*tok_, *model_, model_path_);
  const model::ModelConfig& mc = model_->config();
  if (opt_.keep_ffn_layers > mc.n_layer)
    throw std::invalid_argument("--keep-ffn-layers: " + std::to_string(opt_.keep_ffn_layers) +
                                " exceeds the model's layer count (" + std::to_string(mc.n_layer) + ")");
  out_ << "model " << model_path_ << ": " << mc.arch << ", " << train::plural(mc.n_layer, "layer") << ", dim "
       << mc.n_embd << ", " << train::fmt_bytes(model_->weight_bytes()) << " of weights on " << dev_.name() << ", "
       << dev_.precision_text() << "\n";
}

// The training and validation rows, and the run's length in steps.
void Trainer::load_data() {
  data::DatasetOptions dopt;
  dopt.seq_len = opt_.seq_len;
  dopt.pack = opt_.pack;
  dopt.train_on_prompt = opt_.train_on_prompt;
  dopt.no_truncate = opt_.no_truncate;
  dopt.chat_template = opt_.chat_template;
  dopt.format = opt_.data_format;
  dopt.val_fraction = opt_.val_fraction;
  dopt.val_file = val_path_;
  dopt.seed = opt_.seed;
  ds_ = data::load_datasets(data_path_, *tok_, dopt, out_);
  if (ds_->train.size() == 0) throw std::runtime_error(data_path_ + ": no training examples");
  out_ << data::padding_report(ds_->train) << "\n";
  const int64_t rows_per_step = opt_.batch_size * opt_.grad_accum * world_.size();
  total_steps_ = opt_.steps > 0 ? opt_.steps
                                : std::max<int64_t>(1, int64_t(std::ceil(opt_.epochs * double(ds_->train.size()) /
                                                                         double(rows_per_step))));
}

// The graph: the model, adapters on the targets, the fused loss; and the optimizer over the adapters.
void Trainer::build_graph() {
  lg_ = std::make_unique<LossGraph>(*model_, opt_.batch_size, opt_.seq_len, opt_.vocab_tile,
                                    opt_.grad_checkpoint ? LossGraph::Memory::Recompute : LossGraph::Memory::Planned);
  lg_->model_graph().keep_ffn_layers(opt_.keep_ffn_layers);
  std::mt19937 init_rng(uint32_t(opt_.seed));
  lg_->model_graph().add_adapters(lora_spec(opt_), init_rng);
  lg_->build();
  adam_ = std::make_unique<ag::AdamW>(
      lg_->graph(), ag::AdamWConfig{opt_.lr, opt_.adam_beta1, opt_.adam_beta2, opt_.adam_eps, opt_.weight_decay});
  schedule_json_ = {{"schedule", opt_.schedule},         {"warmup_steps", opt_.warmup_steps},
                    {"warmup_ratio", opt_.warmup_ratio}, {"min_lr", opt_.min_lr},
                    {"total_steps", total_steps_}};
  micro_.resize(static_cast<size_t>(opt_.grad_accum));
  if (world_.distributed())
    flat_ = std::make_unique<ag::FlatGrads>(lg_->graph(), lg_->loss(), adam_->params(),
                                            [this](std::span<float> v) { world_.sum(v); },
                                            ag::bucket_floats(opt_.grad_bucket_mb));
  const model::ModelGraph& mg = lg_->model_graph();
  if (mg.dropout_salt().g) salt_tensor_ = mg.dropout_salt().value();
}

// The adapters, the optimizer's moments, the data cursor and the counters of the checkpoint in dir.
void Trainer::restore(const std::string& dir, const CheckpointState& ckpt) {
  ag::Graph& g = lg_->graph();
  const std::vector<ag::Var>& params = adam_->params();
  const auto lora = checkpoint_values(dir, "lora.bin", g, params, ckpt.lora);
  for (size_t i = 0; i < params.size(); ++i) be_->upload(g.node(params[i].id).value, lora[i]);
  adam_->load_state(checkpoint_values(dir, "adam_m.bin", g, params, ckpt.adam_m),
                    checkpoint_values(dir, "adam_v.bin", g, params, ckpt.adam_v), ckpt.adam_t);
  ds_->train.set_cursor(ckpt.cursor);
  step_ = ckpt.step;
  if (ckpt.rng_state.size() != 2 || ckpt.rng_state[0] != opt_.seed)
    throw std::runtime_error(dir + "/state.json: rng_state does not hold this run's (seed, micro-batch) pair");
  micro_index_ = ckpt.rng_state[1];
  const json sj = json::parse(ckpt.schedule_json);
  tokens_seen_ = sj.value("tokens_seen", int64_t(0));
  // Checkpoints written before state.json had elapsed_s kept it in schedule_json.
  elapsed_before_ = ckpt.elapsed_s > 0 ? ckpt.elapsed_s : sj.value("elapsed_s", 0.0);
  out_ << "resuming from " << dir << " (step " << step_ << " of " << total_steps_ << ")\n";
}

// Run log: metrics.jsonl (a resumed run keeps the lines up to its checkpoint), TensorBoard, progress.
void Trainer::open_log(bool resumed) {
  const std::optional<int64_t> resume_step = resumed ? std::optional<int64_t>(step_) : std::nullopt;
  metrics_.emplace(train::MetricsLog::open((fs::path(opt_.out) / "metrics.jsonl").string(), resume_step));
  if (!opt_.tensorboard.empty()) metrics_->tee_tensorboard(train::TfEventsWriter::create(opt_.tensorboard, resume_step));
  out_.flush();
  train::ProgressOptions popt;
  popt.total_steps = total_steps_;
  popt.start_step = step_;
  popt.log_every = opt_.log_every;
  popt.elapsed_before = elapsed_before_;
  progress_.emplace(stdout, popt);
  loop_start_ = Clock::now();
  first_step_ = step_;
}

// loss.svg from the metrics so far.
void Trainer::redraw() {
  const train::LossSeries& series = metrics_->series();
  const std::string title = "q4tune train: " + fs::path(opt_.out).filename().string();
  train::write_loss_svg((fs::path(opt_.out) / "loss.svg").string(), series.train, series.val, title, series.lr);
}

void Trainer::fail_not_finite(const std::string& what, double value) const {
  const std::string msg = "step " + std::to_string(step_ + 1) + ": the " + what + " is " + std::to_string(value) +
                          "; stopped without saving (the last good checkpoint, if any, is kept under " + opt_.out +
                          "/checkpoints)";
  // Summed over the ranks, the loss and the gradients are the same on every one: so is this failure.
  if (world_.distributed()) throw dist::JobError(msg);
  throw std::runtime_error(msg);
}

// This rank's micro-batches of the step: each is its rows of the next global micro-batch (every rank draws the
// same ones from the same cursor). Returns the counted and the real tokens of the global micro-batches.
std::pair<int64_t, int64_t> Trainer::next_micro_batches() {
  const int64_t B = opt_.batch_size, n = world_.size();
  int64_t counted = 0, real = 0;
  for (auto& b : micro_) {
    data::Batch all = ds_->train.next_batch(B * n);
    counted += all.n_label_tokens();
    for (uint8_t m : all.attn_mask) real += m;
    b = n == 1 ? std::move(all) : batch_rows(all, world_.rank() * B, B);
  }
  return {counted, real};
}

void Trainer::step() {
  const auto t0 = Clock::now();
  const double lr = train::lr_at(step_, total_steps_, opt_.lr, sched_);
  const auto [counted, real_tokens] = next_micro_batches();
  const uint64_t rank_salt = world_.rank() == 0 ? 0 : splitmix64(~uint64_t(world_.rank()));
  StepLoss sl = accumulate_gradients(
      *lg_, micro_,
      [&](size_t i) {
        if (!salt_tensor_.defined()) return;
        const uint64_t salt = splitmix64(opt_.seed ^ splitmix64(micro_index_ + i) ^ rank_salt);
        const int32_t s[2] = {int32_t(uint32_t(salt)), int32_t(uint32_t(salt >> 32))};
        ag::Tensor t = salt_tensor_;
        be_->upload_i32(t, s);
      },
      counted, flat_.get());
  micro_index_ += uint64_t(opt_.grad_accum);
  if (flat_) {  // the ranks' gradients and losses, each a part of the global step's, summed
    double loss = std::isfinite(sl.loss) ? sl.loss : std::nan("");
    world_.sum(std::span<double>(&loss, 1));
    flat_->exchange();
    sl.loss = loss;
  }
  const double loss = sl.loss;
  if (!std::isfinite(loss)) fail_not_finite("loss", loss);
  const double norm = opt_.grad_clip > 0 ? adam_->clip(opt_.grad_clip) : adam_->grad_norm();
  if (!std::isfinite(norm)) fail_not_finite("gradient norm", norm);
  adam_->step(lr);
  ++step_;
  tokens_seen_ += real_tokens;
  loop_tokens_ += real_tokens;
  if (step_ == first_step_ + 1) first_loss_ = loss;
  last_loss_ = loss;
  if (!world_.root()) return;
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const double tok_s = double(real_tokens) / std::max(dt, 1e-9);
  metrics_->log_train(step_, loss, lr, tok_s,
                      {{"grad_norm", norm}, {"tokens", tokens_seen_}, {"epoch", ds_->train.cursor().epoch},
                       {"elapsed_s", progress_->elapsed_s()}});
  progress_->update(step_, loss, lr,
                    double(loop_tokens_) / std::chrono::duration<double>(Clock::now() - loop_start_).count());
  if (step_ % opt_.log_every == 0 || step_ == total_steps_) redraw();
}

void Trainer::evaluate() {
  if (!ds_->val) return;
  EvalResult r = q4t::evaluate(*lg_, *ds_->val, opt_.eval_batches, world_.rank(), world_.size());
  if (world_.distributed()) {  // each rank evaluated its share of the batches
    double parts[2] = {r.sum, double(r.tokens)};
    world_.sum(std::span<double>(parts, 2));
    r.sum = parts[0];
    r.tokens = int64_t(parts[1]);
    r.loss = r.tokens > 0 ? r.sum / double(r.tokens) : std::nan("");
  }
  if (!world_.root()) return;
  if (!std::isfinite(r.loss)) {
    progress_->message("eval at step " + std::to_string(step_) + ": no counted tokens in the validation set");
    return;
  }
  metrics_->log_eval(step_, r.loss, {{"val_tokens", r.tokens}});
  char line[160];
  std::snprintf(line, sizeof line, "eval at step %lld: val_loss %.4f, perplexity %.2f (%s)",
                static_cast<long long>(step_), r.loss, std::exp(r.loss),
                train::plural(int64_t(r.tokens), "token").c_str());
  progress_->message(line);
  redraw();
}

void Trainer::save(const std::string& why) {
  check_ranks_agree();
  if (!world_.root()) return;
  const ag::Graph& g = lg_->graph();
  const std::vector<ag::Var>& params = adam_->params();
  CheckpointState s;
  s.step = step_;
  s.lora = named(g, params, param_values(*be_, params));
  s.adam_m = named(g, params, adam_->moments_m());
  s.adam_v = named(g, params, adam_->moments_v());
  s.adam_t = adam_->t();
  s.lr_base = opt_.lr;
  json sj = schedule_json_;
  sj["tokens_seen"] = tokens_seen_;
  s.schedule_json = sj.dump();
  s.elapsed_s = progress_->elapsed_s();
  s.rng_state = {opt_.seed, micro_index_};
  s.cursor = ds_->train.cursor();
  json config = identity_;
  config.update(data_digests_);
  s.config_json = config.dump();
  save_checkpoint(opt_.out, s, int(opt_.keep_checkpoints));
  progress_->message("saved checkpoint " + opt_.out + "/checkpoints/step-" + std::to_string(step_) + " (" + why + ")");
}

void Trainer::stop_interrupted() {
  save("interrupted");
  if (!world_.root()) return;
  progress_->finish();
  out_ << "interrupted at step " << step_ << " of " << total_steps_ << "; continue with --resume\n";
}

void Trainer::finish() {
  evaluate();
  save("final");
  if (!world_.root()) return;
  redraw();
  progress_->finish();
  export_adapters();
  print_summary();
  if (!opt_.sample_prompts.empty() && opt_.sample_tokens > 0) print_samples();
}

// adapter.gguf (llama.cpp --lora) and peft/.
void Trainer::export_adapters() {
  const model::ModelGraph& mg = lg_->model_graph();
  const std::string gguf_path = (fs::path(opt_.out) / "adapter.gguf").string();
  export_gguf_adapter(mg, opt_.lora_alpha, gguf_path, ds_->chat_template);
  ExportInfo info;
  info.alpha = opt_.lora_alpha;
  info.rslora = opt_.rslora;
  info.dropout = opt_.lora_dropout;
  info.base_model = opt_.hf_base_model.empty() ? base_model_name(*file_) : opt_.hf_base_model;
  export_peft(mg, info, (fs::path(opt_.out) / "peft").string());
}

// The files written, the loss over this process's steps, its speed and the peak memory.
void Trainer::print_summary() {
  const double train_s = std::chrono::duration<double>(Clock::now() - loop_start_).count();
  out_ << "wrote " << (fs::path(opt_.out) / "adapter.gguf").string() << " (llama.cpp --lora) and "
       << (fs::path(opt_.out) / "peft").string() << "/ (PEFT)\n";
  const std::string steps_run = step_ == first_step_ + 1
                                    ? "step " + std::to_string(step_)
                                    : "steps " + std::to_string(first_step_ + 1) + ".." + std::to_string(step_);
  char line[256];
  std::snprintf(line, sizeof line, "loss %.4f -> %.4f over %s; %s in %.1f s (%.1f tok/s)", first_loss_, last_loss_,
                steps_run.c_str(), train::plural(loop_tokens_, "token").c_str(), train_s,
                double(loop_tokens_) / std::max(train_s, 1e-9));
  out_ << line << "\n";
  out_ << "peak memory: " << dev_.name() << " "
       << (dev_.is_cpu() ? train::fmt_bytes(train::peak_rss_bytes()) + " (process RSS)"
                         : train::fmt_bytes(dev_.vulkan->peak_bytes_allocated()) + " allocated; host " +
                               train::fmt_bytes(train::peak_rss_bytes()) + " RSS")
       << "\n";
}

// Each prompt answered greedily by the base model and with the adapter. Conversations trained through a chat
// template: the prompt is a user turn in that template, and the answer ends with the turn.
// The sample prompts as the decoder gets them: in the chat template of the conversations trained on, if any.
std::vector<ChatPrompt> Trainer::sample_prompts() const {
  std::optional<chat::Template> tmpl;
  if (!ds_->chat_template.empty()) tmpl = chat::template_by_name(ds_->chat_template);
  std::vector<ChatPrompt> prompts;
  for (const std::string& user : opt_.sample_prompts) {
    prompts.push_back(tmpl ? chat_prompt(*tmpl, *tok_, {{"user", user}}) : ChatPrompt{user, {}});
  }
  return prompts;
}

int64_t Trainer::sample_context() const { return std::min<int64_t>(model_->config().n_ctx, 1024); }

// A sample prompt the samples' context cannot hold is refused before the first step, not after the last.
void Trainer::check_sample_prompts() const {
  if (opt_.sample_tokens <= 0) return;
  const std::vector<ChatPrompt> prompts = sample_prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const ChatPrompt& p = prompts[i];
    const std::vector<int32_t> ids = tok_->encode(p.text, p.options.parse_special);
    const bool bos = tok_->add_bos() && tok_->bos() >= 0 && (ids.empty() || ids[0] != tok_->bos());
    const int64_t n = int64_t(ids.size()) + (bos ? 1 : 0);
    if (n >= sample_context()) {
      throw std::invalid_argument("--sample-prompt: prompt " + std::to_string(i + 1) + " ('" +
                                  shortened(one_line(opt_.sample_prompts[i]), 40) + "') is " +
                                  train::plural(n, "token") + ", more than the samples' context of " +
                                  std::to_string(sample_context() - 1) + " prompt tokens");
    }
  }
}

void Trainer::print_samples() {
  const int64_t ctx = sample_context();
  model::Decoder base(*model_, {}, ctx), adapted(*model_, model::adapter_weights(lg_->model_graph()), ctx);
  SampleOptions so;
  so.max_tokens = opt_.sample_tokens;
  so.temperature = 0;
  out_ << "samples (greedy" << (ds_->chat_template.empty() ? std::string() : ", " + ds_->chat_template + " template")
       << "), by the base model and with the adapter:\n";
  const std::vector<ChatPrompt> prompts = sample_prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string& user = opt_.sample_prompts[i];
    const ChatPrompt& prompt = prompts[i];
    const std::string base_text = generate(base, *tok_, prompt.text, so, nullptr, prompt.options).text;
    const std::string adapted_text = generate(adapted, *tok_, prompt.text, so, nullptr, prompt.options).text;
    out_ << "  " << one_line(user) << "\n    base model:   " << one_line(base_text)
         << "\n    with adapter: " << one_line(adapted_text) << "\n";
  }
}

}  // namespace q4t
