// q4tune init-model, quantize and logits: making small models, converting F32/F16 GGUFs to Q4_0 or Q4_K_M, and running
// the forward on given token ids (for users debugging a model or an adapter, and for the interop tests).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "autograd/ops.h"
#include "data/atomic_file.h"
#include "data/gguf.h"
#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "train/cli_common.h"
#include "train/commands.h"
#include "train/device_choice.h"
#include "train/memory_estimate.h"
#include "train/model/config.h"
#include "train/model/model.h"
#include "train/model/weight_mix.h"
#include "train/run_log.h"

namespace q4t {

namespace {

using gguf::GgmlType;
using gguf::Value;
using gguf::ValueType;

// A byte-level SentencePiece-style vocabulary: <unk>, <s>, </s>, one byte-fallback token per byte, then "▁" (the
// space as SentencePiece writes it), so a space is one token that decodes to " " rather than three bytes of "▁";
// then the given control tokens. Returns the number of tokens.
int64_t write_byte_vocab(gguf::Writer& w, const std::vector<std::string>& extra_control = {}) {
  std::vector<Value> tokens, scores, types;
  auto push = [&](const std::string& t, int32_t type) {
    tokens.push_back(Value::str(t));
    scores.push_back(Value::f32(0.0f));
    types.push_back(Value::i32(type));
  };
  push("<unk>", 2);  // UNKNOWN
  push("<s>", 3);    // CONTROL
  push("</s>", 3);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    push(name, 6);  // BYTE
  }
  push("\xe2\x96\x81", 1);  // NORMAL
  for (const std::string& t : extra_control) push(t, 3);
  const int64_t n = int64_t(tokens.size());
  w.set("tokenizer.ggml.model", Value::str("llama"));
  w.set("tokenizer.ggml.tokens", Value::array(ValueType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", Value::array(ValueType::F32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::I32, std::move(types)));
  w.set("tokenizer.ggml.unknown_token_id", Value::u32(0));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  return n;
}

std::vector<uint8_t> as_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A matrix [n_out, n_in] stored as `type` (any type the recipe below picks): the GGUF ne is {n_in, n_out}.
void add_matrix(gguf::Writer& w, const std::string& name, const std::vector<float>& v, int64_t n_out, int64_t n_in,
                GgmlType type) {
  std::vector<uint8_t> data;
  if (type == GgmlType::F32) {
    data = as_bytes(v);
  } else {
    const FormatTraits* f = find_format(uint32_t(type));
    if (!f) throw std::logic_error(std::string("add_matrix: no quantizer for ") + gguf::type_name(type));
    data = quantize_matrix(f->format, v, n_out, n_in);
  }
  w.add_tensor(name, {n_in, n_out}, type, std::move(data));
}

// The weight types a file can be written in: one format for every matrix (`pure`: init-model's --type <format>),
// or a mix as llama-quantize writes it for one of its file types (quantize --type, and init-model's mix names).
struct Recipe {
  std::string name;    // "q4_k_m", or a format's name
  GgmlType base;       // the type of most matrices
  uint32_t file_type;  // general.file_type (llama_ftype)
  bool mix;            // llama-quantize's choices for the output, attn_v, ffn_down and attn_output matrices
};

// llama_ftype's numbers of the mixes q4tune writes; a format without one of its own is written pure.
struct FileTypeName {
  const char* name;
  GgmlType base;
  uint32_t file_type;
};
constexpr FileTypeName kMixes[] = {
    {"q4_0", GgmlType::Q4_0, 2},    {"q4_1", GgmlType::Q4_1, 3},     {"q8_0", GgmlType::Q8_0, 7},
    {"q5_0", GgmlType::Q5_0, 8},    {"q5_1", GgmlType::Q5_1, 9},     {"q2_k", GgmlType::Q2_K, 10},
    {"q3_k_m", GgmlType::Q3_K, 12}, {"q4_k_m", GgmlType::Q4_K, 15},  {"q5_k_s", GgmlType::Q5_K, 16},
    {"q5_k_m", GgmlType::Q5_K, 17}, {"q6_k", GgmlType::Q6_K, 18},    {"iq4_nl", GgmlType::IQ4_NL, 25},
    {"iq4_xs", GgmlType::IQ4_XS, 30}, {"bf16", GgmlType::BF16, 32},
};

std::string recipe_names() {
  std::string s = "f32, " + format_list();
  for (const FileTypeName& m : kMixes)
    if (!find_format(std::string_view(m.name))) s += std::string(", ") + m.name;
  return s;
}

// `pure`: a format's name means every matrix in it (init-model); otherwise llama-quantize's mix of that name.
Recipe parse_recipe(const std::string& flag, const std::string& s, bool pure) {
  if (s == "f32") return {s, GgmlType::F32, 0, false};
  if (s == "f16") return {s, GgmlType::F16, 1, false};
  for (const FileTypeName& m : kMixes)
    if (s == m.name && !(pure && find_format(std::string_view(m.name)))) return {s, m.base, m.file_type, true};
  if (const FormatTraits* f = find_format(std::string_view(s))) {
    for (const FileTypeName& m : kMixes)
      if (m.base == GgmlType(uint32_t(f->format))) return {s, m.base, m.file_type, false};
    return {s, GgmlType(uint32_t(f->format)), 0, false};
  }
  throw std::invalid_argument(flag + ": '" + s + "' is not one of " + recipe_names());
}

// What llama-quantize writes where a matrix's rows are not whole 256-weight super-blocks.
GgmlType k_fallback(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K:
    case GgmlType::Q3_K: return GgmlType::Q4_0;
    case GgmlType::IQ4_XS: return GgmlType::IQ4_NL;
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    default: return t;
  }
}

// The type of matrix `name` (rows of n_in weights, in layer `layer` of n_layers; n_gqa = heads / kv heads) under a
// recipe, as llama-quantize picks it for llama and qwen2 without an importance matrix:
// - the output matrix (output.weight, or token_embd.weight when tied) is Q6_K, except in a Q8_0 file;
// - attn_v: Q2_K's Q3_K (Q4_K where n_gqa >= 4), Q3_K_M's Q5_K for the first two layers and Q4_K after,
//   Q4_K_M's and Q5_K_M's Q6_K in the "more bits" layers, IQ4_NL's and IQ4_XS's Q5_K where n_gqa >= 4;
// - ffn_down: Q2_K's Q3_K, Q3_K_M's Q5_K in the first sixteenth of the layers and Q4_K after, Q4_K_M's and Q5_K_M's
//   Q6_K in the "more bits" layers, IQ4_NL's and IQ4_XS's Q5_K in the first eighth;
// - attn_output: Q2_K's Q3_K, Q3_K_M's Q4_K;
// - rows that are not whole super-blocks fall back as llama-quantize does (k_fallback); rows that are not whole
//   32-weight blocks stay F32.
GgmlType matrix_type(const Recipe& r, const std::string& name, int64_t n_in, int64_t layer, int64_t n_layers,
                     int64_t n_gqa, bool output) {
  GgmlType t = r.base;
  if (r.mix) {
    const std::string& f = r.name;
    const bool more = layer >= 0 && model::more_bits_layer(layer, n_layers);
    const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
    if (output) {
      if (t != GgmlType::Q8_0 && t != GgmlType::BF16) t = GgmlType::Q6_K;
    } else if (has("attn_v.weight")) {
      if (f == "q2_k") t = n_gqa >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
      else if (f == "q3_k_m") t = layer < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
      else if ((f == "q4_k_m" || f == "q5_k_m") && more) t = GgmlType::Q6_K;
      else if ((f == "iq4_nl" || f == "iq4_xs") && n_gqa >= 4) t = GgmlType::Q5_K;
    } else if (has("ffn_down.weight")) {
      if (f == "q2_k") t = GgmlType::Q3_K;
      else if (f == "q3_k_m") t = layer < n_layers / 16 ? GgmlType::Q5_K : GgmlType::Q4_K;
      else if ((f == "q4_k_m" || f == "q5_k_m") && more) t = GgmlType::Q6_K;
      else if ((f == "iq4_nl" || f == "iq4_xs") && layer < n_layers / 8) t = GgmlType::Q5_K;
    } else if (has("attn_output.weight")) {
      if (f == "q2_k") t = GgmlType::Q3_K;
      else if (f == "q3_k_m") t = GgmlType::Q4_K;
    }
  }
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) return t;
  const FormatTraits& ft = format_traits(Format(uint32_t(t)));
  if (ft.block_elems == 256 && n_in % 256 != 0) t = k_fallback(t);
  if (n_in % format_traits(Format(uint32_t(t))).block_elems != 0) t = GgmlType::F32;
  return t;
}

// The layer index in "blk.N.…", or -1.
int64_t layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::stoll(name.substr(4, name.find('.', 4) - 4));
}

}  // namespace

TypePlan plan_types(const gguf::File& f, const std::string& flag, const std::string& type_name, bool requantize) {
  const Recipe recipe = parse_recipe(flag, type_name, false);
  const std::string arch = f.find("general.architecture") ? f.get_string("general.architecture") : "";
  const int64_t n_layers = int64_t(f.get_uint_or(arch + ".block_count", 0));
  const int64_t n_head = int64_t(f.get_uint_or(arch + ".attention.head_count", 1));
  const int64_t n_gqa = n_head / std::max<int64_t>(1, int64_t(f.get_uint_or(arch + ".attention.head_count_kv", n_head)));
  const bool tied = f.tensor("output.weight") == nullptr;
  TypePlan plan{{}, recipe.base, recipe.file_type};
  for (const gguf::TensorInfo& t : f.tensors()) {
    const bool weight = t.ne.size() == 2 && (requantize || t.type == GgmlType::F32 || t.type == GgmlType::F16);
    const bool output = t.name == "output.weight" || (tied && t.name == "token_embd.weight");
    plan.types.push_back(weight ? matrix_type(recipe, t.name, t.ne[0], layer_of(t.name), n_layers, n_gqa, output)
                                : t.type);
  }
  return plan;
}

// Llama 3.1's per-pair RoPE factors (its converter's formula): factor 8 for the pairs whose wavelength exceeds the
// original context, 1 for those below a quarter of it, and a smooth blend between.
std::vector<float> llama3_rope_factors(int64_t head_dim, double base, int64_t n_ctx_orig) {
  const double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
  const double low_wavelen = double(n_ctx_orig) / low_freq_factor, high_wavelen = double(n_ctx_orig) / high_freq_factor;
  std::vector<float> f;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double wavelen = 2 * M_PI * std::pow(base, 2.0 * double(i) / double(head_dim));
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(float(factor));
    } else {
      const double smooth = (double(n_ctx_orig) / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f.push_back(float(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return f;
}

namespace {

// The sizes init-model's options give: the head size, its rotated dims and the RoPE scaling.
struct InitModelShape {
  int64_t head_dim = 0, rope_dims = 0;
  std::string scaling_type;  // "", linear or yarn
  double scaling_factor = 1;
};

// Checks init-model's options (std::invalid_argument naming the flag) and works out the sizes they give.
InitModelShape check_init_model(const InitModelOptions& o) {
  const std::vector<std::string>& archs = model::supported_architectures();
  if (std::find(archs.begin(), archs.end(), o.arch) == archs.end()) {
    std::string names;
    for (const std::string& a : archs) names += (names.empty() ? "" : ", ") + a;
    throw std::invalid_argument("--arch: '" + o.arch + "' is not supported (supported: " + names + ")");
  }
  if (o.dim <= 0 || o.layers <= 0 || o.heads <= 0 || o.kv_heads <= 0 || o.ff <= 0 || o.ctx <= 0 || o.head_dim < 0)
    throw std::invalid_argument("init-model: --dim, --layers, --heads, --kv-heads, --ff and --ctx must be positive");
  if ((o.head_dim == 0 && o.dim % o.heads != 0) || o.heads % o.kv_heads != 0)
    throw std::invalid_argument("init-model: --heads must divide --dim (or give --head-dim), and --kv-heads must divide --heads");
  InitModelShape s;
  const int64_t D = s.head_dim = o.head_dim > 0 ? o.head_dim : o.dim / o.heads;
  if (D % 2 != 0) throw std::invalid_argument("init-model: the head size " + std::to_string(D) + " must be even");
  const int64_t R = s.rope_dims = o.rope_dims > 0 ? o.rope_dims : D;
  if (R % 2 != 0 || R > D || o.rope_dims < 0 || (R != D && !model::partial_rotary_allowed(o.arch)))
    throw std::invalid_argument("--rope-dims: " + std::to_string(o.rope_dims) + " must be even, at most the head size " +
                                std::to_string(D) + ", and less than it for phi3 and gemma only");
  if (o.rope_freqs && o.arch != "llama") throw std::invalid_argument("--rope-freqs: only llama models carry rope_freqs.weight");
  if (o.arch == "gemma2" && !o.tied)
    throw std::invalid_argument("init-model: gemma2 always uses token_embd as its output matrix: add --tied");
  if (o.sliding_window < 0 || o.swa_pattern < 0) throw std::invalid_argument("init-model: --sliding-window and --swa-pattern must be non-negative");
  if (o.longrope != 0 && (o.arch != "phi3" || o.longrope < 1)) throw std::invalid_argument("--longrope: a positive original context, for phi3 only");
  if (!o.rope_scaling.empty()) {
    const size_t colon = o.rope_scaling.find(':');
    s.scaling_type = o.rope_scaling.substr(0, colon);
    char* end = nullptr;
    const std::string factor = colon == std::string::npos ? "" : o.rope_scaling.substr(colon + 1);
    s.scaling_factor = std::strtod(factor.c_str(), &end);
    if ((s.scaling_type != "linear" && s.scaling_type != "yarn") || factor.empty() || *end != '\0' || !(s.scaling_factor > 0))
      throw std::invalid_argument("--rope-scaling: '" + o.rope_scaling + "' is not linear:FACTOR or yarn:FACTOR");
  }
  return s;
}

// The architecture's hyperparameters under "<arch>.", as llama.cpp reads them.
void set_init_model_metadata(gguf::Writer& w, const InitModelOptions& o, const InitModelShape& s, uint32_t file_type) {
  const bool gemma = o.arch == "gemma2" || o.arch == "gemma3";
  const std::string a = o.arch + ".";
  w.set("general.architecture", Value::str(o.arch));
  w.set("general.name", Value::str("q4tune random " + o.arch));
  w.set("general.file_type", Value::u32(file_type));
  w.set(a + "context_length", Value::u32(uint32_t(o.ctx)));
  w.set(a + "embedding_length", Value::u32(uint32_t(o.dim)));
  w.set(a + "block_count", Value::u32(uint32_t(o.layers)));
  w.set(a + "feed_forward_length", Value::u32(uint32_t(o.ff)));
  w.set(a + "attention.head_count", Value::u32(uint32_t(o.heads)));
  w.set(a + "attention.head_count_kv", Value::u32(uint32_t(o.kv_heads)));
  w.set(a + "rope.dimension_count", Value::u32(uint32_t(s.rope_dims)));
  w.set(a + "rope.freq_base", Value::f32(float(o.rope_base)));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(1e-5f));
  if (gemma) {
    if (o.sliding_window > 0) w.set(a + "attention.sliding_window", Value::u32(uint32_t(o.sliding_window)));
    if (o.swa_pattern > 0) w.set(a + "attention.sliding_window_pattern", Value::u32(uint32_t(o.swa_pattern)));
    if (o.arch == "gemma3") w.set(a + "rope.freq_base_swa", Value::f32(10000.0f));
    if (o.attn_softcap >= 0 && o.arch == "gemma2") w.set(a + "attn_logit_softcapping", Value::f32(float(o.attn_softcap)));
    if (o.final_softcap >= 0) w.set(a + "final_logit_softcapping", Value::f32(float(o.final_softcap)));
  }
  if (o.longrope > 0) {  // as the converter writes LongRoPE: factors, the original context, the attention factor
    const double scale = double(o.ctx) / double(o.longrope);
    w.set(a + "rope.scaling.original_context_length", Value::u32(uint32_t(o.longrope)));
    w.set(a + "rope.scaling.attn_factor",
          Value::f32(float(scale > 1 ? std::sqrt(1 + std::log(scale) / std::log(double(o.longrope))) : 1.0)));
  }
  if (o.head_dim > 0 || o.arch == "qwen3" || gemma) {
    w.set(a + "attention.key_length", Value::u32(uint32_t(s.head_dim)));
    w.set(a + "attention.value_length", Value::u32(uint32_t(s.head_dim)));
  }
  if (!s.scaling_type.empty()) {
    w.set(a + "rope.scaling.type", Value::str(s.scaling_type));
    w.set(a + "rope.scaling.factor", Value::f32(float(s.scaling_factor)));
    w.set(a + "rope.scaling.original_context_length", Value::u32(uint32_t(o.ctx)));
  }
}

// phi3's LongRoPE factors over the rotated pairs (R/2 of each): short ones near 1, long ones growing to 8.
void add_longrope_factors(gguf::Writer& w, int64_t R) {
  std::vector<float> s(static_cast<size_t>(R / 2)), l(static_cast<size_t>(R / 2));
  for (int64_t i = 0; i < R / 2; ++i) {
    s[size_t(i)] = float(1.0 + 0.1 * double(i) / double(R / 2));
    l[size_t(i)] = float(1.0 + 7.0 * double(i) / double(R / 2));
  }
  w.add_tensor("rope_factors_long.weight", {R / 2}, GgmlType::F32, as_bytes(l));
  w.add_tensor("rope_factors_short.weight", {R / 2}, GgmlType::F32, as_bytes(s));
}

}  // namespace

int run_init_model(const InitModelOptions& o, std::ostream& out) {
  const InitModelShape shape = check_init_model(o);
  const int64_t D = shape.head_dim, R = shape.rope_dims;
  const bool gemma = o.arch == "gemma2" || o.arch == "gemma3", phi3 = o.arch == "phi3";
  const Recipe recipe = parse_recipe("--type", o.type, true);
  // llama.cpp looks up <|endoftext|> in a phi3 file's vocabulary (its special-token attributes).
  const std::vector<std::string> extra_tokens = phi3 ? std::vector<std::string>{"<|endoftext|>"} : std::vector<std::string>{};
  const int64_t C = o.dim, H = o.heads, Hkv = o.kv_heads, F = o.ff, V = 260 + int64_t(extra_tokens.size());
  std::mt19937 rng(o.seed);
  auto uniform = [&](int64_t n, double a) {
    std::uniform_real_distribution<float> u(float(-a), float(a));
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
  };
  // Unit-gain weights (variance 1/n_in) keep activations O(1) through the layers.
  auto type_of = [&](const std::string& name, int64_t n_in, bool output) {
    return matrix_type(recipe, name, n_in, layer_of(name), o.layers, o.heads / o.kv_heads, output);
  };
  auto matrix = [&](const std::string& name, int64_t n_out, int64_t n_in, gguf::Writer& w) {
    add_matrix(w, name, uniform(n_out * n_in, std::sqrt(3.0 / double(n_in))), n_out, n_in,
               type_of(name, n_in, name == "output.weight"));
  };
  auto norm = [&](const std::string& name, gguf::Writer& w, int64_t n) {
    std::vector<float> v = uniform(n, 0.2);
    for (float& x : v) x += 1.0f;
    w.add_tensor(name, {n}, GgmlType::F32, as_bytes(v));
  };

  gguf::Writer w;
  set_init_model_metadata(w, o, shape, recipe.file_type);
  if (write_byte_vocab(w, extra_tokens) != V) throw std::logic_error("init-model: the vocabulary's size");
  if (o.rope_freqs) w.add_tensor("rope_freqs.weight", {D / 2}, GgmlType::F32, as_bytes(llama3_rope_factors(D, o.rope_base, o.ctx)));
  if (o.longrope > 0) add_longrope_factors(w, R);

  add_matrix(w, "token_embd.weight", uniform(V * C, 1.0), V, C, type_of("token_embd.weight", C, o.tied));
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    norm(b + "attn_norm.weight", w, C);
    if (phi3) {
      matrix(b + "attn_qkv.weight", (H + 2 * Hkv) * D, C, w);
    } else {
      matrix(b + "attn_q.weight", H * D, C, w);
      matrix(b + "attn_k.weight", Hkv * D, C, w);
      matrix(b + "attn_v.weight", Hkv * D, C, w);
    }
    matrix(b + "attn_output.weight", C, H * D, w);
    if (gemma) norm(b + "post_attention_norm.weight", w, C);
    if (o.arch == "qwen2") {
      w.add_tensor(b + "attn_q.bias", {H * D}, GgmlType::F32, as_bytes(uniform(H * D, 0.1)));
      w.add_tensor(b + "attn_k.bias", {Hkv * D}, GgmlType::F32, as_bytes(uniform(Hkv * D, 0.1)));
      w.add_tensor(b + "attn_v.bias", {Hkv * D}, GgmlType::F32, as_bytes(uniform(Hkv * D, 0.1)));
    }
    if (o.arch == "qwen3" || o.arch == "gemma3") {
      norm(b + "attn_q_norm.weight", w, D);
      norm(b + "attn_k_norm.weight", w, D);
    }
    norm(b + "ffn_norm.weight", w, C);
    if (phi3) {
      matrix(b + "ffn_up.weight", 2 * F, C, w);
    } else {
      matrix(b + "ffn_gate.weight", F, C, w);
      matrix(b + "ffn_up.weight", F, C, w);
    }
    matrix(b + "ffn_down.weight", C, F, w);
    if (gemma) norm(b + "post_ffw_norm.weight", w, C);
  }
  norm("output_norm.weight", w, C);
  if (!o.tied) matrix("output.weight", V, C, w);
  w.write(o.out);
  out << "wrote " << o.out << ": " << o.arch << ", dim " << C << ", " << train::plural(o.layers, "layer") << ", " << H << " heads ("
      << Hkv << " kv) of " << D << ", ff " << F << ", vocab " << V << ", " << o.type << (o.tied ? ", tied output" : "") << "\n";
  return 0;
}

int run_quantize(const std::string& in, const std::string& out_path, const std::string& type_name, std::ostream& out) {
  auto f = gguf::File::open(in);
  const TypePlan plan = plan_types(*f, "--type", type_name, false);
  if (plan.base == GgmlType::F32 || plan.base == GgmlType::F16)
    throw std::invalid_argument("quantize: --type " + type_name + " is not a quantized type (one of " +
                                recipe_names() + " but f32 and f16)");
  const std::vector<GgmlType>& types = plan.types;
  gguf::Writer w;
  for (const auto& [key, value] : f->metadata())
    if (key != "general.alignment") w.set(key, value);
  w.set("general.file_type", Value::u32(plan.file_type));
  std::map<std::string, int> counts;
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const gguf::TensorInfo& t = f->tensors()[i];
    if (types[i] == t.type) {
      w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
      continue;
    }
    const int64_t n_in = t.ne[0], n_out = t.ne[1];
    std::vector<float> v(static_cast<size_t>(n_in * n_out));
    if (t.type == GgmlType::F32)
      std::memcpy(v.data(), t.data, v.size() * 4);
    else
      quant::f16_row_to_f32(v.data(), t.data, int64_t(v.size()));
    add_matrix(w, t.name, v, n_out, n_in, types[i]);
    ++counts[gguf::type_name(types[i])];
  }
  w.write(out_path);
  out << "wrote " << out_path << " (" << type_name << "):";
  const char* sep = " ";
  for (const auto& [type, n] : counts) {
    out << sep << n << " " << type;
    sep = ", ";
  }
  out << " of " << train::plural(int64_t(f->tensors().size()), "tensor") << " converted\n";
  return 0;
}

int run_logits(const LogitsOptions& o, const DeviceChoice& dev, std::ostream& out) {
  std::vector<int32_t> ids;
  if (!o.ids_file.empty()) {
    std::ifstream in(o.ids_file);
    if (!in) throw std::invalid_argument("--ids-file: cannot read " + o.ids_file);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw std::invalid_argument("--ids-file " + o.ids_file + ": not JSON (" + e.what() + ")");
    }
    if (!j.is_array()) throw std::invalid_argument("--ids-file " + o.ids_file + ": expected a JSON array of token ids");
    for (const auto& x : j) {
      if (!x.is_number_integer()) throw std::invalid_argument("--ids-file " + o.ids_file + ": " + x.dump() + " is not a token id");
      ids.push_back(x.get<int32_t>());
    }
  } else {
    ids = o.ids;
  }
  if (ids.empty()) throw std::invalid_argument("logits: give the token ids with --ids 1,2,3 or --ids-file F.json");
  auto be = dev.backend();
  const auto file = gguf::File::open(o.model);
  train::MemoryNeed need;
  need.what = "logits of " + train::plural(int64_t(ids.size()), "token");
  need.activations = train::logits_bytes(model::ModelConfig::from_gguf(*file), int64_t(ids.size()), be->is_cpu());
  need.lower = "give fewer token ids";
  auto m = train::load_model_that_fits(*file, *be, need);
  const int64_t V = m->config().n_vocab;
  for (int32_t id : ids)
    if (id < 0 || id >= V)
      throw std::invalid_argument("logits: token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  ag::Graph g(*be);
  model::ModelGraph mg(*m, g, o.llama_cpp_numerics);
  if (!o.adapter.empty()) mg.load_adapters(*gguf::File::open(o.adapter), o.adapter_scale);
  ag::Var idv = g.constant(be->from_host_i32(ids, {int64_t(ids.size())}), "ids");
  ag::Var logits = mg.logits(idv);
  g.forward();
  const std::vector<double> v = be->to_host(logits.value());
  nlohmann::json rows = nlohmann::json::array();
  for (size_t t = 0; t < ids.size(); ++t)
    rows.push_back(std::vector<double>(v.begin() + long(t * size_t(V)), v.begin() + long((t + 1) * size_t(V))));
  const std::string text = nlohmann::json{{"logits", rows}}.dump();
  if (o.out.empty())
    out << text << "\n";
  else
    write_file_atomic(o.out, text);
  return 0;
}

Command add_init_model(CLI::App& app) {
  auto o = std::make_shared<InitModelOptions>();
  auto* cmd = app.add_subcommand("init-model",
                                 "Write a small random-initialised GGUF of a supported architecture (byte-level vocabulary)");
  cmd->add_option("-o,--out", o->out, "output GGUF file")->required();
  cmd->add_option("--arch", o->arch, "llama, qwen2, qwen3, gemma2, gemma3 or phi3")->capture_default_str();
  cmd->add_option("--type", o->type, "weight types: f32 or a format (every matrix: " + format_list() + "), or a mix as llama-quantize writes it (q2_k, q3_k_m, q4_k_m, q5_k_s, q5_k_m: the output matrix Q6_K, attn_v/ffn_down/attn_output as llama-quantize picks them; rows that are not whole super-blocks fall back as it does)")->capture_default_str();
  cmd->add_option("--dim", o->dim, "embedding length")->capture_default_str();
  cmd->add_option("--layers", o->layers, "number of transformer blocks")->capture_default_str();
  cmd->add_option("--heads", o->heads, "attention heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads (grouped-query attention)")->capture_default_str();
  cmd->add_option("--ff", o->ff, "feed-forward length")->capture_default_str();
  cmd->add_option("--context-length", o->ctx, "the model's context length")->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim, "head size (attention.key_length; default dim / heads)");
  cmd->add_option("--rope-dims", o->rope_dims, "rotated dims of a head (rope.dimension_count; default all; fewer: partial rotary as phi-4-mini, for phi3 and gemma)");
  cmd->add_option("--rope-base", o->rope_base, "RoPE frequency base")->capture_default_str();
  cmd->add_flag("--rope-freqs", o->rope_freqs, "llama: add a rope_freqs.weight of llama 3.1's per-pair factors (factor 8, original context --context-length)");
  cmd->add_option("--rope-scaling", o->rope_scaling, "RoPE context scaling linear:FACTOR or yarn:FACTOR (original context --context-length)");
  cmd->add_option("--sliding-window", o->sliding_window, "gemma: the local layers' attention window (0: the architecture's default; gemma3: no local layers)")->capture_default_str();
  cmd->add_option("--swa-pattern", o->swa_pattern, "gemma: every N-th layer is global, the others local (default gemma2 2, gemma3 6)");
  cmd->add_option("--attn-softcap", o->attn_softcap, "gemma2: attention-logit soft-cap (default 50)");
  cmd->add_option("--final-softcap", o->final_softcap, "gemma: final-logit soft-cap (default gemma2 30, gemma3 none)");
  cmd->add_option("--longrope", o->longrope, "phi3: LongRoPE factors (rope_factors_short/long) for this original context (longer contexts take the long ones)");
  cmd->add_flag("--tied", o->tied, "no output.weight: token_embd is the output matrix");
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  set_examples(cmd, "  q4tune init-model -o tiny.gguf --dim 256 --layers 4 --heads 8 --kv-heads 4 --ff 704 --type q4_k_m");
  return {cmd, [o] { return run_init_model(*o, std::cout); }};
}

Command add_quantize(CLI::App& app) {
  struct Files {
    std::string in, out, type = "q4_0";
  };
  auto o = std::make_shared<Files>();
  auto* cmd = app.add_subcommand("quantize", "Convert the 2-D F32/F16 weights of a GGUF as llama-quantize would (other tensors are copied)");
  add_model_argument(cmd, o->in, "input GGUF");
  auto* out_pos = cmd->add_option("OUT", o->out, "output GGUF (or -o)");
  cmd->add_option("-o,--out", o->out, "output GGUF")->excludes(out_pos);
  cmd->add_option("--type", o->type, "a llama-quantize file type, with its choice of type per matrix (the output matrix Q6_K but in q8_0 and bf16; attn_v, ffn_down and attn_output per mix): q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k_m, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs, bf16, or another format for every matrix; rows that are not whole super-blocks fall back as llama-quantize does (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K/Q3_K to Q4_0, IQ4_XS to IQ4_NL), rows that are not whole blocks stay F32")->capture_default_str();
  set_examples(cmd, "  q4tune quantize -m model-f16.gguf -o model-q4_k_m.gguf --type q4_k_m");
  return {cmd, [o] { return run_quantize(o->in, o->out, o->type, std::cout); }};
}

Command add_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Run the model on token ids and write the logits at every position as JSON");
  const auto dev = add_device_flags(cmd, /*with_precision=*/true);
  add_model_argument(cmd, o->model, "GGUF model");
  auto* ids = cmd->add_option("--ids", o->ids, "comma-separated token ids")->delimiter(',');
  cmd->add_option("--ids-file", o->ids_file, "JSON array of token ids")->excludes(ids);
  cmd->add_option("--adapter,--lora", o->adapter, "GGUF LoRA adapter to apply");
  cmd->add_option("--adapter-scale", o->adapter_scale, "scale of the adapter")->capture_default_str();
  cmd->add_flag("--llama-cpp-numerics", o->llama_cpp_numerics,
                "round the input of each quantized matrix to 8-bit blocks as llama.cpp's CPU matmuls do (Q8_0 or Q8_K, "
                "by the format's vec_dot_type; F16 and BF16 inputs are not rounded): the logits then agree with "
                "llama.cpp's to about 1e-6 of their largest, until an activation lies within float rounding of an "
                "8-bit step, which the two may then round to neighbouring steps; gemma's GELU, which llama.cpp "
                "looks up in an f16 table, is computed exactly, so gemma models agree to about 1e-2 (the default "
                "keeps f32 activations, as training does)");
  cmd->add_option("-o,--out", o->out, "write {\"logits\": [[...], ...]} here instead of stdout");
  set_examples(cmd, "  q4tune logits -m model.gguf --ids 1,15043,3186 -o logits.json");
  return {cmd, [o, dev] { return run_logits(*o, dev->open(), std::cout); }};
}

}  // namespace q4t
