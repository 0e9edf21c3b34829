#include "train/loss_graph.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "train/memory_estimate.h"

namespace q4t {

LossGraph::LossGraph(const model::Model& m, int64_t B, int64_t T, int64_t vocab_tile, Memory memory)
    : g_(std::make_unique<ag::Graph>(m.backend())), B_(B), T_(T), vocab_tile_(vocab_tile), memory_(memory) {
  if (memory != Memory::PerTensor) g_->defer_memory();
  if (B < 1 || T < 1) throw std::invalid_argument("LossGraph: batch " + std::to_string(B) + "x" + std::to_string(T));
  if (B * T > std::numeric_limits<int32_t>::max() / 2)
    throw std::invalid_argument("batch-size * seq-len = " + std::to_string(B * T) + " tokens is too many");
  mg_ = std::make_unique<model::ModelGraph>(m, *g_);
  mg_->set_rope_context(T);  // the rows are packed into one sequence, each example within one row of T
}

void LossGraph::build(const std::string& batch_flag) {
  if (loss_.g) throw std::logic_error("LossGraph::build twice");
  ag::Backend& be = g_->backend();
  const int64_t n = B_ * T_;
  // The batch's inputs get their memory after the plan's check: at a huge B·T they are a large allocation too.
  std::vector<std::pair<ag::Tensor, size_t>> inputs;
  size_t input_bytes = 0;
  for (int k = 0; k < 3; ++k) {
    ag::Tensor t = be.unplaced({n}, ag::DType::I32);
    const size_t align = be.placement_alignment(t);
    const size_t at = (input_bytes + align - 1) / align * align;
    input_bytes = at + size_t(n) * sizeof(int32_t);
    inputs.emplace_back(std::move(t), at);
  }
  const std::string what = batch_flag + " " + std::to_string(B_) + " x --seq-len " + std::to_string(T_);
  // A tensor larger than the device can make at all (lavapipe at a huge B·T) is refused with the flags too.
  try {
    ids_ = g_->constant(inputs[0].first, "batch.ids");
    labels_ = g_->constant(inputs[1].first, "batch.labels");
    segments_ = g_->constant(inputs[2].first, "batch.segments");
    ag::Var h = mg_->hidden(ids_, 0, segments_);
    ag::Var w = mg_->output_weight();
    const int64_t tile = std::clamp<int64_t>(vocab_tile_, 1, w.shape()[0]);
    // The vocabulary-tiled loss has no soft-capping: a soft-capped output (gemma2) takes the whole logits.
    loss_ = mg_->model().config().final_softcap > 0 ? ag::cross_entropy(mg_->output_logits(h), labels_)
                                                     : ag::linear_cross_entropy(h, w, labels_, tile);
    if (memory_ != Memory::PerTensor) g_->plan_memory(loss_, memory_ == Memory::Recompute, [&](size_t arena) {
      train::MemoryNeed need;
      need.what = what;
      constexpr size_t kMax = size_t(std::numeric_limits<int64_t>::max());
      need.activations = int64_t(std::min(arena, kMax - input_bytes) + input_bytes);  // saturating
      need.weights = mg_->model().weight_bytes();
      need.weights_loaded = true;
      // --grad-checkpoint keeps only each layer's output from the forward to the backward.
      const bool backward = g_->node(loss_.id).requires_grad;
      need.lower = "lower --seq-len or " + batch_flag;
      if (backward && memory_ == Memory::Planned) need.lower += ", or use --grad-checkpoint";
      train::require_memory(need, train::memory_room(be));
    });
    be.place(inputs, input_bytes);
    const std::vector<int32_t> zeros(size_t(n), 0);
    for (auto& [t, offset] : inputs) be.upload_i32(t, zeros);
  } catch (const vk::OutOfMemoryError& e) {
    throw std::invalid_argument(what + ": " + e.what() + "; lower --seq-len or " + batch_flag);
  }
}

int64_t LossGraph::set_batch(const data::Batch& b) {
  if (!loss_.g) throw std::logic_error("LossGraph::set_batch before build");
  if (b.B != B_ || b.T != T_)
    throw std::invalid_argument("batch " + std::to_string(b.B) + "x" + std::to_string(b.T) + " does not fit the graph's " +
                                std::to_string(B_) + "x" + std::to_string(T_));
  ag::Backend& be = g_->backend();
  // Rows become one sequence: each row's segments get ids of their own (row r: r * (T + 1) + s), padding
  // keeps 0. RoPE depends only on distances inside a segment, so running positions are as good as the
  // restarting ones.
  seg_scratch_.resize(b.segment_ids.size());
  for (int64_t r = 0; r < B_; ++r)
    for (int64_t t = 0; t < T_; ++t) {
      const int32_t s = b.segment_ids[size_t(r * T_ + t)];
      seg_scratch_[size_t(r * T_ + t)] = s == 0 ? 0 : int32_t(r * (T_ + 1)) + s;
    }
  be.upload_i32(g_->node(ids_.id).value, b.ids);
  be.upload_i32(g_->node(labels_.id).value, b.labels);
  be.upload_i32(g_->node(segments_.id).value, seg_scratch_);
  return b.n_label_tokens();
}

const ag::Tensor& LossGraph::seed(float w) {
  ag::Backend& be = g_->backend();
  const std::vector<float> v{w};
  if (!seed_.defined()) seed_ = be.from_host(v, loss_.shape());
  else be.upload(seed_, v);
  return seed_;
}

double LossGraph::forward() {
  g_->forward();
  return g_->backend().to_host(loss_.value()).at(0);
}

StepLoss accumulate_gradients(LossGraph& lg, const std::vector<data::Batch>& micro,
                              const std::function<void(size_t)>& before_forward, int64_t counted_total,
                              ag::FlatGrads* flat) {
  ag::Graph& g = lg.graph();
  StepLoss r;
  for (const data::Batch& b : micro) {
    r.counted += b.n_label_tokens();
    for (uint8_t m : b.attn_mask) r.real_tokens += m;
  }
  const int64_t total = counted_total > 0 ? counted_total : r.counted;
  bool first = true;
  for (size_t i = 0; i < micro.size(); ++i) {
    const int64_t n = lg.set_batch(micro[i]);
    if (n == 0) continue;
    if (before_forward) before_forward(i);
    const double li = lg.forward();
    if (!std::isfinite(li)) {
      r.loss = li;
      return r;
    }
    const double w = double(n) / double(total);
    r.loss += li * w;
    if (flat && i + 1 == micro.size()) flat->arm();
    g.backward(lg.loss(), lg.seed(float(w)), first ? ag::Graph::Accumulate::None : ag::Graph::Accumulate::Params);
    first = false;
  }
  if (first) g.zero_param_grads();
  return r;
}

data::Batch batch_rows(const data::Batch& b, int64_t first, int64_t n) {
  if (first < 0 || n < 0 || first + n > b.B)
    throw std::invalid_argument("batch_rows: rows " + std::to_string(first) + "+" + std::to_string(n) + " of " +
                                std::to_string(b.B));
  data::Batch out;
  out.B = n;
  out.T = b.T;
  const auto rows = [&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    return V(v.begin() + first * b.T, v.begin() + (first + n) * b.T);
  };
  out.ids = rows(b.ids);
  out.labels = rows(b.labels);
  out.attn_mask = rows(b.attn_mask);
  out.segment_ids = rows(b.segment_ids);
  out.positions = rows(b.positions);
  return out;
}

EvalResult evaluate(LossGraph& lg, const data::Dataset& ds, int64_t max_batches, int shard, int shards) {
  EvalResult r;
  const size_t B = size_t(lg.B());
  int64_t index = 0;  // of the batch of B rows, over all shards
  for (size_t first = 0; first < ds.size(); first += B, ++index) {
    if (max_batches > 0 && index >= max_batches * shards) break;
    if (index % shards != shard) continue;
    const data::Batch b = ds.batch_at(first, lg.B());
    const int64_t n = lg.set_batch(b);
    ++r.batches;
    if (n == 0) continue;
    r.sum += lg.forward() * double(n);
    r.tokens += n;
  }
  r.loss = r.tokens > 0 ? r.sum / double(r.tokens) : std::nan("");
  return r;
}

}  // namespace q4t
