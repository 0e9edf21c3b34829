// Which type llama-quantize gives each matrix of a Q4_K_M file: shared by `quantize`, `init-model` and the random
// models of `bench train --type q4_k_m`.
#pragma once
#include <cstdint>
#include <string>

namespace q4t::model {

// llama-quantize's choice of more bits in a stack of n layers: the first and last eighth, and every third layer
// in between.
bool more_bits_layer(int64_t layer, int64_t n_layers);

// Under Q4_K_M, whether matrix `name` of layer `layer` (-1: none) is Q6_K: the output matrix (output.weight, or
// token_embd.weight when tied), and attn_v and ffn_down of the more-bits layers; every other matrix is Q4_K.
bool q4_k_m_takes_q6_k(const std::string& name, int64_t layer, int64_t n_layers, bool output);

}  // namespace q4t::model
