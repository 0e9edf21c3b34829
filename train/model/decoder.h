// Text generation's forward: the model with a KV cache. A Decoder keeps, per layer, the keys and values of every
// token it has been fed (caches [S, Hkv*D], S rows allocated as the tokens need them, up to its maximum
// context) and runs each new token (or chunk of prompt tokens) through one recorded graph that reads them,
// instead of recomputing the whole sequence.
// The math is ModelGraph::hidden's (the same blocks, biases, RoPE mode and tied output) with the attention step
// swapped for rope_at + kv_cache_write + cached_attention, so its logits match ModelGraph::logits.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "data/gguf.h"
#include "train/model/model.h"

namespace q4t::model {

// One LoRA adapter as plain tensors on the model's backend: the decoder applies scale · B·(A·x), never dropout.
struct AdapterWeights {
  ag::Tensor a;  // [r, n_in]
  ag::Tensor b;  // [n_out, r]
  double scale = 1;
};
// Keyed by the adapted base tensor ("blk.3.attn_q.weight").
using AdapterSet = std::map<std::string, AdapterWeights>;

// The adapters of a ModelGraph (trained parameters or loaded constants) as the tensors themselves, not copies:
// a decoder built from them sees every later update of the trainer's parameters.
AdapterSet adapter_weights(const ModelGraph& mg);
// A GGUF LoRA file's adapters for m, with ModelGraph::load_adapters's checks and scale = user_scale * alpha / r.
AdapterSet load_adapter_weights(const Model& m, const gguf::File& adapter, double user_scale);

class Decoder {
 public:
  // max_context: the most tokens the cache may hold (and the context RoPE is set up for); 0 or more than the
  // model's context length means the model's. The cache starts small and grows with what is fed.
  // prefill_chunk: the most tokens one forward takes while feeding a prompt (memory of the activations).
  Decoder(const Model& m, AdapterSet adapters = {}, int64_t max_context = 0, int64_t prefill_chunk = 64);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const Model& model() const { return m_; }
  int64_t max_context() const { return max_ctx_; }
  // Tokens in the cache: the position the next fed token gets.
  int64_t position() const { return pos_; }
  // Forgets every cached token (the rows are overwritten by what is fed next).
  void reset() { pos_ = 0; }
  // Rows the cache holds now; reserve makes room for n tokens in all (at most max_context()), keeping what
  // is cached.
  int64_t capacity() const { return capacity_; }
  void reserve(int64_t n);

  // Feeds ids at positions position() .. position() + n - 1 and returns the logits [V] of the last of them.
  // Throws std::length_error when they do not fit in the context, std::invalid_argument for ids outside the
  // vocabulary or an empty span.
  std::vector<float> feed(std::span<const int32_t> ids);

 private:
  struct Step;
  Step& step(int64_t n_tokens);
  int64_t chunk_for(int64_t remaining) const;

  const Model& m_;
  ag::Backend& be_;
  AdapterSet adapters_;
  int64_t max_ctx_, prefill_chunk_, pos_ = 0, capacity_ = 0;
  ag::Tensor start_;                       // [1] i32: the position of a step's first token
  std::vector<ag::Tensor> k_cache_, v_cache_;  // per layer [S, Hkv*D]
  std::map<int64_t, std::unique_ptr<Step>> steps_;  // by tokens per forward
};

}  // namespace q4t::model
