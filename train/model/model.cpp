#include "train/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "data/splitmix.h"
#include "kernels/cpu/threads.h"
#include "kernels/quant/f16.h"
#include "train/model/weight_mix.h"

namespace q4t::model {

namespace {

const std::map<std::string, std::string> kTargetTensor = {
    {"q", "attn_q"}, {"k", "attn_k"}, {"v", "attn_v"}, {"o", "attn_output"},
    {"gate", "ffn_gate"}, {"up", "ffn_up"}, {"down", "ffn_down"},
    {"qkv", "attn_qkv"}, {"gate_up", "ffn_up"}};

std::string ne_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// The autograd dtype a frozen matrix of this GGML type is stored as, or false when q4tune cannot use it.
bool matrix_dtype(gguf::GgmlType t, ag::DType real, ag::DType* out) {
  if (t == gguf::GgmlType::F32) {
    *out = real;
    return true;
  }
  const FormatTraits* f = find_format(uint32_t(t));
  if (!f) return false;
  *out = ag::frozen_dtype(f->format);
  return true;
}

}  // namespace

const std::vector<std::string>& all_lora_targets() {
  static const std::vector<std::string> t = {"q", "k", "v", "o", "gate", "up", "down"};
  return t;
}

std::vector<std::string> lora_targets(const ModelConfig& c) {
  std::vector<std::string> t;
  if (c.fused_qkv) t.push_back("qkv");
  else t.insert(t.end(), {"q", "k", "v"});
  t.push_back("o");
  if (c.fused_gate_up) t.push_back("gate_up");
  else t.insert(t.end(), {"gate", "up"});
  t.push_back("down");
  return t;
}

std::vector<std::string> resolve_targets(const ModelConfig& c, const std::vector<std::string>& requested) {
  const std::vector<std::string> own = lora_targets(c);
  std::vector<std::string> out;
  for (const std::string& r : requested) {
    std::string t = r;
    if (c.fused_qkv && (r == "q" || r == "k" || r == "v")) t = "qkv";
    if (c.fused_gate_up && (r == "gate" || r == "up")) t = "gate_up";
    if (std::find(own.begin(), own.end(), t) == own.end()) {
      std::string names;
      for (const std::string& n : own) names += (names.empty() ? "" : ", ") + n;
      throw std::invalid_argument("LoRA target '" + r + "' is not a projection of this " + c.arch + " model (its targets: " +
                                  names + ")");
    }
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  // In the model's order, so that every layer's adapters come out the same way.
  std::vector<std::string> ordered;
  for (const std::string& t : own)
    if (std::find(out.begin(), out.end(), t) != out.end()) ordered.push_back(t);
  return ordered;
}

std::string target_tensor_name(int64_t layer, const std::string& target) {
  auto it = kTargetTensor.find(target);
  if (it == kTargetTensor.end())
    throw std::invalid_argument("unknown LoRA target '" + target + "' (known: q, k, v, o, gate, up, down, and for "
                                "fused projections qkv, gate_up)");
  return "blk." + std::to_string(layer) + "." + it->second + ".weight";
}

void Model::load_tensor(const gguf::File& f, const std::string& name, const std::vector<int64_t>& ne, bool matrix) {
  const gguf::TensorInfo* t = f.tensor(name);
  if (!t) throw gguf::FormatError(f.path() + ": tensor '" + name + "' is missing");
  if (t->ne != ne)
    throw gguf::FormatError(f.path() + ": tensor '" + name + "' has ne " + ne_str(t->ne) + ", expected " +
                            ne_str(ne));
  ag::DType dt = be_.real();
  const bool ok = matrix ? matrix_dtype(t->type, be_.real(), &dt) : t->type == gguf::GgmlType::F32;
  if (!ok)
    throw gguf::FormatError(f.path() + ": tensor '" + name + "' has type " + gguf::type_name(t->type) +
                            ", which q4tune cannot use here (supported: f32" + (matrix ? ", " + format_list() : std::string()) + ")");
  // Shape as a row-major matrix [n_out, n_in] (ne reversed); vectors stay [n].
  const ag::Shape shape = ne.size() == 2 ? ag::Shape{ne[1], ne[0]} : ag::Shape{ne[0]};
  if (ag::is_frozen_storage(dt)) {
    weights_[name] = be_.quantized({t->data, t->bytes}, shape, dt);
    return;
  }
  weights_[name] = be_.from_host(std::span<const float>(reinterpret_cast<const float*>(t->data), t->bytes / 4), shape);
}

void Model::for_each_tensor(const ModelConfig& c,
                            const std::function<void(const std::string&, const std::vector<int64_t>&, bool)>& fn) {
  const int64_t C = c.n_embd, q_out = c.n_head * c.head_dim, kv_out = c.n_head_kv * c.head_dim;
  fn("token_embd.weight", {C, c.n_vocab}, true);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    fn(b + "attn_norm.weight", {C}, false);
    if (c.fused_qkv) {
      fn(b + "attn_qkv.weight", {C, q_out + 2 * kv_out}, true);
    } else {
      fn(b + "attn_q.weight", {C, q_out}, true);
      fn(b + "attn_k.weight", {C, kv_out}, true);
      fn(b + "attn_v.weight", {C, kv_out}, true);
    }
    fn(b + "attn_output.weight", {q_out, C}, true);
    if (c.gemma) fn(b + "post_attention_norm.weight", {C}, false);
    if (c.qkv_bias) {
      fn(b + "attn_q.bias", {q_out}, false);
      fn(b + "attn_k.bias", {kv_out}, false);
      fn(b + "attn_v.bias", {kv_out}, false);
    }
    if (c.qk_norm) {
      fn(b + "attn_q_norm.weight", {c.head_dim}, false);
      fn(b + "attn_k_norm.weight", {c.head_dim}, false);
    }
    fn(b + "ffn_norm.weight", {C}, false);
    if (c.fused_gate_up) {
      fn(b + "ffn_up.weight", {C, 2 * c.n_ff}, true);
    } else {
      fn(b + "ffn_gate.weight", {C, c.n_ff}, true);
      fn(b + "ffn_up.weight", {C, c.n_ff}, true);
    }
    fn(b + "ffn_down.weight", {c.n_ff, C}, true);
    if (c.gemma) fn(b + "post_ffw_norm.weight", {C}, false);
  }
  fn("output_norm.weight", {C}, false);
  if (!c.tied) fn("output.weight", {C, c.n_vocab}, true);
}

std::unique_ptr<Model> Model::load(const std::string& path, ag::Backend& be) { return load(*gguf::File::open(path), be); }

std::unique_ptr<Model> Model::load(const gguf::File& f, ag::Backend& be) {
  std::unique_ptr<Model> m(new Model(be));
  m->cfg_ = ModelConfig::from_gguf(f);
  std::set<std::string> used;
  for (const std::string& name : m->cfg_.config_tensors()) used.insert(name);
  for_each_tensor(m->cfg_, [&](const std::string& name, const std::vector<int64_t>& ne, bool matrix) {
    m->load_tensor(f, name, ne, matrix);
    used.insert(name);
  });
  // A tensor the model does not read would change llama.cpp's numbers but not q4tune's: refuse it by name.
  for (const gguf::TensorInfo& t : f.tensors())
    if (!used.count(t.name))
      throw gguf::FormatError(f.path() + ": tensor '" + t.name + "' is not part of a " + m->cfg_.arch +
                              " model as q4tune computes it (not supported)");
  return m;
}

Model::RandomWeights Model::parse_random_weights(const std::string& flag, const std::string& s) {
  if (s == "q4_0") return RandomWeights::Q4_0;
  if (s == "q4_k_m") return RandomWeights::Q4_K_M;
  if (s == "q8_0") return RandomWeights::Q8_0;
  if (s == "f16") return RandomWeights::F16;
  throw std::invalid_argument(flag + ": '" + s + "' is not one of q4_0, q4_k_m, q8_0, f16");
}

namespace {

// Rows of random blocks of type t, each value of spread about `spread`: random codes, and the scales that give
// that spread (one per matrix: the codes carry the randomness).
std::vector<uint8_t> random_rows(ag::DType t, int64_t n_out, int64_t n_in, uint64_t seed, double spread) {
  const int64_t row_bytes = frozen_row_bytes(t, n_in);
  std::vector<uint8_t> bytes(size_t(n_out * row_bytes));
  // Standard deviations of the codes: uniform 0..15 4.6, int8 74, Q4_K's sc·q about 31.5·4.6, Q6_K's (q − 32)·sc
  // about 18.5·18.
  const uint16_t d4 = quant::f32_to_f16(float(spread / 4.6)), d8 = quant::f32_to_f16(float(spread / 74.0));
  const uint16_t dk = quant::f32_to_f16(float(spread / (31.5 * 4.6))), dmk = quant::f32_to_f16(float(7.5 * spread / (31.5 * 4.6)));
  const uint16_t d6 = quant::f32_to_f16(float(spread / (18.5 * 18.0)));
  cpu::parallel_for(n_out, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      uint64_t state = splitmix64(seed ^ uint64_t(r));
      uint8_t* row = bytes.data() + r * row_bytes;
      for (int64_t i = 0; i < row_bytes; i += 8) {  // random bytes first, then each format's scales over them
        state = splitmix64(state);
        std::memcpy(row + i, &state, size_t(std::min<int64_t>(8, row_bytes - i)));
      }
      switch (t) {
        case ag::frozen_dtype(Format::Q4_0):
          for (int64_t b = 0; b < n_in / 32; ++b) std::memcpy(row + 18 * b, &d4, 2);
          break;
        case ag::frozen_dtype(Format::Q8_0):
          for (int64_t b = 0; b < n_in / 32; ++b) std::memcpy(row + 34 * b, &d8, 2);
          break;
        case ag::frozen_dtype(Format::Q4_K):
          for (int64_t b = 0; b < n_in / 256; ++b) {
            std::memcpy(row + 144 * b, &dk, 2);
            std::memcpy(row + 144 * b + 2, &dmk, 2);
          }
          break;
        case ag::frozen_dtype(Format::Q6_K):
          for (int64_t b = 0; b < n_in / 256; ++b) {
            uint8_t* blk = row + 210 * b;
            for (int j = 0; j < 16; ++j) blk[192 + j] = uint8_t(int8_t(int(blk[192 + j] % 64) - 32));
            std::memcpy(blk + 208, &d6, 2);
          }
          break;
        case ag::frozen_dtype(Format::F16):
          for (int64_t i = 0; i < n_in; ++i) {
            state = splitmix64(state);
            const float u = float(double(state >> 11) * 0x1.0p-53 * 2 - 1);  // uniform in [-1, 1): spread 1/sqrt(3)
            const uint16_t h = quant::f32_to_f16(float(u * spread * 1.7320508));
            std::memcpy(row + 2 * i, &h, 2);
          }
          break;
        default: {  // the other formats: uniform values of the same spread, through the format's quantizer
          std::vector<float> v(static_cast<size_t>(n_in), 0.0f);
          for (float& x : v) {
            state = splitmix64(state);
            x = float((double(state >> 11) * 0x1.0p-53 * 2 - 1) * spread * 1.7320508);
          }
          format_traits(ag::frozen_format(t)).quantize_row(row, v.data(), n_in);
          break;
        }
      }
    }
  });
  return bytes;
}

}  // namespace

std::unique_ptr<Model> Model::random(const ModelConfig& c, ag::Backend& be, uint64_t seed, RandomWeights w) {
  std::unique_ptr<Model> m(new Model(be));
  m->cfg_ = c;
  uint64_t tensor_index = 0;
  for_each_tensor(c, [&](const std::string& name, const std::vector<int64_t>& ne, bool matrix) {
    const uint64_t tensor_seed = splitmix64(seed ^ splitmix64(++tensor_index));
    if (!matrix) {
      const std::vector<float> v(size_t(ne[0]), name.find(".bias") != std::string::npos ? 0.0f : 1.0f);
      m->weights_[name] = be.from_host(std::span<const float>(v), ag::Shape{ne[0]});
      return;
    }
    const int64_t n_in = ne[0], n_out = ne[1];
    ag::DType t = ag::frozen_dtype(Format::Q4_0);
    if (w == RandomWeights::Q8_0) t = ag::frozen_dtype(Format::Q8_0);
    if (w == RandomWeights::F16) t = ag::frozen_dtype(Format::F16);
    if (w == RandomWeights::Q4_K_M) {
      const bool output = name == "output.weight" || (c.tied && name == "token_embd.weight");
      const int64_t layer = name.rfind("blk.", 0) == 0 ? std::stoll(name.substr(4, name.find('.', 4) - 4)) : -1;
      t = q4_k_m_takes_q6_k(name, layer, c.n_layer, output) ? ag::frozen_dtype(Format::Q6_K) : ag::frozen_dtype(Format::Q4_K);
    }
    const int64_t block = ag::block_elems(t);
    if (n_in % block != 0)
      throw std::invalid_argument("random model: " + name + " has rows of " + std::to_string(n_in) +
                                  " values, not a multiple of the " + std::to_string(block) + " of a " +
                                  ag::dtype_name(t) + " block");
    const auto bytes = random_rows(t, n_out, n_in, tensor_seed, 1.0 / std::sqrt(double(n_in)));
    m->weights_[name] = be.quantized(bytes, ag::Shape{n_out, n_in}, t);
  });
  return m;
}

const ag::Tensor& Model::weight(const std::string& name) const {
  auto it = weights_.find(name);
  if (it == weights_.end()) throw std::out_of_range("model has no tensor '" + name + "'");
  return it->second;
}

int64_t Model::weight_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : weights_) n += int64_t(t.bytes());
  return n;
}

ModelGraph::ModelGraph(const Model& m, ag::Graph& g, bool llama_cpp_numerics)
    : m_(m), g_(g), llama_cpp_numerics_(llama_cpp_numerics) {
  Model::for_each_tensor(m.config(), [&](const std::string& name, const std::vector<int64_t>&, bool) {
    vars_[name] = g.constant(m.weight(name), name);
  });
}

void ModelGraph::add_adapters(const LoraSpec& spec, std::mt19937& rng) {
  const int64_t n_layer = m_.config().n_layer;
  const int64_t end = spec.layer_end < 0 ? n_layer : spec.layer_end;
  if (spec.layer_begin < 0 || end > n_layer || spec.layer_begin >= end)
    throw std::invalid_argument("LoRA layer range [" + std::to_string(spec.layer_begin) + ", " +
                                std::to_string(end) + ") is outside the model's " + std::to_string(n_layer) +
                                " layers");
  if (spec.cfg.dropout > 0 && !dropout_salt_.g)
    dropout_salt_ = g_.constant(g_.backend().zeros({2}, ag::DType::I32), "lora.dropout_salt");
  uint64_t k = 0;
  const std::vector<std::string> targets = resolve_targets(m_.config(), spec.targets);
  for (int64_t l = spec.layer_begin; l < end; ++l)
    for (const std::string& t : targets) {
      const std::string name = target_tensor_name(l, t);
      // Each adapter's own mask: the seed is its position in the spec, the salt is shared and set per step.
      const uint64_t dropout_seed = 0x9e3779b97f4a7c15ull * ++k;
      adapters_.insert_or_assign(name, ag::LoraLinear::create(vars_.at(name), spec.cfg, name.substr(0, name.size() - 7),
                                                              rng, dropout_seed, dropout_salt_));
    }
}

ag::Var ModelGraph::frozen_input(ag::Var x, ag::Var w) const {
  // llama.cpp rounds the input of a quantized matrix to Q8_0 or Q8_K blocks, as the format's row says (its F16 and
  // BF16 matrices round it to 16 bits, which is not reproduced here).
  if (!llama_cpp_numerics_ || !ag::is_frozen_storage(w.value().dtype())) return x;
  switch (format_traits(ag::frozen_format(w.value().dtype())).llama_cpp_act_round) {
    case ActRound::Q8_0: return ag::act_round_q8_0(x);
    case ActRound::Q8_K: return ag::act_round_q8_k(x);
    case ActRound::None: break;
  }
  return x;
}

ag::Var ModelGraph::frozen_linear(ag::Var x, ag::Var w) const { return ag::linear(frozen_input(x, w), w); }

ag::Var ModelGraph::project(ag::Var x, int64_t layer, const std::string& target) const {
  const std::string name = target_tensor_name(layer, target);
  const ag::Var w = vars_.at(name);
  if (observe_) {
    g_.keep(x);
    observe_(name, x);
  }
  auto it = adapters_.find(name);
  if (it == adapters_.end()) return frozen_linear(x, w);
  return it->second(x, frozen_input(x, w));
}

void ModelGraph::keep_ffn_layers(int64_t n) {
  if (n < 0 || n > m_.config().n_layer)
    throw std::invalid_argument("ffn layers to keep: " + std::to_string(n) + " is outside 0.." +
                                std::to_string(m_.config().n_layer) + " (the model's layers)");
  keep_ffn_layers_ = n;
}

ag::Var ModelGraph::output_weight() const {
  return m_.config().tied ? vars_.at("token_embd.weight") : vars_.at("output.weight");
}

ag::Var ModelGraph::hidden(ag::Var ids, int64_t pos, ag::Var segments) const {
  const ModelConfig& c = m_.config();
  const int64_t n_ctx = rope_context_ > 0 ? rope_context_ : pos + ids.shape()[0];
  return hidden(ids, [&](int64_t l, ag::Var q, ag::Var k, ag::Var v) {
    const ag::RopeFreqs freqs = c.rope_freqs(l, n_ctx);
    q = ag::rope(q, c.n_head, c.head_dim, c.rope_mode, freqs, pos);
    k = ag::rope(k, c.n_head_kv, c.head_dim, c.rope_mode, freqs, pos);
    const ag::Var out = ag::attention(q, k, v, c.n_head, c.n_head_kv, c.attention_options(l), segments);
    // With recomputation, attention's inputs and output are kept rather than computed again: they cost far
    // more to compute (the q, k and v projections, attention's forward) than the memory they hold.
    for (const ag::Var& kept : {q, k, v, out}) g_.keep(kept);
    return out;
  });
}

ag::Var ModelGraph::hidden(ag::Var ids, const AttentionStep& attend) const {
  const ModelConfig& c = m_.config();
  ag::Var x = ag::embedding(vars_.at("token_embd.weight"), ids);
  if (c.gemma) x = ag::scale(x, double(std::sqrt(float(c.n_embd))));  // in f32, as llama.cpp's sqrtf
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    ag::Var h = ag::rms_norm(x, vars_.at(b + "attn_norm.weight"), c.rms_eps);
    ag::Var q, k, v;
    if (c.fused_qkv) {  // one product, q, k and v its column ranges
      const ag::Var qkv = project(h, l, "qkv");
      const int64_t nq = c.n_head * c.head_dim, nkv = c.n_head_kv * c.head_dim;
      q = ag::slice_cols(qkv, 0, nq), k = ag::slice_cols(qkv, nq, nkv), v = ag::slice_cols(qkv, nq + nkv, nkv);
    } else {
      q = project(h, l, "q"), k = project(h, l, "k"), v = project(h, l, "v");
    }
    if (c.qkv_bias) {
      q = ag::add(q, vars_.at(b + "attn_q.bias"));
      k = ag::add(k, vars_.at(b + "attn_k.bias"));
      v = ag::add(v, vars_.at(b + "attn_v.bias"));
    }
    if (c.qk_norm) {  // RMSNorm of each head's D values: q as [T*H, D] rows, k as [T*H_kv, D]
      const auto per_head = [&](const ag::Var& t, int64_t heads, const char* weight) {
        const int64_t T = t.shape()[0];
        return ag::reshape(ag::rms_norm(ag::reshape(t, {T * heads, c.head_dim}), vars_.at(b + weight), c.rms_eps),
                           {T, heads * c.head_dim});
      };
      q = per_head(q, c.n_head, "attn_q_norm.weight"), k = per_head(k, c.n_head_kv, "attn_k_norm.weight");
    }
    // Attention divides q·k by sqrt(head_dim); another scale is q's (RoPE is linear, so before it is the same).
    if (c.query_scale > 0) q = ag::scale(q, c.query_scale * std::sqrt(double(c.head_dim)));
    ag::Var attn = project(attend(l, q, k, v), l, "o");
    if (c.gemma) attn = ag::rms_norm(attn, vars_.at(b + "post_attention_norm.weight"), c.rms_eps);
    x = ag::add(x, attn);
    g_.keep(x);  // with recomputation: the residual the ffn norm reads, so the o projection is not run again
    h = ag::rms_norm(x, vars_.at(b + "ffn_norm.weight"), c.rms_eps);
    ag::Var gate, up;
    if (c.fused_gate_up) {  // one product: the gate half, then the up half
      const ag::Var gate_up = project(h, l, "gate_up");
      gate = ag::slice_cols(gate_up, 0, c.n_ff), up = ag::slice_cols(gate_up, c.n_ff, c.n_ff);
      if (l >= c.n_layer - keep_ffn_layers_) g_.keep(gate_up);
    } else {
      gate = project(h, l, "gate"), up = project(h, l, "up");
      if (l >= c.n_layer - keep_ffn_layers_)
        for (const ag::Var& kept : {gate, up}) g_.keep(kept);
    }
    ag::Var ffn = project(c.gemma ? ag::geglu(gate, up) : ag::swiglu(gate, up), l, "down");
    if (c.gemma) ffn = ag::rms_norm(ffn, vars_.at(b + "post_ffw_norm.weight"), c.rms_eps);
    x = ag::add(x, ffn);
    g_.checkpoint(x);
  }
  return ag::rms_norm(x, vars_.at("output_norm.weight"), c.rms_eps);
}

ag::Var ModelGraph::output_logits(ag::Var h) const {
  const ag::Var logits = frozen_linear(h, output_weight());
  const double cap = m_.config().final_softcap;
  return cap > 0 ? ag::softcap(logits, cap) : logits;
}

ag::Var ModelGraph::logits(ag::Var ids, int64_t pos) const { return output_logits(hidden(ids, pos)); }

ag::Var ModelGraph::logits(ag::Var ids, ag::Var segments) const { return output_logits(hidden(ids, 0, segments)); }

}  // namespace q4t::model

namespace q4t::model {

std::vector<AdapterPair> adapter_pairs(const gguf::File& adapter) {
  auto stem = [](const std::string& name, const std::string& suffix) {
    const bool has = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    return has ? std::optional<std::string>(name.substr(0, name.size() - suffix.size())) : std::nullopt;
  };
  std::vector<AdapterPair> pairs;
  for (const gguf::TensorInfo& t : adapter.tensors()) {
    if (const auto base = stem(t.name, ".lora_a")) {
      pairs.push_back({*base, &t, adapter.tensor(*base + ".lora_b")});
    } else if (const auto b = stem(t.name, ".lora_b")) {
      if (!adapter.tensor(*b + ".lora_a"))
        throw gguf::FormatError(adapter.path() + ": tensor '" + *b + ".lora_a' is missing (its lora_b is present)");
    } else {
      throw gguf::FormatError(adapter.path() + ": tensor '" + t.name +
                              "' is neither a .lora_a nor a .lora_b (a LoRA adapter holds only those)");
    }
  }
  return pairs;
}

void ModelGraph::load_adapters(const gguf::File& a, double user_scale) {
  auto fail = [&](const std::string& what) { throw gguf::FormatError(a.path() + ": " + what); };
  a.expect_adapter();
  if (a.get_string("general.type") != "adapter") fail("general.type is not 'adapter'");
  if (a.get_string("adapter.type") != "lora") fail("adapter.type '" + a.get_string("adapter.type") + "' is not 'lora'");
  if (a.get_string("general.architecture") != m_.config().arch)
    fail("adapter for architecture '" + a.get_string("general.architecture") + "', the model is '" +
         m_.config().arch + "'");
  const double alpha = a.get_float("adapter.lora.alpha");
  ag::Backend& be = g_.backend();
  const std::vector<AdapterPair> pairs = adapter_pairs(a);
  if (pairs.empty()) fail("no '*.lora_a' tensors");
  for (const auto& [base, pa, tb] : pairs) {
    const gguf::TensorInfo& ta = *pa;
    if (!tb) fail("tensor '" + base + ".lora_b' is missing (its lora_a is present)");
    auto w = vars_.find(base);
    if (w == vars_.end() || !m_.has_weight(base) || w->second.shape().size() != 2)
      fail("tensor '" + ta.name + "' adapts '" + base + "', which the model has no matrix for");
    const int64_t n_out = w->second.shape()[0], n_in = w->second.shape()[1];
    if (ta.ne.size() != 2 || tb->ne.size() != 2 || ta.ne[0] != n_in || tb->ne[1] != n_out || ta.ne[1] != tb->ne[0])
      fail("tensors '" + base + ".lora_a' " + ne_str(ta.ne) + " and '.lora_b' " + ne_str(tb->ne) +
           " do not fit the weight [" + std::to_string(n_out) + ", " + std::to_string(n_in) +
           "] (want lora_a ne [n_in, r], lora_b ne [r, n_out])");
    if (ta.type != gguf::GgmlType::F32 || tb->type != gguf::GgmlType::F32)
      fail("tensor '" + base + "' LoRA matrices must be f32");
    const int64_t r = ta.ne[1];
    auto as_var = [&](const gguf::TensorInfo& t, ag::Shape shape) {
      return g_.constant(be.from_host(std::span<const float>(reinterpret_cast<const float*>(t.data), t.bytes / 4), shape),
                         t.name);
    };
    adapters_.insert_or_assign(base, ag::LoraLinear(w->second, as_var(ta, {r, n_in}), as_var(*tb, {n_out, r}),
                                                    user_scale * alpha / double(r)));
  }
}

}  // namespace q4t::model
