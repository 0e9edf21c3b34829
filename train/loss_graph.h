// The loss of a model on one batch [B, T] as a graph of fixed shape: the B rows run as one sequence of B*T
// tokens, segment ids keeping attention inside each example of each row, and the output projection fused into
// the vocabulary-tiled cross-entropy (no [B*T, V] logits). Used by `q4tune train` and `q4tune eval`.
// Its memory is planned by default (Graph::plan_memory): activations, gradients and scratch share one arena;
// with Memory::Recompute only each layer's output is kept from the forward to the backward.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "autograd/flat_grads.h"
#include "autograd/graph.h"
#include "data/dataset.h"
#include "train/model/model.h"

namespace q4t {

class LossGraph {
 public:
  enum class Memory { PerTensor, Planned, Recompute };
  // Binds m's weights into a new graph; add adapters through model_graph(), then call build().
  LossGraph(const model::Model& m, int64_t B, int64_t T, int64_t vocab_tile, Memory memory = Memory::Planned);
  ag::Graph& graph() { return *g_; }
  model::ModelGraph& model_graph() { return *mg_; }
  // A planned graph whose arena does not fit in the backend's memory is refused (train::OutOfMemory) before the
  // arena is allocated, naming batch_flag (the command's flag for B) and --seq-len as what lowers it.
  void build(const std::string& batch_flag = "--batch-size");

  // Uploads a batch of this graph's shape; returns its counted tokens.
  int64_t set_batch(const data::Batch& b);
  // Runs the forward; the mean loss over the batch's counted tokens (NaN when it has none).
  double forward();
  ag::Var loss() const { return loss_; }
  // The backward's seed for the loss, holding w: one tensor reused by every step.
  const ag::Tensor& seed(float w);
  int64_t B() const { return B_; }
  int64_t T() const { return T_; }

 private:
  std::unique_ptr<ag::Graph> g_;
  std::unique_ptr<model::ModelGraph> mg_;
  int64_t B_, T_, vocab_tile_;
  Memory memory_;
  ag::Var ids_, labels_, segments_, loss_;
  std::vector<int32_t> seg_scratch_;
  ag::Tensor seed_;
};

// One optimizer step's gradients from its micro-batches: the loss is the mean over all N counted tokens of all
// of them, so micro-batch i (n_i counted tokens) backpropagates its own mean with the seed n_i / N, summing into
// the parameters' gradients (which start from zero). before_forward(i), when given, runs before micro-batch i's
// forward (the trainer rewrites the dropout salt there). Micro-batches without counted tokens are skipped; with
// none at all the gradients are zero. Stops at the first non-finite micro-batch loss and returns it.
// counted_total > 0 sets N instead (a data-parallel rank: the counted tokens of every rank's micro-batches), so that
// the ranks' gradients and losses sum to those of one process with all the rows; counted and real_tokens stay this
// rank's own.
struct StepLoss {
  double loss = 0;          // the token-weighted mean (NaN/Inf when a micro-batch's loss was)
  int64_t counted = 0;      // N
  int64_t real_tokens = 0;  // non-padding input tokens
};
// flat (data parallel): armed for the backward of the last micro-batch, which sums the gradients over the ranks
// while it runs where the device allows (ag::FlatGrads); the caller's flat->exchange() completes the sum.
StepLoss accumulate_gradients(LossGraph& lg, const std::vector<data::Batch>& micro,
                              const std::function<void(size_t)>& before_forward = {}, int64_t counted_total = 0,
                              ag::FlatGrads* flat = nullptr);

// Rows [first, first + n) of b.
data::Batch batch_rows(const data::Batch& b, int64_t first, int64_t n);

struct EvalResult {
  double loss = 0;        // mean over counted tokens
  double sum = 0;         // of the counted tokens' losses
  int64_t tokens = 0;     // counted tokens
  int64_t batches = 0;
};
// Mean loss over ds in file order, max_batches batches of shards·B rows at most (0: all), each weighted by its
// counted tokens. With shards > 1 this process takes the batches of B rows numbered shard, shard + shards, ...:
// its part of what one process with shards·B rows per batch evaluates (sum and tokens add up over the shards).
EvalResult evaluate(LossGraph& lg, const data::Dataset& ds, int64_t max_batches, int shard = 0, int shards = 1);

}  // namespace q4t
