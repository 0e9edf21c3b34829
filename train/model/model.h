// A llama-family transformer (llama, qwen2, qwen3) built from autograd ops over frozen GGUF weights.
// Weights go to the backend as they are stored: quantized matrices stay quantized (no dequantised copy of any
// 2-D weight exists), norms and biases are f32. A Model holds the weights; a ModelGraph binds them into one
// graph as constants, with optional LoRA adapters on the seven projection targets.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "autograd/lora.h"
#include "autograd/ops.h"
#include "data/gguf.h"
#include "train/model/config.h"

namespace q4t::model {

// LoRA targets by short name: q, k, v, o (attention), gate, up, down (feed-forward); phi3's fused projections are
// qkv and gate_up.
const std::vector<std::string>& all_lora_targets();
// The targets of a model of config c, in layer order: the seven, or qkv, o, gate_up, down where fused.
std::vector<std::string> lora_targets(const ModelConfig& c);
// The requested targets as c's projections: q, k or v name qkv, and gate or up gate_up, where they are fused;
// a target the model lacks (qkv in an unfused model) throws std::invalid_argument listing c's targets.
std::vector<std::string> resolve_targets(const ModelConfig& c, const std::vector<std::string>& requested);
// "blk.N.attn_q.weight" etc. for a short target name.
std::string target_tensor_name(int64_t layer, const std::string& target);

// One adapter of a GGUF LoRA file (llama.cpp's format): its tensors <base>.lora_a ne [n_in, r] and <base>.lora_b
// ne [r, n_out], where base is the weight they adapt ("blk.0.attn_q.weight").
struct AdapterPair {
  std::string base;
  const gguf::TensorInfo* a;
  const gguf::TensorInfo* b;  // null where the file has no <base>.lora_b
};
// Every lora_a of the file in file order, each with its lora_b; the caller checks what the tensors hold. Throws
// gguf::FormatError for a lora_b without its lora_a and for a tensor that is neither.
std::vector<AdapterPair> adapter_pairs(const gguf::File& adapter);

struct LoraSpec {
  std::vector<std::string> targets = all_lora_targets();
  ag::LoraConfig cfg;
  int64_t layer_begin = 0, layer_end = -1;  // [begin, end) of the layers to adapt; end -1: all
};

class Model {
 public:
  // Opens, validates (keys, every tensor's presence, shape and type) and uploads the weights to `be`.
  static std::unique_ptr<Model> load(const std::string& path, ag::Backend& be);
  // The same from a file opened already (it need not outlive the model).
  static std::unique_ptr<Model> load(const gguf::File& f, ag::Backend& be);
  // The weight types of a random model: one for every matrix, or llama-quantize's Q4_K_M mix (weight_mix.h).
  enum class RandomWeights { Q4_0, Q4_K_M, Q8_0, F16 };
  // "q4_0", "q4_k_m", "q8_0" or "f16"; anything else throws std::invalid_argument naming `flag`.
  static RandomWeights parse_random_weights(const std::string& flag, const std::string& s);
  // A model of config c made in memory, for benchmarks: every matrix of the mix's type with random codes and
  // scales (values of spread about 1/sqrt(n_in), so activations keep their size through the layers), norms 1, no
  // biases. The same seed gives the same bytes for any thread count.
  static std::unique_ptr<Model> random(const ModelConfig& c, ag::Backend& be, uint64_t seed,
                                       RandomWeights w = RandomWeights::Q4_0);

  const ModelConfig& config() const { return cfg_; }
  ag::Backend& backend() const { return be_; }
  const ag::Tensor& weight(const std::string& name) const;
  bool has_weight(const std::string& name) const { return weights_.count(name) != 0; }
  // Bytes of all weights as stored on the backend.
  int64_t weight_bytes() const;

 private:
  Model(ag::Backend& be) : be_(be) {}
  void load_tensor(const gguf::File& f, const std::string& name, const std::vector<int64_t>& ne, bool matrix);
  friend class ModelGraph;
  // Calls fn(name, ne, matrix) for every tensor config c's model has, in file order.
  static void for_each_tensor(const ModelConfig& c,
                              const std::function<void(const std::string&, const std::vector<int64_t>&, bool)>& fn);

  ag::Backend& be_;
  ModelConfig cfg_;
  std::map<std::string, ag::Tensor> weights_;
};

// The model's weights bound into one graph, plus its adapters (keyed by the base tensor name).
class ModelGraph {
 public:
  // llama_cpp_numerics: round the input of every Q4_0 matrix the way llama.cpp's CPU matmuls do (Q8_0
  // activation blocks), to reproduce its logits exactly; training and the default forward keep f32 activations.
  ModelGraph(const Model& m, ag::Graph& g, bool llama_cpp_numerics = false);
  const Model& model() const { return m_; }
  ag::Graph& graph() const { return g_; }
  ag::Var weight(const std::string& name) const { return vars_.at(name); }

  // New trainable adapters (A random, B zero) on the spec's targets and layers. With LoRA dropout, the masks
  // depend on dropout_salt() (i32 [2]), which the caller rewrites before each micro-batch.
  void add_adapters(const LoraSpec& spec, std::mt19937& rng);
  ag::Var dropout_salt() const { return dropout_salt_; }
  // Adapters from a GGUF LoRA file (general.type "adapter", adapter.type "lora"), as constants, with
  // scale = user_scale * alpha / r. Throws gguf::FormatError naming the file and the tensor.
  void load_adapters(const gguf::File& adapter, double user_scale);
  const std::map<std::string, ag::LoraLinear>& adapters() const { return adapters_; }
  void set_adapter(const std::string& tensor_name, ag::LoraLinear l) { adapters_.insert_or_assign(tensor_name, l); }

  // Logits [T, V] for token ids [T] (i32) at positions pos_offset .. pos_offset + T - 1.
  ag::Var logits(ag::Var ids, int64_t pos_offset = 0) const;
  // The same for a row of packed examples: segment_ids [T] (i32, one id per example) keeps attention inside
  // each example, so every example gets the logits it would get alone.
  ag::Var logits(ag::Var ids, ag::Var segment_ids) const;
  // The final hidden state [T, C] (after the output norm), for losses that fuse the output projection;
  // segment_ids as above, or an undefined Var for one sequence.
  ag::Var hidden(ag::Var ids, int64_t pos_offset = 0, ag::Var segment_ids = {}) const;
  // The same with a caller's attention step: attend(layer, q, k, v) gets a block's q [T, H*D] and k, v
  // [T, Hkv*D] (biases added and q, k normed where the architecture does, before RoPE) and returns the attention output [T, H*D]. hidden() above is this with
  // RoPE at fixed positions and causal attention over the T tokens; the decoder's step reads a KV cache.
  // Each layer's output is a checkpoint of the graph (the segments of recomputation, see Graph::plan_memory).
  using AttentionStep = std::function<ag::Var(int64_t layer, ag::Var q, ag::Var k, ag::Var v)>;
  ag::Var hidden(ag::Var ids, const AttentionStep& attend) const;
  // The output matrix [V, C] (output.weight, or token_embd.weight when tied).
  ag::Var output_weight() const;
  // Logits [T, V] of a final hidden state [T, C]: the output matrix, then the final soft-capping where the
  // architecture has one (gemma2).
  ag::Var output_logits(ag::Var h) const;
  // With recomputation (Graph::plan_memory), the last n layers keep their ffn gate and up outputs from the forward
  // instead of computing them again in the backward: each such layer saves two of the three products that
  // recomputation repeats and holds 2·T·n_ff more floats. Set before hidden()/logits(); 0 to n_layer.
  void keep_ffn_layers(int64_t n);
  // The context RoPE is chosen for (LongRoPE's long or short factors): 0, the default, means the positions of
  // the sequence at hand; a trainer sets its rows' length, a decoder its cache length.
  void set_rope_context(int64_t n) { rope_context_ = n; }
  int64_t rope_context() const { return rope_context_; }
  // Called while hidden() builds the graph with each layer product's weight name and its input x [T, n_in] (the
  // weights q4tune merge quantizes against calibration inputs). Each x is kept (Graph::keep), so its value stays
  // readable after a forward. Set before hidden()/logits().
  using InputObserver = std::function<void(const std::string& weight, ag::Var x)>;
  void observe_inputs(InputObserver f) { observe_ = std::move(f); }

 private:
  ag::Var project(ag::Var x, int64_t layer, const std::string& target) const;
  // linear(x, w), with llama.cpp's activation rounding when asked and w is quantized.
  ag::Var frozen_linear(ag::Var x, ag::Var w) const;
  ag::Var frozen_input(ag::Var x, ag::Var w) const;  // x, or x rounded as llama.cpp rounds w's input

  const Model& m_;
  ag::Graph& g_;
  std::map<std::string, ag::Var> vars_;
  std::map<std::string, ag::LoraLinear> adapters_;
  ag::Var dropout_salt_;
  bool llama_cpp_numerics_;
  int64_t keep_ffn_layers_ = 0;
  int64_t rope_context_ = 0;
  InputObserver observe_;
};

}  // namespace q4t::model
