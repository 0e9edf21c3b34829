#include "train/model/config.h"

namespace q4t::model {

namespace {
[[noreturn]] void bad(const gguf::File& f, const std::string& key, const std::string& why) {
  throw gguf::FormatError(f.path() + ": key '" + key + "': " + why);
}

int64_t positive(const gguf::File& f, const std::string& key) {
  const uint64_t v = f.get_uint(key);
  if (v == 0 || v > (uint64_t(1) << 31)) bad(f, key, "value " + std::to_string(v) + " is out of range");
  return int64_t(v);
}
}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  if (c.arch != "llama" && c.arch != "qwen2")
    bad(f, "general.architecture", "'" + c.arch + "' is not supported (supported: llama, qwen2)");
  const std::string a = c.arch + ".";
  c.n_embd = positive(f, a + "embedding_length");
  c.n_layer = positive(f, a + "block_count");
  c.n_ff = positive(f, a + "feed_forward_length");
  c.n_head = positive(f, a + "attention.head_count");
  c.n_head_kv = int64_t(f.get_uint_or(a + "attention.head_count_kv", uint64_t(c.n_head)));
  c.n_ctx = int64_t(f.get_uint_or(a + "context_length", 2048));
  c.rope_base = f.get_float_or(a + "rope.freq_base", 10000.0);
  c.rms_eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
  if (c.n_embd % c.n_head != 0) bad(f, a + "attention.head_count", "does not divide the embedding length");
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0)
    bad(f, a + "attention.head_count_kv", "must divide attention.head_count (" + std::to_string(c.n_head) + ")");
  c.head_dim = c.n_embd / c.n_head;
  const int64_t n_rot = int64_t(f.get_uint_or(a + "rope.dimension_count", uint64_t(c.head_dim)));
  if (n_rot != c.head_dim)
    bad(f, a + "rope.dimension_count", std::to_string(n_rot) + " differs from the head size " +
                                           std::to_string(c.head_dim) + " (partial rotary is not supported)");
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) bad(f, a + "attention.layer_norm_rms_epsilon", "must be in (0, 1)");
  if (!(c.rope_base > 0)) bad(f, a + "rope.freq_base", "must be positive");
  c.rope_mode = c.arch == "qwen2" ? ag::RopeMode::Neox : ag::RopeMode::Norm;
  c.qkv_bias = c.arch == "qwen2";
  c.tied = f.tensor("output.weight") == nullptr;
  const gguf::TensorInfo* emb = f.tensor("token_embd.weight");
  if (!emb) throw gguf::FormatError(f.path() + ": tensor 'token_embd.weight' is missing");
  if (emb->ne.size() != 2 || emb->ne[0] != c.n_embd)
    throw gguf::FormatError(f.path() + ": tensor 'token_embd.weight' has ne[0] = " + std::to_string(emb->ne[0]) +
                            ", expected the embedding length " + std::to_string(c.n_embd));
  c.n_vocab = emb->ne.size() == 2 ? emb->ne[1] : 0;
  return c;
}

}  // namespace q4t::model
