// Writes the seed corpora of the fuzz targets, each made by the project's own writers: init-model's models of
// every architecture, tokenizer files (SentencePiece with chat markers, byte-level BPE), adapters as training
// exports them (GGUF LoRA and PEFT safetensors), the demo data and configs. Usage: q4t_fuzz_seeds SOURCE_DIR OUT_DIR
// (one folder per target under OUT_DIR, emptied first).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/backend.h"
#include "autograd/graph.h"
#include "data/gguf.h"
#include "data/safetensors.h"
#include "tests/fuzz/fuzz_input.h"
#include "train/export.h"
#include "train/model/config.h"
#include "train/model/model.h"
#include "train/train.h"
#include <CLI/CLI.hpp>

namespace {

using namespace q4t;
namespace fs = std::filesystem;
using gguf::Value;
using gguf::ValueType;

void write_text(const fs::path& p, const std::string& body) { std::ofstream(p, std::ios::binary) << body; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// init-model's tiny model of every architecture, with the options that add keys or tensors (RoPE factors and
// scalings, LongRoPE, tied output), and two tokenizer-only files.
void model_seeds(const fs::path& dir) {
  auto init = [&](const std::string& name, const std::function<void(InitModelOptions&)>& edit) {
    InitModelOptions o;
    o.out = (dir / (name + ".gguf")).string();
    o.dim = 32, o.layers = 1, o.heads = 2, o.kv_heads = 1, o.ff = 64, o.ctx = 64;
    o.sliding_window = 3, o.swa_pattern = 2;
    edit(o);
    std::ostringstream log;
    if (run_init_model(o, log) != 0) throw std::runtime_error("init-model " + name + ": " + log.str());
  };
  for (const std::string& arch : model::supported_architectures())
    init(arch, [&](InitModelOptions& o) { o.arch = arch, o.tied = arch == "gemma2"; });
  init("llama-f16-rope-freqs", [](InitModelOptions& o) { o.type = "f16", o.rope_freqs = true; });
  init("llama-yarn", [](InitModelOptions& o) { o.rope_scaling = "yarn:4"; });
  init("qwen2-linear", [](InitModelOptions& o) { o.arch = "qwen2", o.rope_scaling = "linear:2", o.type = "q8_0"; });
  init("phi3-longrope", [](InitModelOptions& o) { o.arch = "phi3", o.longrope = 32; });
  fuzz::write_tokenizer_with_controls((dir / "llama.gguf").string(), fuzz::chat_markers(),
                                      "{{ '<|im_start|>' + message['role'] }}", (dir / "spm-chat.gguf").string());

  // Byte-level BPE (GPT-2's byte-to-character map) with a few merges, for each pre-tokenizer.
  std::vector<Value> tokens, types;
  uint32_t shifted = 256;  // the next character for a byte that is not printable
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const uint32_t cp = printable ? uint32_t(b) : shifted++;
    std::string s;
    if (cp < 0x80) s += char(cp);
    else s += char(0xc0 | (cp >> 6)), s += char(0x80 | (cp & 0x3f));
    tokens.push_back(Value::str(s));
    types.push_back(Value::i32(1));
  }
  const std::vector<std::string> merges = {"\xc4\xa0 t", "h e", "\xc4\xa0t he", "l l", "o r", "\xc4\xa0 w"};
  std::vector<Value> merge_values;
  for (const std::string& m : merges) {
    merge_values.push_back(Value::str(m));
    std::string joined = m;
    joined.erase(joined.find(' '), 1);
    tokens.push_back(Value::str(joined));
    types.push_back(Value::i32(1));
  }
  for (const char* control : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(Value::str(control));
    types.push_back(Value::i32(3));
  }
  for (const char* pre : {"gpt-2", "llama-bpe", "qwen2", "default"}) {
    gguf::Writer w;
    w.set("general.architecture", Value::str("qwen2"));
    w.set("tokenizer.ggml.model", Value::str("gpt2"));
    w.set("tokenizer.ggml.pre", Value::str(pre));
    w.set("tokenizer.ggml.tokens", Value::array(ValueType::STRING, tokens));
    w.set("tokenizer.ggml.token_type", Value::array(ValueType::I32, types));
    w.set("tokenizer.ggml.merges", Value::array(ValueType::STRING, merge_values));
    w.set("tokenizer.ggml.bos_token_id", Value::u32(uint32_t(tokens.size() - 3)));
    w.set("tokenizer.ggml.eos_token_id", Value::u32(uint32_t(tokens.size() - 3)));
    w.write((dir / ("bpe-" + std::string(pre) + ".gguf")).string());
  }
}

// Adapters on the adapter target's model, exported as training exports them: GGUF LoRA (all targets rank 2 with
// a chat template; q and v rank 1) and PEFT safetensors; plus a safetensors file of other dtypes and shapes.
void adapter_seeds(const fs::path& adapter_dir, const fs::path& safetensors_dir, const fs::path& scratch) {
  auto be = ag::Backend::cpu();
  auto m = model::Model::load(fuzz::make_adapter_base((scratch / "base.gguf").string()), *be);
  std::mt19937 rng(7);
  for (const bool all_targets : {true, false}) {
    ag::Graph g(*be);
    model::ModelGraph mg(*m, g);
    model::LoraSpec spec;
    spec.cfg.rank = all_targets ? 2 : 1;
    spec.cfg.alpha = 4;
    if (!all_targets) spec.targets = {"q", "v"};
    spec.cfg.init = ag::LoraConfig::Init::Gaussian;  // A and B both non-zero
    mg.add_adapters(spec, rng);
    const std::string name = all_targets ? "all-r2" : "qv-r1";
    export_gguf_adapter(mg, spec.cfg.alpha, (adapter_dir / (name + ".gguf")).string(), all_targets ? "chatml" : "");
    ExportInfo info;
    info.alpha = spec.cfg.alpha;
    info.base_model = "fuzz/base";
    export_peft(mg, info, (scratch / name).string());
    fs::copy_file(scratch / name / "adapter_model.safetensors", safetensors_dir / (name + ".safetensors"));
  }
  safetensors::Writer w;
  w.set_metadata("format", "pt");
  w.add_f32("scalar", {}, {1.5f});
  w.add_f32("empty", {0, 4}, {});
  w.add_f32("m", {2, 3}, {1, 2, 3, 4, 5, 6});
  w.write((safetensors_dir / "shapes.safetensors").string());
}

// Dataset inputs: byte 0 and 1 select the file kind, template and options (fuzz_dataset.cpp), then the body.
void dataset_seeds(const fs::path& dir, const fs::path& source) {
  auto seed = [&](const std::string& name, uint8_t b0, uint8_t b1, const std::string& body) {
    write_text(dir / name, std::string{char(b0), char(b1)} + body);
  };
  constexpr uint8_t kJsonl = 0, kJson = 1, kTxt = 2, kPack = 0x20, kOnPrompt = 0x40, kNoTruncate = 0x80;
  auto tmpl = [](int i) { return uint8_t(i << 2); };  // 0: the tokenizer's, 1..7: chatml .. phi3
  const uint8_t seq64 = 6 * 8;                        // format auto, seq_len 65
  std::istringstream demo(read_text(source / "configs" / "demo.jsonl"));
  std::string lines, line;
  nlohmann::json array = nlohmann::json::array();
  for (int i = 0; i < 4 && std::getline(demo, line); ++i) {
    lines += line + "\n";
    array.push_back(nlohmann::json::parse(line));
  }
  seed("demo.jsonl", kJsonl, seq64, lines);
  seed("demo-packed.jsonl", kJsonl | kPack, seq64, lines);
  seed("demo.json", kJson, seq64, array.dump(1));
  seed("text.txt", kTxt, 6 * 2, "A plain text document.\n\nIt is cut into windows of seq_len + 1 tokens.\n");
  const std::string chat =
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, )"
      R"({"role": "assistant", "content": "Hey"}, {"role": "user", "content": "Bye"}, )"
      R"({"role": "assistant", "content": "Bye!"}]})"
      "\n";
  for (int t = 0; t < 8; ++t) seed("chat-" + std::to_string(t) + ".jsonl", tmpl(t), seq64, chat);
  seed("chat-on-prompt.jsonl", tmpl(1) | kOnPrompt | kNoTruncate, seq64, chat);
  seed("alpaca.jsonl", tmpl(2), seq64 + 4,
       R"({"instruction": "Add", "input": "2 and 3", "output": "5"})"
       "\n"
       R"({"instruction": "Say hi", "input": "", "output": "hi"})"
       "\n");
  seed("sharegpt.jsonl", tmpl(6), seq64 + 5,
       R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]})"
       "\n");
  seed("completion.jsonl", kJsonl, seq64 + 2,
       R"({"prompt": "Q: 2+2\nA:", "completion": " 4", "weight": 1.0})"
       "\n\n"
       R"({"text": "raw text \u2581 <unk> <|im_end|>"})"
       "\n");
}

// Config files: the repository's configs and train's own --print-config output.
void config_seeds(const fs::path& dir, const fs::path& source) {
  for (const auto& e : fs::directory_iterator(source / "configs"))
    if (e.path().extension() == ".toml") fs::copy_file(e.path(), dir / e.path().filename());
  CLI::App app("q4tune");
  TrainOptions o;
  add_train_options(app.add_subcommand("train"), o);
  const char* const argv[] = {"q4tune", "train", "--print-config"};
  app.parse(3, argv);
  write_text(dir / "print-config.toml", o.effective_config);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: q4t_fuzz_seeds SOURCE_DIR OUT_DIR\n";
    return 2;
  }
  const fs::path source = argv[1], out = argv[2];
  try {
    auto fresh = [&](const std::string& name) {
      fs::remove_all(out / name);
      fs::create_directories(out / name);
      return out / name;
    };
    const fs::path scratch = fuzz::scratch();
    model_seeds(fresh("model_gguf"));
    const fs::path safetensors_dir = fresh("safetensors");
    adapter_seeds(fresh("adapter"), safetensors_dir, scratch);
    dataset_seeds(fresh("dataset"), source);
    config_seeds(fresh("config"), source);
  } catch (const std::exception& e) {
    std::cerr << "q4t_fuzz_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
