#include "train/model/config.h"

#include <algorithm>
#include <cmath>

namespace q4t::model {

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> a = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};
  return a;
}

bool partial_rotary_allowed(const std::string& arch) { return arch == "phi3" || arch == "gemma2" || arch == "gemma3"; }

namespace {
[[noreturn]] void bad(const gguf::File& f, const std::string& key, const std::string& why) {
  throw gguf::FormatError(f.path() + ": key '" + key + "': " + why);
}

int64_t positive(const gguf::File& f, const std::string& key) {
  const uint64_t v = f.get_uint(key);
  if (v == 0 || v > (uint64_t(1) << 31)) bad(f, key, "value " + std::to_string(v) + " is out of range");
  return int64_t(v);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

RopeScaling read_rope_scaling(const gguf::File& f, const std::string& a, int64_t n_ctx) {
  RopeScaling s;
  const std::string type_key = a + "rope.scaling.type";
  std::string type = "linear";  // llama.cpp's default when the key is absent: linear with factor 1 = none
  if (f.find(type_key)) type = f.get_string(type_key);
  double factor = f.get_float_or(a + "rope.scaling.factor", 0.0);
  if (factor == 0.0) factor = f.get_float_or(a + "rope.scale_linear", 0.0);
  if (factor == 0.0) factor = 1.0;
  if (!(factor > 0) || !std::isfinite(factor)) bad(f, a + "rope.scaling.factor", "must be positive");
  if (type == "none") {
    s.type = RopeScaling::Type::None;
    factor = 1.0;
  } else if (type == "linear") {
    s.type = factor == 1.0 ? RopeScaling::Type::None : RopeScaling::Type::Linear;
  } else if (type == "yarn") {
    s.type = RopeScaling::Type::Yarn;
  } else {
    bad(f, type_key, "'" + type + "' is not supported (supported: none, linear, yarn)");
  }
  s.factor = factor;
  s.n_ctx_orig = int64_t(f.get_uint_or(a + "rope.scaling.original_context_length", uint64_t(n_ctx)));
  if (s.n_ctx_orig <= 0) bad(f, a + "rope.scaling.original_context_length", "must be positive");
  s.attn_factor = f.get_float_or(a + "rope.scaling.attn_factor", 1.0);
  if (!(s.attn_factor > 0) || !std::isfinite(s.attn_factor)) bad(f, a + "rope.scaling.attn_factor", "must be positive");
  s.yarn_log_mul = f.get_float_or(a + "rope.scaling.yarn_log_multiplier", 0.0);
  if (!std::isfinite(s.yarn_log_mul)) bad(f, a + "rope.scaling.yarn_log_multiplier", "must be finite");
  return s;
}

// A tensor of one factor per rotated pair, f32 [n_rot / 2] and positive; empty when the file has none.
std::vector<double> pair_factors(const gguf::File& f, const std::string& name, int64_t n_rot) {
  const gguf::TensorInfo* t = f.tensor(name);
  if (!t) return {};
  if (t->type != gguf::GgmlType::F32 || t->ne != std::vector<int64_t>{n_rot / 2})
    throw gguf::FormatError(f.path() + ": tensor '" + name + "' must be f32 [" + std::to_string(n_rot / 2) +
                            "] (rotated dims / 2)");
  const float* v = reinterpret_cast<const float*>(t->data);
  std::vector<double> out(v, v + n_rot / 2);
  for (double x : out)
    if (!(x > 0) || !std::isfinite(x))
      throw gguf::FormatError(f.path() + ": tensor '" + name + "' holds a factor that is not positive");
  return out;
}

// gemma2 and gemma3, with llama.cpp's defaults for absent keys.
void read_gemma(const gguf::File& f, const std::string& a, ModelConfig& c) {
  c.gemma = true;
  const bool g2 = c.arch == "gemma2";
  // llama.cpp scales q by 1/sqrt(n_embd / n_head) in the 27B models (told apart by their layer count), as
  // their query_pre_attn_scalar says; the others by 1/sqrt(head size).
  if ((g2 && c.n_layer == 46) || (!g2 && c.n_layer == 62)) c.query_scale = 1.0 / std::sqrt(double(c.n_embd / c.n_head));
  const auto positive_float = [&](const std::string& key, double def) {
    const double v = f.get_float_or(a + key, def);
    if (!(v >= 0) || !std::isfinite(v)) bad(f, a + key, "must be non-negative");
    return v;
  };
  c.final_softcap = positive_float("final_logit_softcapping", g2 ? 30.0 : 0.0);
  if (g2) c.attn_softcap = positive_float("attn_logit_softcapping", 50.0);
  const std::string window_key = a + "attention.sliding_window";
  c.n_swa = int64_t(f.get_uint_or(window_key, g2 ? 4096 : 0));
  if (c.n_swa > 0) {
    // Local layers: every layer but each `pattern`-th (gemma2 2: even layers local; gemma3 6: five of six),
    // or the key's per-layer booleans.
    c.swa_layers.assign(size_t(c.n_layer), false);
    const std::string pattern_key = a + "attention.sliding_window_pattern";
    const gguf::Value* pv = f.find(pattern_key);
    if (pv && pv->type == gguf::ValueType::ARRAY) {
      const auto& items = f.get_array(pattern_key, gguf::ValueType::BOOL);
      if (int64_t(items.size()) != c.n_layer)
        bad(f, pattern_key, "has " + std::to_string(items.size()) + " entries for " + std::to_string(c.n_layer) + " layers");
      for (size_t l = 0; l < items.size(); ++l) c.swa_layers[l] = std::get<bool>(items[l].v);
    } else {
      const int64_t n = int64_t(f.get_uint_or(pattern_key, g2 ? 2 : 6));
      for (int64_t l = 0; l < c.n_layer; ++l) c.swa_layers[size_t(l)] = n == 0 || l % n < n - 1;
    }
    c.rope_base_swa = f.get_float_or(a + "rope.freq_base_swa", g2 ? c.rope_base : 10000.0);
    if (!(c.rope_base_swa > 0)) bad(f, a + "rope.freq_base_swa", "must be positive");
    c.swa_rope_scaled = g2;
  }
  if (g2 && !c.tied)  // llama.cpp's gemma2 reads token_embd as its output matrix and never output.weight
    throw gguf::FormatError(f.path() + ": tensor 'output.weight': gemma2 has no output matrix of its own (not supported)");
}

}  // namespace

// llama.cpp's rotation (ggml's rope with freq_factors and YaRN, llama_context's attention factor): pair i turns by
// pos * base^(-2i/D) / factor_i, times freq_scale = 1/scaling factor; YaRN blends that with the unscaled angle by
// a ramp over the pairs between its two correction dims and multiplies cos and sin by its attention factor.
// A local (sliding-window) layer has its own base and, in gemma3, no scaling (llama.cpp's freq_scale_swa of 1).
ag::RopeFreqs ModelConfig::rope_freqs(int64_t layer, int64_t n_ctx) const {
  const int64_t D = n_rot > 0 ? n_rot : head_dim;  // ggml's n_dims: the rotated dims set the frequencies and
                                                    // YaRN's correction dims
  const bool local = is_swa(layer);
  const double base = local ? rope_base_swa : rope_base;
  ag::RopeFreqs r = ag::RopeFreqs::plain(D, base);
  const bool long_ctx = !rope_factors_long.empty() && n_ctx > rope_scaling.n_ctx_orig;
  const std::vector<double>& factors = long_ctx ? rope_factors_long : rope_factors;
  for (size_t i = 0; i < factors.size() && i < r.freq.size(); ++i) r.freq[i] /= factors[i];
  const RopeScaling& s = rope_scaling;
  const double freq_scale = s.type == RopeScaling::Type::None || (local && !swa_rope_scaled) ? 1.0 : 1.0 / s.factor;
  r.mscale = s.attn_factor;
  if (s.type != RopeScaling::Type::Yarn) {
    for (double& w : r.freq) w *= freq_scale;
    return r;
  }
  // The correction dims, in f32 as ggml computes them.
  const auto corr_dim = [&](float beta) {
    return float(D) * std::log(float(s.n_ctx_orig) / (beta * 2.0f * float(M_PI))) / (2.0f * std::log(float(base)));
  };
  const float low = std::max(0.0f, std::floor(corr_dim(32.0f))), high = std::min(float(D - 1), std::ceil(corr_dim(1.0f)));
  for (size_t i = 0; i < r.freq.size(); ++i) {
    const float y = (float(i) - low) / std::max(0.001f, high - low);
    const double mix = 1.0 - std::min(1.0f, std::max(0.0f, y));
    r.freq[i] *= freq_scale * (1.0 - mix) + mix;
  }
  const double f = s.factor;
  const auto mscale_of = [&](double m) { return f <= 1.0 ? 1.0 : 0.1 * m * std::log(f) + 1.0; };
  const double attn = s.yarn_log_mul != 0.0 ? mscale_of(1.0) / mscale_of(s.yarn_log_mul) : mscale_of(1.0);
  // llama.cpp divides its attention factor by the 1 + 0.1 ln(factor) that ggml's YaRN multiplies back.
  r.mscale = attn / (1.0 + 0.1 * std::log(f)) * s.attn_factor * (1.0 + 0.1 * std::log(1.0 / freq_scale));
  return r;
}

ag::AttentionOptions ModelConfig::attention_options(int64_t layer) const {
  return {is_swa(layer) ? n_swa : 0, attn_softcap};
}

std::vector<std::string> ModelConfig::config_tensors() const {
  if (arch == "phi3") {
    std::vector<std::string> t;
    if (!rope_factors.empty()) t.push_back("rope_factors_short.weight");
    if (!rope_factors_long.empty()) t.push_back("rope_factors_long.weight");
    return t;
  }
  if (!rope_factors.empty()) return {"rope_freqs.weight"};
  return {};
}

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  f.expect_model();
  c.arch = f.get_string("general.architecture");
  const auto& archs = supported_architectures();
  if (std::find(archs.begin(), archs.end(), c.arch) == archs.end())
    bad(f, "general.architecture", "'" + c.arch + "' is not supported (supported: " + joined(archs) + ")");
  const std::string a = c.arch + ".";
  c.n_embd = positive(f, a + "embedding_length");
  c.n_layer = positive(f, a + "block_count");
  c.n_ff = positive(f, a + "feed_forward_length");
  c.n_head = positive(f, a + "attention.head_count");
  c.n_head_kv = int64_t(f.get_uint_or(a + "attention.head_count_kv", uint64_t(c.n_head)));
  c.n_ctx = int64_t(f.get_uint_or(a + "context_length", 2048));
  c.rope_base = f.get_float_or(a + "rope.freq_base", 10000.0);
  c.rms_eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0)
    bad(f, a + "attention.head_count_kv", "must divide attention.head_count (" + std::to_string(c.n_head) + ")");
  if (!f.find(a + "attention.key_length") && c.n_embd % c.n_head != 0)
    bad(f, a + "attention.head_count", "does not divide the embedding length");
  c.head_dim = int64_t(f.get_uint_or(a + "attention.key_length", uint64_t(c.n_embd / c.n_head)));
  const int64_t head_v = int64_t(f.get_uint_or(a + "attention.value_length", uint64_t(c.head_dim)));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) bad(f, a + "attention.key_length", "must be positive and even");
  if (head_v != c.head_dim)
    bad(f, a + "attention.value_length", std::to_string(head_v) + " differs from attention.key_length " +
                                             std::to_string(c.head_dim) + " (not supported)");
  c.n_rot = int64_t(f.get_uint_or(a + "rope.dimension_count", uint64_t(c.head_dim)));
  if (c.n_rot <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    bad(f, a + "rope.dimension_count", std::to_string(c.n_rot) + " must be even and at most the head size " +
                                           std::to_string(c.head_dim));
  if (c.n_rot != c.head_dim && !partial_rotary_allowed(c.arch))
    bad(f, a + "rope.dimension_count", std::to_string(c.n_rot) + " differs from the head size " +
                                           std::to_string(c.head_dim) + " (partial rotary is not supported for " +
                                           c.arch + ")");
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) bad(f, a + "attention.layer_norm_rms_epsilon", "must be in (0, 1)");
  if (!(c.rope_base > 0)) bad(f, a + "rope.freq_base", "must be positive");
  c.rope_scaling = read_rope_scaling(f, a, c.n_ctx);
  c.rope_mode = c.arch == "llama" ? ag::RopeMode::Norm : ag::RopeMode::Neox;
  c.qkv_bias = c.arch == "qwen2";
  c.qk_norm = c.arch == "qwen3" || c.arch == "gemma3";
  c.tied = f.tensor("output.weight") == nullptr;
  if (c.arch == "gemma2" || c.arch == "gemma3") read_gemma(f, a, c);
  // llama 3.1+: one factor per rotated pair (llama.cpp reads it for llama only); phi3: LongRoPE's two sets.
  if (f.tensor("rope_freqs.weight") && c.arch != "llama")
    throw gguf::FormatError(f.path() + ": tensor 'rope_freqs.weight' is not supported for architecture '" + c.arch + "'");
  c.rope_factors = pair_factors(f, "rope_freqs.weight", c.n_rot);
  if (c.arch == "phi3") {
    c.rope_factors = pair_factors(f, "rope_factors_short.weight", c.n_rot);
    c.rope_factors_long = pair_factors(f, "rope_factors_long.weight", c.n_rot);
    c.fused_qkv = f.tensor("blk.0.attn_qkv.weight") != nullptr;
    c.fused_gate_up = true;
  }
  const gguf::TensorInfo* emb = f.tensor("token_embd.weight");
  if (!emb) throw gguf::FormatError(f.path() + ": tensor 'token_embd.weight' is missing");
  if (emb->ne.size() != 2 || emb->ne[0] != c.n_embd)
    throw gguf::FormatError(f.path() + ": tensor 'token_embd.weight' has ne[0] = " + std::to_string(emb->ne[0]) +
                            ", expected the embedding length " + std::to_string(c.n_embd));
  c.n_vocab = emb->ne.size() == 2 ? emb->ne[1] : 0;
  return c;
}

}  // namespace q4t::model
