#include "train/model/decoder.h"

#include <bit>
#include <set>
#include <stdexcept>

namespace q4t::model {

AdapterSet adapter_weights(const ModelGraph& mg) {
  AdapterSet out;
  for (const auto& [name, l] : mg.adapters()) out[name] = {l.a.value(), l.b.value(), l.scale};
  return out;
}

AdapterSet load_adapter_weights(const Model& m, const gguf::File& adapter, double user_scale) {
  // load_adapters reads and checks the file; its constants' tensors outlive the scratch graph.
  ag::Graph g(m.backend());
  ModelGraph mg(m, g);
  mg.load_adapters(adapter, user_scale);
  return adapter_weights(mg);
}

namespace {

// Every adapter must sit on a projection that ModelGraph adapts, fit its weight, and live on the model's backend.
void check_adapters(const Model& m, const AdapterSet& adapters) {
  const ModelConfig& c = m.config();
  std::set<std::string> targets;
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (const std::string& t : lora_targets(c)) targets.insert(target_tensor_name(l, t));
  ag::Backend& be = m.backend();
  for (const auto& [name, w] : adapters) {
    // An init-capture: clang 14 captures no structured binding.
    auto fail = [&name = name](const std::string& why) {
      throw std::invalid_argument("adapter for '" + name + "': " + why);
    };
    if (!targets.count(name))
      fail("not one of the projections a LoRA adapts (blk.N.attn_{q,k,v,output} and blk.N.ffn_{gate,up,down}, or "
           "blk.N.attn_qkv and blk.N.ffn_up where fused)");
    const ag::Shape& ws = m.weight(name).shape();
    if (!w.a.defined() || !w.b.defined()) fail("A or B is missing");
    const ag::Shape &as = w.a.shape(), &bs = w.b.shape();
    if (as.size() != 2 || bs.size() != 2 || as[1] != ws[1] || bs[0] != ws[0] || bs[1] != as[0])
      fail("A " + ag::shape_str(as) + " and B " + ag::shape_str(bs) + " do not fit the weight " + ag::shape_str(ws) +
           " (want A [r, n_in], B [n_out, r])");
    for (const ag::Tensor* t : {&w.a, &w.b})
      if (t->dtype() != be.real() || t->on_host() != be.is_cpu())
        fail("its tensors must be " + std::string(ag::dtype_name(be.real())) + " on the model's backend (" +
             be.name() + ")");
  }
}

}  // namespace

// One recorded forward for a fixed number of new tokens. Its graph binds the model's weights, the adapters,
// the caches and start_ as constants (shared storage), so every Step reads and writes the same cache.
struct Decoder::Step {
  explicit Step(ag::Backend& be) : g(be) {}
  ag::Graph g;
  std::unique_ptr<ModelGraph> mg;
  ag::Tensor ids;  // [n] i32, uploaded before each forward
  ag::Var logits;  // [1, V]: the last token's
};

Decoder::Decoder(const Model& m, AdapterSet adapters, int64_t max_context, int64_t prefill_chunk)
    : m_(m), be_(m.backend()), adapters_(std::move(adapters)), prefill_chunk_(prefill_chunk) {
  const ModelConfig& c = m.config();
  max_ctx_ = max_context <= 0 ? c.n_ctx : std::min(max_context, c.n_ctx);
  if (max_ctx_ <= 0) throw std::invalid_argument("decoder: the model's context length is " + std::to_string(c.n_ctx));
  if (prefill_chunk_ < 1) throw std::invalid_argument("decoder: prefill_chunk must be at least 1");
  check_adapters(m, adapters_);
  start_ = be_.zeros({1}, ag::DType::I32);
  reserve(std::min<int64_t>(max_ctx_, 256));
}

// Caches of n rows holding the pos_ tokens cached so far. The recorded steps read the old tensors, so they are
// recorded again.
void Decoder::reserve(int64_t n) {
  n = std::min(n, max_ctx_);
  if (n <= capacity_) return;
  const ModelConfig& c = m_.config();
  const int64_t width = c.n_head_kv * c.head_dim;
  auto grown = [&](const ag::Tensor* old) {
    ag::Tensor t = be_.zeros({n, width}, be_.real());
    if (old && pos_ > 0) {
      const std::vector<double> rows = be_.to_host(*old);
      std::vector<float> kept(size_t(n * width), 0.0f);
      std::copy(rows.begin(), rows.begin() + pos_ * width, kept.begin());
      be_.upload(t, kept);
    }
    return t;
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const bool had = size_t(l) < k_cache_.size();
    ag::Tensor k = grown(had ? &k_cache_[size_t(l)] : nullptr), v = grown(had ? &v_cache_[size_t(l)] : nullptr);
    if (had) {
      k_cache_[size_t(l)] = std::move(k);
      v_cache_[size_t(l)] = std::move(v);
    } else {
      k_cache_.push_back(std::move(k));
      v_cache_.push_back(std::move(v));
    }
  }
  capacity_ = n;
  steps_.clear();
}

Decoder::~Decoder() = default;

Decoder::Step& Decoder::step(int64_t n) {
  std::unique_ptr<Step>& slot = steps_[n];
  if (slot) return *slot;
  const ModelConfig& c = m_.config();
  auto s = std::make_unique<Step>(be_);
  ag::Graph& g = s->g;
  s->mg = std::make_unique<ModelGraph>(m_, g);
  for (const auto& [name, w] : adapters_)  // dropout 0: inference never drops
    s->mg->set_adapter(name, ag::LoraLinear(s->mg->weight(name), g.constant(w.a, name + ".lora_a"),
                                            g.constant(w.b, name + ".lora_b"), w.scale));
  s->ids = be_.zeros({n}, ag::DType::I32);
  const ag::Var start = g.constant(start_, "start");
  ag::Var h = s->mg->hidden(g.constant(s->ids, "ids"), [&](int64_t l, ag::Var q, ag::Var k, ag::Var v) {
    const ag::RopeFreqs freqs = c.rope_freqs(l, max_ctx_);
    q = ag::rope_at(q, start, c.n_head, c.head_dim, c.rope_mode, freqs);
    k = ag::rope_at(k, start, c.n_head_kv, c.head_dim, c.rope_mode, freqs);
    const std::string b = "blk." + std::to_string(l) + ".";
    ag::Var keys = ag::kv_cache_write(g.constant(k_cache_[size_t(l)], b + "k_cache"), k, start);
    ag::Var values = ag::kv_cache_write(g.constant(v_cache_[size_t(l)], b + "v_cache"), v, start);
    return ag::cached_attention(q, keys, values, start, c.n_head, c.n_head_kv, c.attention_options(l));
  });
  // Only the last token's logits are needed: its row of h [n, C], picked by a lookup into h as a table.
  if (n > 1) h = ag::embedding(h, g.constant(be_.from_host_i32(std::vector<int32_t>{int32_t(n - 1)}, {1}), "last"));
  s->logits = s->mg->output_logits(h);
  slot = std::move(s);
  return *slot;
}

// Whole chunks, then the largest power of two that fits: a prompt of any length uses at most
// log2(prefill_chunk) + 2 distinct step graphs, each recorded once.
int64_t Decoder::chunk_for(int64_t remaining) const {
  if (remaining >= prefill_chunk_) return prefill_chunk_;
  return int64_t(std::bit_floor(uint64_t(remaining)));
}

std::vector<float> Decoder::feed(std::span<const int32_t> ids) {
  const int64_t n = int64_t(ids.size()), V = m_.config().n_vocab;
  if (n == 0) throw std::invalid_argument("decoder: no tokens to feed");
  if (pos_ + n > max_ctx_)
    throw std::length_error("the context is full: " + std::to_string(pos_) + " cached tokens + " + std::to_string(n) +
                            " new ones exceed its " + std::to_string(max_ctx_) + " positions");
  for (int32_t id : ids)
    if (id < 0 || id >= V)
      throw std::invalid_argument("decoder: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(V) + ")");
  if (pos_ + n > capacity_) reserve(std::max(pos_ + n, 2 * capacity_));
  Step* last = nullptr;
  for (int64_t done = 0; done < n;) {
    const int64_t k = chunk_for(n - done);
    Step& s = step(k);
    be_.upload_i32(s.ids, ids.subspan(size_t(done), size_t(k)));
    be_.upload_i32(start_, std::vector<int32_t>{int32_t(pos_)});
    s.g.forward();
    pos_ += k;
    done += k;
    last = &s;
  }
  const std::vector<double> logits = be_.to_host(last->logits.value());
  return {logits.begin(), logits.end()};
}

}  // namespace q4t::model
