// LoRA linear: y = W·x (frozen) + scale · B·(A·dropout(x)), with A [r, n_in] and
// B [n_out, r] trainable f32 parameters, scale = alpha / r (alpha / sqrt(r) with rsLoRA).
#pragma once
#include <cstdint>
#include <random>
#include <string>

#include "autograd/graph.h"

namespace q4t::ag {

struct LoraConfig {
  int64_t rank = 16;
  double alpha = 32;
  double dropout = 0;  // probability of dropping an input element on the LoRA path
  bool rslora = false;
  enum class Init { Kaiming, Gaussian } init = Init::Kaiming;
  double scale() const;  // alpha / r, or alpha / sqrt(r) with rsLoRA
};

class LoraLinear {
 public:
  // New adapters: A from cfg.init (kaiming-uniform: U(-1/sqrt(n_in), 1/sqrt(n_in)), or N(0, 1/r)), B = 0.
  // dropout_salt (i32 [2], optional): see ag::dropout; a trainer rewrites it to draw new masks each micro-batch.
  static LoraLinear create(Var w, const LoraConfig& cfg, const std::string& name, std::mt19937& rng,
                           uint64_t dropout_seed = 0, Var dropout_salt = {});
  // Existing adapters (resume, tests): a [r, n_in] and b [n_out, r] must already be parameters of w's graph.
  LoraLinear(Var w, Var a, Var b, double scale, double dropout = 0, uint64_t dropout_seed = 0, Var dropout_salt = {});

  // W·x + scale·B·(A·dropout(x)) as one lora_linear node; x_frozen, when given, is what W multiplies instead of
  // x (x rounded as llama.cpp rounds a quantized matrix's input).
  Var operator()(Var x, Var x_frozen = {}) const;

  Var w, a, b;
  double scale, dropout;
  uint64_t dropout_seed;
  Var dropout_salt;
};

}  // namespace q4t::ag
