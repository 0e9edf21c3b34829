// What the libFuzzer targets and their seed generator share. The readers take paths, so each input is written
// to a file of this process first; the adapter target applies adapters to one fixed small model, and the dataset
// target tokenizes with init-model's vocabulary plus the markers of every chat template.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <sstream>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "tests/scratch_dir.h"
#include "train/commands.h"

namespace q4t::fuzz {

// This process's scratch directory, removed when it exits normally. Unless TMPDIR says otherwise it is in
// /dev/shm where that exists: through a disk-backed /tmp, writing each input costs more than reading it.
inline std::string scratch() {
  static const bool chosen = [] {
    if (!std::getenv("TMPDIR") && ::access("/dev/shm", W_OK) == 0) ::setenv("TMPDIR", "/dev/shm", 0);
    return true;
  }();
  (void)chosen;
  return test::process_scratch_dir("q4t_fuzz_");
}

// Writes the input to <scratch>/input<ext> (one file, rewritten for each input) and returns its path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& ext) {
  const std::string path = scratch() + "/input" + ext;
  FILE* f = std::fopen(path.c_str(), "wb");
  const bool ok = f && (size == 0 || std::fwrite(data, 1, size, f) == size);
  if (!f || std::fclose(f) != 0 || !ok) {
    std::perror(path.c_str());
    std::abort();  // the harness itself failed, not the code under test
  }
  return path;
}

// The model the adapter target loads (and its seed adapters fit): init-model's llama, one layer, C = 32.
inline std::string make_adapter_base(const std::string& path) {
  InitModelOptions o;
  o.out = path;
  o.type = "q4_0";
  o.dim = 32, o.layers = 1, o.heads = 2, o.kv_heads = 1, o.ff = 64, o.ctx = 64;
  std::ostringstream log;
  if (run_init_model(o, log) != 0) {
    std::fputs(log.str().c_str(), stderr);
    std::abort();
  }
  return path;
}

// The control tokens of the chat templates (data/chat_template.h), each one token in the dataset's vocabulary.
inline const std::vector<std::string>& chat_markers() {
  static const std::vector<std::string> m = {
      "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<start_of_turn>",
      "<end_of_turn>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "[INST]", "[/INST]"};
  return m;
}

// Writes the tokenizer keys of the model at model_path, its vocabulary extended by `controls` (CONTROL tokens),
// with `jinja` as tokenizer.chat_template, as a GGUF of metadata only at out_path.
inline void write_tokenizer_with_controls(const std::string& model_path, const std::vector<std::string>& controls,
                                          const std::string& jinja, const std::string& out_path) {
  using gguf::Value;
  auto f = gguf::File::open(model_path);
  gguf::Writer w;
  for (const auto& [key, v] : f->metadata())
    if (key.rfind("tokenizer.", 0) == 0 || key == "general.architecture") w.set(key, v);
  auto extended = [&](const std::string& key, const Value& add) {
    Value v = *f->find(key);
    auto& items = std::get<std::vector<Value>>(v.v);
    items.insert(items.end(), controls.size(), add);
    return v;
  };
  Value tokens = extended("tokenizer.ggml.tokens", Value::str(""));
  auto& texts = std::get<std::vector<Value>>(tokens.v);
  for (size_t i = 0; i < controls.size(); ++i) texts[texts.size() - controls.size() + i] = Value::str(controls[i]);
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.scores", extended("tokenizer.ggml.scores", Value::f32(0.0f)));
  w.set("tokenizer.ggml.token_type", extended("tokenizer.ggml.token_type", Value::i32(3)));
  w.set("tokenizer.chat_template", Value::str(jinja));
  w.write(out_path);
}

}  // namespace q4t::fuzz
