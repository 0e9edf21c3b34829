// q4tune merge: LoRA adapters folded into their base model. Each adapted weight becomes
// W' = dequant(W) + Σ scale·B·A and is quantized again (train/requantize.h), to its own type or to --type, rounded
// alone or, with --calibration, against the inputs it sees on a dataset; every other tensor and the metadata are
// copied. The output streams one tensor at a time (gguf::Writer's produced tensors), so memory holds one weight in
// f32 beside the mapped input (and the calibration inputs), and it appears under its name only once whole.
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "data/dataset.h"
#include "data/gguf.h"
#include "data/tokenizer.h"
#include "kernels/formats.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/loss_graph.h"
#include "train/memory_estimate.h"
#include "train/requantize.h"
#include "train/run_log.h"
#include "train/train.h"

namespace fs = std::filesystem;

namespace q4t {
namespace {

using gguf::GgmlType;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One adapter of one weight on the host: A [r, n_in] and B [n_out, r] row-major, and the scale of B·A.
struct HostLora {
  std::vector<float> a, b;
  int64_t r = 0;
  double scale = 0;
  std::string from;  // the adapter as given, for messages
};
// By the name of the weight they adapt; several adapters may fold into one weight.
using HostLoras = std::multimap<std::string, HostLora>;

// A 2-D or 1-D tensor's values as f32 (any type q4tune reads).
std::vector<float> tensor_floats(const gguf::TensorInfo& t) {
  const int64_t n_in = t.cols(), rows = t.rows();
  if (t.type == GgmlType::F32) {
    std::vector<float> v(static_cast<size_t>(n_in * rows));
    std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    return v;
  }
  const FormatTraits* f = find_format(uint32_t(t.type));
  if (!f) throw std::invalid_argument("tensor '" + t.name + "' is " + gguf::type_name(t.type) + ", which q4tune cannot read");
  return dequantize_matrix(f->format, std::span<const uint8_t>(t.data, t.bytes), rows, n_in);
}

std::string shape(int64_t rows, int64_t cols) { return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]"; }

// Adds one LoRA pair to `out` after checking it against the model's tensor `weight` (n_in = ne[0], n_out = ne[1]).
void add_lora(const std::string& from, const gguf::File& model, const std::string& weight, std::vector<float> a,
              int64_t r, std::vector<float> b, double scale, HostLoras& out) {
  const gguf::TensorInfo* w = model.tensor(weight);
  if (!w)
    throw std::invalid_argument(from + ": its adapter of '" + weight + "' names no tensor of " + model.path() +
                                " (an adapter of another model?)");
  const int64_t n_in = w->ne[0], n_out = w->ne.size() > 1 ? w->ne[1] : 1;
  if (w->ne.size() != 2 || int64_t(a.size()) != r * n_in || int64_t(b.size()) != n_out * r)
    throw std::invalid_argument(from + ": its adapter of '" + weight + "' (A " + shape(r, int64_t(a.size()) / std::max<int64_t>(r, 1)) +
                                ", B " + shape(int64_t(b.size()) / std::max<int64_t>(r, 1), r) + ") does not fit the weight " +
                                shape(n_out, n_in) + " of " + model.path() + " (an adapter of a model with other dims?)");
  out.insert({weight, HostLora{std::move(a), std::move(b), r, scale, from}});
}

// A GGUF LoRA (llama.cpp's format): blk.N.<proj>.weight.lora_a ne [n_in, r] and .lora_b ne [r, n_out], each
// pair scaled by user_scale · adapter.lora.alpha / r.
void read_adapter_file(const std::string& path, double user_scale, const gguf::File& model, HostLoras& out) {
  const auto a = gguf::File::open(path);
  a->expect_adapter();
  if (a->get_string("general.type") != "adapter" || a->get_string("adapter.type") != "lora")
    throw std::invalid_argument(path + ": not a LoRA adapter (general.type 'adapter', adapter.type 'lora')");
  const std::string arch = a->get_string("general.architecture"), model_arch = model.get_string("general.architecture");
  if (arch != model_arch)
    throw std::invalid_argument(path + ": an adapter for a " + arch + " model; " + model.path() + " is " + model_arch);
  const double alpha = a->get_float("adapter.lora.alpha");
  const std::vector<model::AdapterPair> pairs = model::adapter_pairs(*a);
  if (pairs.empty()) throw std::invalid_argument(path + ": no '*.lora_a' tensors");
  for (const auto& [weight, ta, tb] : pairs) {
    if (!tb) throw std::invalid_argument(path + ": '" + weight + ".lora_b' is missing (its lora_a is present)");
    if (ta->ne.size() != 2 || tb->ne.size() != 2 || ta->ne[1] != tb->ne[0])
      throw std::invalid_argument(path + ": '" + weight + "': lora_a and lora_b do not share a rank");
    const int64_t r = ta->ne[1];
    add_lora(path, model, weight, tensor_floats(*ta), r, tensor_floats(*tb), user_scale * alpha / double(r), out);
  }
}

// A training run (its newest complete checkpoint) or a checkpoint: its LoRA tensors blk.N.<proj>.lora_a [r, n_in]
// and .lora_b [n_out, r], scaled by user_scale · alpha / r (alpha / sqrt(r) with rsLoRA).
void read_run_adapters(const std::string& dir, double user_scale, const gguf::File& model, HostLoras& out) {
  RunInfo run = read_run(dir);
  ag::LoraConfig lora = run_lora_spec(run).cfg;
  std::map<std::string, NamedTensor*> by_name;
  for (NamedTensor& t : run.state.lora) by_name[t.name] = &t;
  int pairs = 0;
  for (auto& [name, ta] : by_name) {
    const std::string suffix = ".lora_a";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string stem = name.substr(0, name.size() - suffix.size());
    auto tb = by_name.find(stem + ".lora_b");
    if (tb == by_name.end() || ta->shape.size() != 2 || tb->second->shape.size() != 2)
      throw std::runtime_error(run.checkpoint + "/lora.bin: '" + stem + "' lacks a 2-D lora_a and lora_b");
    const int64_t r = lora.rank = ta->shape[0];  // the pair's own rank
    const double scale = user_scale * lora.scale();
    add_lora(run.checkpoint, model, stem + ".weight", std::move(ta->values), r, std::move(tb->second->values), scale,
             out);
    ++pairs;
  }
  if (pairs == 0) throw std::runtime_error(run.checkpoint + "/lora.bin: no LoRA tensors");
}


// The inputs that each layer product of the base with its adapter sees on calibration text, by weight name: rows
// of o.calibration_seq_len tokens of o.calibration (any dataset q4tune reads), packed, up to o.calibration_tokens
// real tokens, run on the CPU. Products that read one input (q, k and v) share its matrix.
struct Calibration {
  std::map<std::string, std::shared_ptr<const Eigen::MatrixXf>> inputs;
  int64_t tokens = 0;
  // The factor of a weight's inputs, computed once per input and dropped with the input's last weight.
  std::shared_ptr<const InputFactor> factor(const std::string& weight);

 private:
  std::map<const Eigen::MatrixXf*, std::shared_ptr<const InputFactor>> factors_;
};

std::shared_ptr<const InputFactor> Calibration::factor(const std::string& weight) {
  static std::mutex m;  // the writer produces one tensor at a time; the lock only guards the maps
  std::lock_guard<std::mutex> lock(m);
  auto it = inputs.find(weight);
  if (it == inputs.end()) return nullptr;
  const std::shared_ptr<const Eigen::MatrixXf> x = it->second;
  inputs.erase(it);
  auto& f = factors_[x.get()];
  if (!f) f = input_factor(*x);
  const std::shared_ptr<const InputFactor> out = f;
  if (x.use_count() == 1) factors_.erase(x.get());  // no other weight reads this input
  return out;
}

Calibration calibrate(const MergeOptions& o, std::ostream& out) {
  if (o.adapters.size() != 1)
    throw std::invalid_argument("--calibration: runs the base with one adapter; merge several one after the other");
  if (!fs::is_regular_file(o.calibration))
    throw std::invalid_argument("--calibration: '" + o.calibration + "' does not exist or is not a file");
  if (o.calibration_tokens < 1) throw std::invalid_argument("--calibration-tokens: must be at least 1");
  if (o.calibration_seq_len < 2) throw std::invalid_argument("--calibration-seq-len: must be at least 2");
  const auto file = gguf::File::open(o.model);
  const auto tok = tok::Tokenizer::from_gguf(*file);
  const auto be = ag::Backend::cpu();
  const auto model = train::load_model_that_fits(*file, *be);
  check_vocab(*tok, *model, o.model);
  data::DatasetOptions dopt;
  dopt.seq_len = o.calibration_seq_len;
  dopt.pack = true;
  std::ostringstream quiet;
  const data::Datasets ds = data::load_datasets(o.calibration, *tok, dopt, quiet);
  LossGraph lg(*model, 1, o.calibration_seq_len, 4096, LossGraph::Memory::PerTensor);
  const double scale = o.scales.empty() ? 1.0 : o.scales[0];
  std::error_code ec;
  if (fs::is_directory(o.adapters[0], ec))
    load_run_adapters(lg.model_graph(), read_run(o.adapters[0]), scale);
  else
    lg.model_graph().load_adapters(*gguf::File::open(o.adapters[0]), scale);
  std::vector<std::pair<std::string, ag::Var>> seen;
  lg.model_graph().observe_inputs([&](const std::string& w, ag::Var x) { seen.emplace_back(w, x); });
  lg.build();
  std::map<std::string, std::vector<float>> rows;  // by the first weight that reads the input
  std::map<std::string, std::string> first;
  Calibration c;
  for (size_t i = 0; i < ds.train.size() && c.tokens < o.calibration_tokens; ++i) {
    const data::Batch b = ds.train.batch_at(i, 1);
    lg.set_batch(b);
    lg.forward();
    std::map<const float*, std::string> by_data;
    for (const auto& [w, x] : seen) {
      const float* d = x.value().data<float>();
      const std::string& reader = by_data.emplace(d, w).first->second;
      first[w] = reader;
      if (reader != w) continue;
      const int64_t n_in = x.shape()[1];
      std::vector<float>& r = rows[w];
      for (int64_t t = 0, taken = c.tokens; t < b.T && taken < o.calibration_tokens; ++t)
        if (b.attn_mask[size_t(t)]) r.insert(r.end(), d + t * n_in, d + (t + 1) * n_in), ++taken;
    }
    for (int64_t t = 0; t < b.T && c.tokens < o.calibration_tokens; ++t) c.tokens += b.attn_mask[size_t(t)];
  }
  if (c.tokens == 0) throw std::invalid_argument("--calibration: '" + o.calibration + "' has no tokens");
  std::map<std::string, std::shared_ptr<const Eigen::MatrixXf>> matrices;
  double bytes = 0;
  for (auto& [w, r] : rows) {
    const int64_t n_in = int64_t(r.size()) / c.tokens;
    matrices[w] = std::make_shared<const Eigen::MatrixXf>(
        Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(r.data(), c.tokens, n_in));
    bytes += double(r.size()) * sizeof(float);
    std::vector<float>().swap(r);
  }
  for (const auto& [w, reader] : first) c.inputs[w] = matrices.at(reader);
  char line[200];
  std::snprintf(line, sizeof line, "calibration: %lld tokens of %s through the base and its adapter (%zu inputs, %.1f MiB)\n",
                static_cast<long long>(c.tokens), o.calibration.c_str(), matrices.size(), bytes / 1048576.0);
  out << line;
  return c;
}

}  // namespace

int run_merge(const MergeOptions& o, std::ostream& out) {
  if (o.model.empty()) throw std::invalid_argument("merge: a base model: -m/--model FILE.gguf");
  if (o.out.empty()) throw std::invalid_argument("merge: an output file: -o/--out FILE.gguf");
  if (o.adapters.empty()) throw std::invalid_argument("merge: at least one --adapter (a GGUF LoRA, a run or a checkpoint)");
  if (!o.scales.empty() && o.scales.size() != o.adapters.size())
    throw std::invalid_argument("merge: " + train::plural(int64_t(o.scales.size()), "--adapter-scale") + " for " +
                                train::plural(int64_t(o.adapters.size()), "adapter") + ": give one per adapter, or none");
  if (!fs::is_regular_file(o.model)) throw std::invalid_argument("--model: '" + o.model + "' does not exist or is not a file");
  std::error_code ec;
  if (fs::exists(o.out, ec) && fs::equivalent(o.out, o.model, ec))
    throw std::invalid_argument("--out: '" + o.out + "' is the base model itself; write the merged model elsewhere");
  const auto model = gguf::File::open(o.model);
  model->expect_model();
  // The types (--type first: a bad name fails before any adapter is read), the adapters, and every refusal, all
  // before anything is written.
  const std::vector<gguf::TensorInfo>& tensors = model->tensors();
  std::vector<GgmlType> types;
  uint32_t file_type = uint32_t(model->get_uint_or("general.file_type", 0));
  if (o.type == "same") {
    for (const gguf::TensorInfo& t : tensors) types.push_back(t.type);
  } else {
    const TypePlan plan = plan_types(*model, "--type", o.type, true);
    types = plan.types;
    file_type = plan.file_type;
  }
  HostLoras loras;
  for (size_t i = 0; i < o.adapters.size(); ++i) {
    const double scale = o.scales.empty() ? 1.0 : o.scales[i];
    if (fs::is_directory(o.adapters[i], ec))
      read_run_adapters(o.adapters[i], scale, *model, loras);
    else if (fs::is_regular_file(o.adapters[i], ec))
      read_adapter_file(o.adapters[i], scale, *model, loras);
    else
      throw std::invalid_argument("--adapter: '" + o.adapters[i] + "' does not exist");
  }

  for (size_t i = 0; i < tensors.size(); ++i) {
    const bool converted = loras.count(tensors[i].name) > 0 || types[i] != tensors[i].type;
    if (converted && types[i] != GgmlType::F32 && !find_format(uint32_t(types[i])))
      throw std::invalid_argument("merge: '" + tensors[i].name + "' would be written as " + gguf::type_name(types[i]) +
                                  ", which q4tune cannot write: choose --type");
  }

  auto calibration = std::make_shared<Calibration>();
  if (!o.calibration.empty()) {
    *calibration = calibrate(o, out);
    for (size_t i = 0; i < tensors.size(); ++i)  // only the weights written anew are quantized against their inputs
      if (loras.count(tensors[i].name) == 0 && types[i] == tensors[i].type) calibration->inputs.erase(tensors[i].name);
  }

  gguf::Writer w;
  for (const auto& [key, value] : model->metadata())
    if (key != "general.alignment") w.set(key, value);
  if (model->alignment() != 32) w.set("general.alignment", gguf::Value::u32(uint32_t(model->alignment())));
  const gguf::Value* name = model->find("general.name");
  const std::string base_name = name && name->type == gguf::ValueType::STRING ? std::get<std::string>(name->v) : "";
  w.set("general.name", gguf::Value::str(base_name.empty() ? "merged LoRA" : base_name + " + LoRA"));
  if (o.type != "same") w.set("general.file_type", gguf::Value::u32(file_type));
  std::vector<gguf::Value> from, scales;
  for (size_t i = 0; i < o.adapters.size(); ++i) {
    from.push_back(gguf::Value::str(fs::path(o.adapters[i]).filename().string()));
    scales.push_back(gguf::Value::f32(float(o.scales.empty() ? 1.0 : o.scales[i])));
  }
  w.set("q4tune.merge.adapters", gguf::Value::array(gguf::ValueType::STRING, from));
  w.set("q4tune.merge.adapter_scales", gguf::Value::array(gguf::ValueType::F32, scales));

  int64_t merged = 0, converted = 0, rounded = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const gguf::TensorInfo* t = &tensors[i];
    const GgmlType type = types[i];
    const auto range = loras.equal_range(t->name);
    if (range.first == range.second && type == t->type) {
      w.add_tensor(t->name, t->ne, t->type, [t] { return std::vector<uint8_t>(t->data, t->data + t->bytes); });
      continue;
    }
    range.first == range.second ? ++converted : ++merged;
    if (type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16) ++rounded;
    std::vector<const HostLora*> mine;
    for (auto it = range.first; it != range.second; ++it) mine.push_back(&it->second);
    w.add_tensor(t->name, t->ne, type, [t, type, mine, calibration] {
      std::vector<float> v = tensor_floats(*t);
      const int64_t n_in = t->cols(), n_out = t->rows();
      Eigen::Map<RowMajor> W(v.data(), n_out, n_in);
      for (const HostLora* l : mine) {
        const Eigen::Map<const RowMajor> A(l->a.data(), l->r, n_in), B(l->b.data(), n_out, l->r);
        W.noalias() += (float(l->scale) * B) * A;
      }
      const std::shared_ptr<const InputFactor> inputs = calibration->factor(t->name);
      return encode_weight(v, type, n_out, n_in, type == t->type ? t->data : nullptr, inputs.get());
    });
  }
  w.write(o.out);
  out << "wrote " << o.out << ": " << train::plural(merged, "adapted weight") << " merged from "
      << train::plural(int64_t(o.adapters.size()), "adapter") << " ("
      << (o.type == "same" ? std::string("each in its own type") : "as " + o.type) << ")";
  if (converted > 0) out << ", " << train::plural(converted, "other tensor") << " converted";
  out << ", " << train::plural(int64_t(tensors.size()) - merged - converted, "tensor") << " copied\n";
  if (o.calibration.empty() && rounded > 0)
    out << "the " << train::plural(rounded, "quantized weight") << " written anew were rounded alone; --calibration DATA "
        << "(such as the fine-tune's training data) quantizes them against the inputs they see there, which keeps the "
        << "merged model closer to base + adapter\n";
  return 0;
}

Command add_merge(CLI::App& app) {
  auto o = std::make_shared<MergeOptions>();
  auto* cmd = app.add_subcommand("merge",
                                 "Fold LoRA adapters into their base model and write one GGUF that llama.cpp runs as "
                                 "it is: W' = dequant(W) + scale·B·A for each adapted weight, quantized again");
  cmd->add_option("-m,--model", o->model, "the base GGUF model")->required();
  cmd->add_option("--adapter,--lora", o->adapters,
                  "a GGUF LoRA adapter, a training run's --out directory (its newest complete checkpoint) or a "
                  "checkpoint; give it again to merge several")
      ->required()
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--adapter-scale", o->scales, "the scale of each adapter, in the order of --adapter (default 1)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("-o,--out", o->out, "the merged GGUF (written whole or not at all)")->required();
  cmd->add_option("--type", o->type,
                  "same (each tensor keeps its type), or a llama-quantize file type or format for every matrix: " +
                      std::string("f32, f16, bf16, q4_k_m, q8_0, ... (as quantize --type)"))
      ->capture_default_str();
  cmd->add_option("--calibration", o->calibration,
                  "a dataset (text, JSONL or JSON, as train --data): run the base with its adapter on it and quantize "
                  "each merged weight against the inputs it sees there, each rounding error fed into the weights not "
                  "yet rounded (GPTQ's error feedback); without it each weight is rounded alone");
  cmd->add_option("--calibration-tokens", o->calibration_tokens,
                  "the tokens of --calibration used; memory holds them once per distinct input (4 bytes per value)")
      ->capture_default_str();
  cmd->add_option("--calibration-seq-len", o->calibration_seq_len, "the tokens per calibration row (examples packed)")
      ->capture_default_str();
  set_examples(cmd, "  q4tune merge -m model-q4_k_m.gguf --lora my-run/adapter.gguf -o merged-q4_k_m.gguf\n"
                    "  q4tune merge -m model.gguf --lora my-run --type f16 -o merged-f16.gguf    (the run's newest checkpoint)");
  return {cmd, [o] { return run_merge(*o, std::cout); }};
}

}  // namespace q4t
