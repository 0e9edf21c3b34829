// q4tune eval (loss and perplexity on a dataset, with or without an adapter) and q4tune export (a checkpoint's
// adapters as a GGUF LoRA or a PEFT folder).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "data/chat_template.h"
#include "data/gguf.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/device_choice.h"
#include "train/export.h"
#include "train/loss_graph.h"
#include "train/memory_estimate.h"
#include "train/train.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace q4t {

int run_eval(const EvalOptions& opt, const DeviceChoice& dev, std::ostream& out) {
  EvalOptions o = opt;
  std::optional<RunInfo> run;
  if (!o.run.empty()) {
    run = read_run(o.run);
    if (o.model.empty()) o.model = run->model;
    if (o.chat_template.empty()) o.chat_template = run->chat_template;
    if (o.seq_len == 0) o.seq_len = run->seq_len;
  }
  if (o.seq_len == 0) o.seq_len = 512;
  if (o.model.empty()) throw std::invalid_argument("a model: -m/--model FILE.gguf, or --run DIR of a training run");
  if (!fs::is_regular_file(o.model)) throw std::invalid_argument("--model: '" + o.model + "' does not exist or is not a file");
  if (!fs::is_regular_file(o.data)) throw std::invalid_argument("--data: '" + o.data + "' does not exist or is not a file");
  if (!o.adapter.empty() && !fs::is_regular_file(o.adapter))
    throw std::invalid_argument("--adapter: '" + o.adapter + "' does not exist or is not a file");
  if (o.seq_len < 2) throw std::invalid_argument("--seq-len: must be at least 2");
  if (o.batch_size < 1) throw std::invalid_argument("--batch-size: must be at least 1");
  auto be = dev.backend();
  auto file = gguf::File::open(o.model);
  auto tok = tok::Tokenizer::from_gguf(*file);
  auto model = train::load_model_that_fits(*file, *be);
  check_vocab(*tok, *model, o.model);
  data::DatasetOptions dopt;
  dopt.seq_len = o.seq_len;
  dopt.pack = o.pack;
  dopt.train_on_prompt = o.train_on_prompt;
  dopt.chat_template = o.chat_template;
  dopt.format = o.data_format;
  data::Datasets ds = data::load_datasets(o.data, *tok, dopt, out);
  out << data::padding_report(ds.train) << "\n";
  LossGraph lg(*model, o.batch_size, o.seq_len, 4096);
  std::string adapter = "no adapter";
  if (!o.adapter.empty()) {
    lg.model_graph().load_adapters(*gguf::File::open(o.adapter), o.adapter_scale);
    adapter = "adapter " + o.adapter;
  } else if (run) {
    load_run_adapters(lg.model_graph(), *run, o.adapter_scale);
    adapter = "adapters of " + run->checkpoint;
  }
  lg.build();
  const EvalResult r = evaluate(lg, ds.train, o.eval_batches);
  if (r.tokens == 0) throw std::runtime_error(o.data + ": no counted tokens to evaluate");
  char line[200];
  std::snprintf(line, sizeof line, "loss %.4f  perplexity %.3f  (%lld counted tokens, %lld batches, %s)", r.loss,
                std::exp(r.loss), static_cast<long long>(r.tokens), static_cast<long long>(r.batches),
                adapter.c_str());
  out << line << "\n";
  return 0;
}

namespace {

json run_config(const CheckpointState& s, const std::string& dir) {
  try {
    return json::parse(s.config_json);
  } catch (const json::exception& e) {
    throw std::runtime_error(dir + "/state.json: config is not JSON: " + e.what());
  }
}

std::string config_string(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  return it != cfg.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

RunInfo read_run(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw std::invalid_argument("--run: '" + dir + "' is not a directory");
  RunInfo r;
  r.dir = dir;
  if (fs::exists(fs::path(dir) / "complete", ec)) {  // a checkpoint itself
    r.checkpoint = dir;
  } else {
    std::vector<std::string> warnings;
    const auto newest = newest_checkpoint(dir, &warnings);
    if (!newest)
      throw std::invalid_argument(dir + ": no complete checkpoint under " + dir +
                                  "/checkpoints (is it the --out of q4tune train?)" +
                                  (warnings.empty() ? "" : "; " + warnings.front()));
    r.checkpoint = *newest;
  }
  r.state = load_checkpoint(r.checkpoint);
  r.config = run_config(r.state, r.checkpoint);
  r.model = config_string(r.config, "model");
  r.chat_template = config_string(r.config, "chat-template");
  if (auto it = r.config.find("seq-len"); it != r.config.end() && it->is_number_integer()) r.seq_len = it->get<int64_t>();
  return r;
}

model::LoraSpec run_lora_spec(const RunInfo& run) {
  model::LoraSpec spec;
  try {
    spec.targets = run.config.at("lora-targets").get<std::vector<std::string>>();
    spec.cfg.rank = run.config.at("lora-rank").get<int64_t>();
    spec.cfg.alpha = run.config.at("lora-alpha").get<double>();
    spec.cfg.rslora = run.config.at("rslora").get<bool>();
    spec.cfg.dropout = run.config.at("lora-dropout").get<double>();
  } catch (const json::exception& e) {
    throw std::runtime_error(run.checkpoint + "/state.json: the run's LoRA options are missing: " + e.what());
  }
  return spec;
}

void load_run_adapters(model::ModelGraph& mg, const RunInfo& run, double scale) {
  model::LoraSpec spec = run_lora_spec(run);
  spec.cfg.alpha *= scale;
  std::mt19937 rng(0);
  mg.add_adapters(spec, rng);
  ag::Graph& g = mg.graph();
  const std::vector<ag::Var> params = g.params();
  const auto values = checkpoint_values(run.checkpoint, "lora.bin", g, params, run.state.lora);
  for (size_t i = 0; i < params.size(); ++i) g.backend().upload(g.node(params[i].id).value, values[i]);
}

std::string run_chat_template(const RunInfo& run, const tok::Tokenizer& tok) {
  if (!run.chat_template.empty()) return run.chat_template;
  if (tok.chat_template().empty()) return "";
  try {
    return chat::template_name(chat::detect_template(tok.chat_template()));
  } catch (const chat::TemplateError&) {
    return "";
  }
}

int run_export(const ExportOptions& o, std::ostream& out) {
  if (o.format != "gguf" && o.format != "peft")
    throw std::invalid_argument("--format: '" + o.format + "' is not gguf or peft");
  const RunInfo run = read_run(o.checkpoint);
  const std::string model_path = o.model.empty() ? run.model : o.model;
  if (!fs::is_regular_file(model_path))
    throw std::invalid_argument("the base model '" + model_path + "' (recorded in " + run.checkpoint +
                                ") does not exist: pass --model");
  auto be = ag::Backend::cpu();
  auto file = gguf::File::open(model_path);
  auto model = model::Model::load(model_path, *be);
  auto tok = tok::Tokenizer::from_gguf(*file);
  ag::Graph g(*be);
  model::ModelGraph mg(*model, g);
  load_run_adapters(mg, run);
  const ag::LoraConfig lora = run_lora_spec(run).cfg;
  const double alpha = lora.alpha;
  const int64_t step = run.state.step;
  if (o.format == "gguf") {
    const std::string path = o.out.empty() ? (fs::path(run.checkpoint) / "adapter.gguf").string() : o.out;
    export_gguf_adapter(mg, alpha, path, run_chat_template(run, *tok));
    out << "wrote " << path << " (GGUF LoRA, " << run.checkpoint << ", step " << step << ")\n";
  } else {
    const std::string dir = o.out.empty() ? (fs::path(run.checkpoint) / "peft").string() : o.out;
    ExportInfo info;
    info.alpha = alpha;
    info.rslora = lora.rslora;
    info.dropout = lora.dropout;
    info.base_model = o.hf_base_model.empty() ? base_model_name(*file) : o.hf_base_model;
    export_peft(mg, info, dir);
    out << "wrote " << dir << "/adapter_model.safetensors and adapter_config.json (PEFT, " << run.checkpoint
        << ", step " << step << "; base_model_name_or_path " << info.base_model << ")\n";
  }
  return 0;
}

Command add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  auto* cmd = app.add_subcommand("eval", "Loss and perplexity of a model, with or without an adapter, on a dataset");
  const auto dev = add_device_flags(cmd, /*with_precision=*/true);
  add_model_argument(cmd, o->model, "GGUF base model", nullptr, /*required=*/false);
  cmd->add_option("--run", o->run,
                  "a training run's --out directory (or one of its checkpoints): its model, chat template, seq-len "
                  "and newest complete checkpoint's adapters, for what is not given");
  cmd->add_option("--data", o->data, "data: .txt, .jsonl or .json, read as by train")->required();
  cmd->add_option("--adapter,--lora", o->adapter, "GGUF LoRA adapter to apply");
  cmd->add_option("--adapter-scale", o->adapter_scale, "scale of the adapter")->capture_default_str();
  cmd->add_option("-c,--seq-len", o->seq_len, "tokens per row (default: the run's, else 512)");
  cmd->add_option("--batch-size", o->batch_size, "rows per forward pass")->capture_default_str();
  cmd->add_option("--eval-batches", o->eval_batches, "stop after this many batches (0: all)")->capture_default_str();
  cmd->add_flag("--pack", o->pack, "pack several examples into each row");
  cmd->add_flag("--train-on-prompt", o->train_on_prompt, "count prompts and non-assistant turns too");
  cmd->add_option("--chat-template", o->chat_template, "chat template for messages data");
  add_data_format_options(cmd, o->data_format, "Options");
  set_examples(cmd, "  q4tune eval -m model.gguf --data val.jsonl --lora my-run/adapter.gguf\n"
                    "  q4tune eval --run my-run --data val.jsonl      (the run's model, seq-len and newest adapters)");
  return {cmd, [o, dev] { return run_eval(*o, dev->open(), std::cout); }};
}

Command add_export(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* cmd = app.add_subcommand("export", "Write a checkpoint's adapters as a GGUF LoRA (llama.cpp --lora) or a PEFT folder");
  auto* checkpoint = cmd->add_option("CHECKPOINT", o->checkpoint,
                                     "a training run's --out directory (its newest complete checkpoint) or a checkpoint "
                                     "(OUT/checkpoints/step-N)");
  cmd->add_option("--run", o->checkpoint, "the same as CHECKPOINT")->excludes(checkpoint);
  cmd->add_option("--format", o->format, "gguf or peft")->capture_default_str();
  cmd->add_option("-o,--out", o->out,
                  "output file (gguf) or directory (peft); default CHECKPOINT/adapter.gguf or CHECKPOINT/peft");
  cmd->add_option("-m,--model", o->model, "the base model, when it has moved since training");
  cmd->add_option("--hf-base-model", o->hf_base_model,
                  "peft: base_model_name_or_path, the Hugging Face id of the base model (default: the model file's "
                  "general.source.* or general.base_model.* repository, else its general.name)");
  set_examples(cmd, "  q4tune export my-run --format peft -o my-adapter-peft\n"
                    "  q4tune export my-run/checkpoints/step-200 -o step200.gguf");
  return {cmd, [o] { return run_export(*o, std::cout); }};
}

}  // namespace q4t
