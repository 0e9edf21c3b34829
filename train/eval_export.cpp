// q4tune eval (loss and perplexity on a dataset, with or without an adapter) and q4tune export (a checkpoint's
// adapters as a GGUF LoRA or a PEFT folder).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "data/gguf.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/device_choice.h"
#include "train/export.h"
#include "train/loss_graph.h"
#include "train/train.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace q4t {

int run_eval(const EvalOptions& o, const DeviceChoice& dev, std::ostream& out) {
  if (!fs::is_regular_file(o.model)) throw std::invalid_argument("--model: '" + o.model + "' does not exist or is not a file");
  if (!fs::is_regular_file(o.data)) throw std::invalid_argument("--data: '" + o.data + "' does not exist or is not a file");
  if (!o.adapter.empty() && !fs::is_regular_file(o.adapter))
    throw std::invalid_argument("--adapter: '" + o.adapter + "' does not exist or is not a file");
  if (o.seq_len < 2) throw std::invalid_argument("--seq-len: must be at least 2");
  if (o.batch_size < 1) throw std::invalid_argument("--batch-size: must be at least 1");
  auto be = dev.is_cpu() ? ag::Backend::cpu() : ag::Backend::vulkan(*dev.vulkan, dev.precision);
  auto file = gguf::File::open(o.model);
  auto tok = tok::Tokenizer::from_gguf(*file);
  auto model = model::Model::load(o.model, *be);
  check_vocab(*tok, *model, o.model);
  data::DatasetOptions dopt;
  dopt.seq_len = o.seq_len;
  dopt.pack = o.pack;
  dopt.train_on_prompt = o.train_on_prompt;
  dopt.chat_template = o.chat_template;
  data::Datasets ds = data::load_datasets(o.data, *tok, dopt, out);
  LossGraph lg(*model, o.batch_size, o.seq_len, 4096);
  if (!o.adapter.empty()) lg.model_graph().load_adapters(*gguf::File::open(o.adapter), o.adapter_scale);
  lg.build();
  const EvalResult r = evaluate(lg, ds.train, o.max_batches);
  if (r.tokens == 0) throw std::runtime_error(o.data + ": no counted tokens to evaluate");
  char line[200];
  std::snprintf(line, sizeof line, "loss %.4f  perplexity %.3f  (%lld counted tokens, %lld batches, %s)", r.loss,
                std::exp(r.loss), static_cast<long long>(r.tokens), static_cast<long long>(r.batches),
                o.adapter.empty() ? "no adapter" : ("adapter " + o.adapter).c_str());
  out << line << "\n";
  return 0;
}

int run_export(const ExportOptions& o, std::ostream& out) {
  if (o.format != "gguf" && o.format != "peft")
    throw std::invalid_argument("--format: '" + o.format + "' is not gguf or peft");
  const CheckpointState s = load_checkpoint(o.checkpoint);
  json cfg;
  try {
    cfg = json::parse(s.config_json);
  } catch (const json::exception& e) {
    throw std::runtime_error(o.checkpoint + "/state.json: config is not JSON: " + e.what());
  }
  const std::string model_path = o.model.empty() ? cfg.value("model", std::string()) : o.model;
  if (!fs::is_regular_file(model_path))
    throw std::invalid_argument("the base model '" + model_path + "' (recorded in " + o.checkpoint +
                                ") does not exist: pass --model");
  auto be = ag::Backend::cpu();
  auto file = gguf::File::open(model_path);
  auto model = model::Model::load(model_path, *be);
  ag::Graph g(*be);
  model::ModelGraph mg(*model, g);
  model::LoraSpec spec;
  try {
    spec.targets = cfg.at("lora-targets").get<std::vector<std::string>>();
    spec.cfg.rank = cfg.at("lora-rank").get<int64_t>();
    spec.cfg.alpha = cfg.at("lora-alpha").get<double>();
    spec.cfg.rslora = cfg.at("rslora").get<bool>();
    spec.cfg.dropout = cfg.at("lora-dropout").get<double>();
  } catch (const json::exception& e) {
    throw std::runtime_error(o.checkpoint + "/state.json: the run's LoRA options are missing: " + e.what());
  }
  std::mt19937 rng(0);
  mg.add_adapters(spec, rng);
  // The adapters' tensors, by name, from the checkpoint.
  const std::vector<ag::Var> params = g.params();
  const auto values = checkpoint_values(o.checkpoint, "lora.bin", g, params, s.lora);
  for (size_t i = 0; i < params.size(); ++i) be->upload(g.node(params[i].id).value, values[i]);
  if (o.format == "gguf") {
    const std::string path = o.out.empty() ? (fs::path(o.checkpoint) / "adapter.gguf").string() : o.out;
    export_gguf_adapter(mg, spec.cfg.alpha, path);
    out << "wrote " << path << " (GGUF LoRA, step " << s.step << ")\n";
  } else {
    const std::string dir = o.out.empty() ? (fs::path(o.checkpoint) / "peft").string() : o.out;
    ExportInfo info;
    info.alpha = spec.cfg.alpha;
    info.rslora = spec.cfg.rslora;
    info.dropout = spec.cfg.dropout;
    info.base_model = base_model_name(*file);
    export_peft(mg, info, dir);
    out << "wrote " << dir << "/adapter_model.safetensors and adapter_config.json (PEFT, step " << s.step << ")\n";
  }
  return 0;
}

}  // namespace q4t
