#include "train/model/weight_mix.h"

namespace q4t::model {

bool more_bits_layer(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool q4_k_m_takes_q6_k(const std::string& name, int64_t layer, int64_t n_layers, bool output) {
  const bool v_or_down =
      name.find("attn_v.weight") != std::string::npos || name.find("ffn_down.weight") != std::string::npos;
  return output || (v_or_down && more_bits_layer(layer, n_layers));
}

}  // namespace q4t::model
