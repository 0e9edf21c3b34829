// Hyper-parameters of a llama-family model, read from GGUF metadata ({arch}.* keys; see DESIGN.md).
#pragma once
#include <cstdint>
#include <string>

#include "autograd/ops.h"
#include "data/gguf.h"

namespace q4t::model {

struct ModelConfig {
  std::string arch;  // "llama" (Llama 1/2/3, Mistral, TinyLlama, SmolLM) or "qwen2"
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ctx = 0;
  double rope_base = 10000.0, rms_eps = 1e-5;
  ag::RopeMode rope_mode = ag::RopeMode::Norm;  // llama: adjacent pairs; qwen2: halves (neox)
  bool qkv_bias = false;                         // qwen2: q/k/v projections carry biases
  bool tied = false;                             // no output.weight: token_embd is the output matrix

  // Reads and checks the keys; throws gguf::FormatError naming the file and the key.
  static ModelConfig from_gguf(const gguf::File& f);
};

}  // namespace q4t::model
