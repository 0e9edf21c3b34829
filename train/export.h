// Writing trained adapters for other tools: llama.cpp's GGUF LoRA (--lora) and Hugging Face PEFT
// (adapter_model.safetensors + adapter_config.json). See DESIGN.md "Adapter formats we write".
//
// Row order: llama.cpp's HF→GGUF converter permuted the rows of llama's q and k weights (for RoPE on adjacent
// pairs instead of HF's halves); q4tune computes in GGUF order, so the PEFT export un-permutes the rows of q_proj's
// and k_proj's B (their A multiplies the input, whose order is unchanged). qwen2 (neox RoPE) is not permuted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/gguf.h"
#include "train/model/model.h"

namespace q4t {

// HF row order → GGUF row order of a matrix [n_head * head_dim, cols] (row-major), as the converter does:
// reshape(n_head, 2, head_dim/2, cols) → swapaxes(1, 2) → reshape. GGUF row h·hd + 2j + s holds HF row
// h·hd + s·hd/2 + j (s ∈ {0, 1}, j < hd/2).
std::vector<float> rope_permute_rows(const std::vector<float>& hf, int64_t n_head, int64_t cols);
// The inverse: GGUF row order → HF row order.
std::vector<float> rope_unpermute_rows(const std::vector<float>& gguf_rows, int64_t n_head, int64_t cols);

// Writes mg's adapters as a GGUF LoRA that llama.cpp applies as W·x + (alpha/r)·B·(A·x). alpha is written as
// adapter.lora.alpha; an adapter whose own scale differs from alpha/r (rsLoRA, another rank) gets the ratio
// folded into its B, so llama.cpp computes exactly what q4tune does. A chat template family name (chatml, ...)
// is recorded as q4tune.chat_template, for generate --chat. Atomic; throws std::runtime_error.
void export_gguf_adapter(const model::ModelGraph& mg, double alpha, const std::string& path,
                         const std::string& chat_template = "");
// The key of an adapter file that names the chat template its run trained with.
inline constexpr const char* kAdapterChatTemplateKey = "q4tune.chat_template";

struct ExportInfo {
  double alpha = 32;      // lora_alpha; PEFT's scale is alpha/r, or alpha/sqrt(r) with rslora
  bool rslora = false;
  double dropout = 0;     // lora_dropout (training only; recorded for the config)
  std::string base_model; // base_model_name_or_path
};
// The Hugging Face id a model file was converted from, for ExportInfo::base_model: the first of
// general.source.huggingface.repository, general.source.repo_url, general.source.url and
// general.base_model.0.repo_url that names a Hugging Face repository (https://huggingface.co/ID), else
// general.name, else the file's path.
std::string base_model_name(const gguf::File& model);

// Writes dir/adapter_model.safetensors and dir/adapter_config.json (each atomically; dir created if missing).
// All adapters must share one rank; an adapter whose scale differs from PEFT's gets the ratio folded into B.
// Throws std::runtime_error (std::invalid_argument for adapters PEFT cannot express).
void export_peft(const model::ModelGraph& mg, const ExportInfo& info, const std::string& dir);

}  // namespace q4t
