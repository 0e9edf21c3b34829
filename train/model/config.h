// Hyper-parameters of a llama-family model, read from GGUF metadata ({arch}.* keys; see DESIGN.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "data/gguf.h"

namespace q4t::model {

// The architectures q4tune runs, as general.architecture names them.
const std::vector<std::string>& supported_architectures();
// Whether llama.cpp rotates part of a head (rope.dimension_count below the head size) for arch: gemma and phi3
// (phi-4-mini) only.
bool partial_rotary_allowed(const std::string& arch);

// RoPE's context scaling ({arch}.rope.scaling.*), as llama.cpp applies it.
struct RopeScaling {
  enum class Type { None, Linear, Yarn };
  Type type = Type::None;
  double factor = 1;          // positions are compressed by this factor (freq_scale = 1 / factor)
  int64_t n_ctx_orig = 0;     // YaRN: the context the model was trained with (original_context_length)
  double attn_factor = 1;     // rope.scaling.attn_factor: multiplies cos and sin
  double yarn_log_mul = 0;    // rope.scaling.yarn_log_multiplier (0: unset)
};

struct ModelConfig {
  std::string arch;  // one of supported_architectures()
  int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ctx = 0;
  int64_t n_rot = 0;  // rotated dims of a head (rope.dimension_count): head_dim, or fewer (phi-4-mini's partial rotary)
  double rope_base = 10000.0, rms_eps = 1e-5;
  ag::RopeMode rope_mode = ag::RopeMode::Norm;  // llama: adjacent pairs; the others: halves (neox)
  RopeScaling rope_scaling;
  std::vector<double> rope_factors;  // llama 3.1+: rope_freqs.weight [head_dim / 2], dividing each pair's frequency;
                                     // phi3: rope_factors_short.weight
  std::vector<double> rope_factors_long;  // phi3 (LongRoPE): rope_factors_long.weight, for contexts longer than
                                          // rope.scaling.original_context_length
  bool fused_qkv = false;      // phi3: attn_qkv [C, (H + 2 Hkv)·D], q, k and v as column ranges of one product
  bool fused_gate_up = false;  // phi3: ffn_up [C, 2·n_ff], the gate then the up half
  bool qkv_bias = false;             // qwen2: q/k/v projections carry biases
  bool qk_norm = false;              // qwen3, gemma3: per-head RMSNorm of q and k (attn_q_norm, attn_k_norm)
  bool tied = false;                 // no output.weight: token_embd is the output matrix
  // gemma2, gemma3: embeddings times sqrt(n_embd), GELU (tanh) gating in the FFN, RMSNorm of the attention and
  // FFN outputs (post_attention_norm, post_ffw_norm) before their residual adds.
  bool gemma = false;
  double query_scale = 0;     // the scale of q·k (0: 1/sqrt(head_dim)); gemma's 27B models use 1/sqrt(n_embd/n_head)
  double attn_softcap = 0;    // gemma2: scores become attn_softcap·tanh(score / attn_softcap) (0: none)
  double final_softcap = 0;   // gemma2 (gemma3 where set): logits the same with final_softcap
  int64_t n_swa = 0;          // sliding window of the local layers (0: none)
  std::vector<bool> swa_layers;  // [n_layer]: the layers that attend within the window
  double rope_base_swa = 10000.0;  // the local layers' RoPE base
  bool swa_rope_scaled = false;    // gemma2: the local layers' RoPE scaled as the global ones (gemma3: unscaled)

  bool is_swa(int64_t layer) const { return n_swa > 0 && swa_layers.at(size_t(layer)); }
  // Layer `layer`'s window and soft-capping.
  ag::AttentionOptions attention_options(int64_t layer) const;
  // The rotation of layer `layer`'s queries and keys over a context of n_ctx positions (LongRoPE's long factors
  // where n_ctx exceeds the original context, as llama.cpp and Hugging Face choose them): the base, the per-pair
  // factors and the scaling combined.
  ag::RopeFreqs rope_freqs(int64_t layer, int64_t n_ctx = 0) const;
  // Names of the tensors that hold no weight of a layer but the config reads (rope_freqs.weight).
  std::vector<std::string> config_tensors() const;

  // Reads and checks the keys; throws gguf::FormatError naming the file and the key.
  static ModelConfig from_gguf(const gguf::File& f);
};

}  // namespace q4t::model
