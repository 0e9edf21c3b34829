#include "autograd/lora.h"

#include <cmath>

#include "autograd/ops.h"

namespace q4t::ag {

double LoraConfig::scale() const {
  if (rank <= 0) throw GraphError("LoRA rank must be positive, not " + std::to_string(rank));
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

LoraLinear LoraLinear::create(Var w, const LoraConfig& cfg, const std::string& name, std::mt19937& rng,
                              uint64_t dropout_seed, Var dropout_salt) {
  const double s = cfg.scale();
  const int64_t n_out = w.shape().at(0), n_in = w.shape().at(1);
  std::vector<float> a(size_t(cfg.rank * n_in));
  if (cfg.init == LoraConfig::Init::Kaiming) {
    // kaiming_uniform with a = sqrt(5): bound = sqrt(6 / ((1 + 5) * fan_in)) = 1 / sqrt(fan_in)
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(float(n_in)), 1.0f / std::sqrt(float(n_in)));
    for (float& v : a) v = u(rng);
  } else {
    std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(cfg.rank)));
    for (float& v : a) v = nd(rng);
  }
  Graph& g = *w.g;
  Var va = g.param(g.backend().from_host(a, {cfg.rank, n_in}), name + ".lora_a");
  Var vb = g.param(g.backend().zeros({n_out, cfg.rank}, g.backend().real()), name + ".lora_b");
  return LoraLinear(w, va, vb, s, cfg.dropout, dropout_seed, dropout_salt);
}

LoraLinear::LoraLinear(Var w_, Var a_, Var b_, double scale_, double dropout_, uint64_t seed, Var salt)
    : w(w_), a(a_), b(b_), scale(scale_), dropout(dropout_), dropout_seed(seed), dropout_salt(salt) {
  const int64_t n_out = w.shape().at(0), n_in = w.shape().at(1);
  if (a.shape().size() != 2 || a.shape()[1] != n_in || b.shape().size() != 2 || b.shape()[0] != n_out ||
      b.shape()[1] != a.shape()[0])
    throw GraphError("LoRA: A " + shape_str(a.shape()) + " and B " + shape_str(b.shape()) +
                     " do not fit the weight " + shape_str(w.shape()) + " (want A [r, n_in], B [n_out, r])");
}

Var LoraLinear::operator()(Var x, Var x_frozen) const {
  Var xa = dropout > 0 ? ag::dropout(x, dropout, dropout_seed, dropout_salt) : x;
  return lora_linear(x_frozen.g ? x_frozen : x, w, a, b, scale, xa);
}

}  // namespace q4t::ag
