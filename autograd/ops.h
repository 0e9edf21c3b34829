// The op builders: each records one node (see graph.h) and returns its output. Shapes are row-major
// [rows, cols]; T = tokens, C = channels, V = vocabulary, H = heads, D = head dim. Each op lives in one file
// of autograd/ops/ with its shape rule, CPU forward/backward (templated on float and double) and the Vulkan
// forward/backward (GLSL in kernels/glsl/), and is listed in op_table().
#pragma once
#include <cstdint>
#include <vector>

#include "autograd/graph.h"

namespace q4t::ag {

// [T, C] rows of table [V, C] (f32, or quantized and dequantised on the fly) picked by ids [T] (i32).
Var embedding(Var table, Var ids);
// Frozen linear y[T, n_out] = x[T, n_in] · Wᵀ with W [n_out, n_in] quantized (or an f32 constant). W never gets
// a gradient; backward gives dx only, through the same quantized blocks.
Var linear(Var x, Var w);
// y[M, N] = a[M, K] · b[N, K]ᵀ, both differentiable.
Var matmul_nt(Var a, Var b);
// A frozen linear with a LoRA adapter, one node: y = x·Wᵀ + scale·(xa·Aᵀ)·Bᵀ with A [r, n_in] and B [n_out, r]
// (differentiable) and xa the adapter's input (x when undefined; otherwise of x's shape, e.g. x after dropout).
Var lora_linear(Var x, Var w, Var a, Var b, double scale, Var xa = {});
// Elementwise a + b and a * b; b has a's shape or is one row [C] broadcast over a's rows.
Var add(Var a, Var b);
Var mul(Var a, Var b);
Var scale(Var a, double s);
// The same values (row-major order) with another shape of as many elements (1 to 5 dims).
Var reshape(Var a, const Shape& shape);
// Columns begin .. begin + n - 1 of x [T, C] as [T, n] (phi3's fused q/k/v and gate/up products, split).
Var slice_cols(Var x, int64_t begin, int64_t n);
// y = x / sqrt(mean(x², row) + eps) * w, per row; w [C].
Var rms_norm(Var x, Var w, double eps);

enum class RopeMode : int64_t {
  Norm = 0,  // rotate adjacent pairs (x[2i], x[2i+1]): llama.cpp's "norm" mode (llama)
  Neox = 1,  // rotate halves (x[i], x[i + D/2]): "neox" mode (qwen2, qwen3, gemma, phi3)
};
// The rotation of each pair of a head: pair i of a token at position pos turns by theta_i = pos * freq[i], and
// both cos and sin are multiplied by mscale. Plain RoPE is freq[i] = base^(-2i/R) over R rotated dims, mscale 1;
// llama 3's per-pair factors, linear and YaRN scaling, and LongRoPE are other tables (train/model/config.cpp
// builds them). R = 2·freq.size() may be less than the head dim D (partial rotary): the other dims pass through.
struct RopeFreqs {
  std::vector<double> freq;  // [R/2]
  double mscale = 1;
  static RopeFreqs plain(int64_t rotated_dims, double base);
};
// Rotary position embedding of x [T, H*D]: token t sits at position pos_offset + t.
Var rope(Var x, int64_t n_head, int64_t head_dim, RopeMode mode, const RopeFreqs& freqs, int64_t pos_offset = 0);
// The same with plain frequencies of the given base.
Var rope(Var x, int64_t n_head, int64_t head_dim, RopeMode mode, double freq_base, int64_t pos_offset = 0);
// Options of attention (gemma's): a sliding window, where query i sees key j only if i − j < window (0: no
// window), and soft-capping, where each score s becomes softcap·tanh(s / softcap) before the softmax (0: none).
struct AttentionOptions {
  int64_t window = 0;
  double softcap = 0;
};
// Causal self-attention with grouped-query heads: q [T, H*D], k and v [T, Hkv*D] (H a multiple of Hkv; query
// head h reads kv head h / (H/Hkv)); softmax(q·kᵀ / sqrt(D)) in f32 with the row max subtracted. Out [T, H*D].
Var attention(Var q, Var k, Var v, int64_t n_head, int64_t n_head_kv);
// The same over packed examples: segment_ids [T] i32 (one id per example, 0 for padding); query i attends key j
// only if j ≤ i and segment_ids[j] == segment_ids[i].
Var attention(Var q, Var k, Var v, int64_t n_head, int64_t n_head_kv, Var segment_ids);
// Either, with options (segment_ids undefined for one sequence).
Var attention(Var q, Var k, Var v, int64_t n_head, int64_t n_head_kv, const AttentionOptions& o, Var segment_ids = {});
Var silu(Var x);
// silu(gate) * up, elementwise.
Var swiglu(Var gate, Var up);
// gelu(gate) * up with gelu's tanh approximation x (1 + tanh(sqrt(2/π) (x + 0.044715 x³))) / 2 (gemma's FFN).
Var geglu(Var gate, Var up);
// cap · tanh(x / cap), elementwise (gemma 2's final-logit soft-capping).
Var softcap(Var x, double cap);
// Mean over counted tokens of -log softmax(logits[t])[labels[t]]; labels [T] i32, -100 = not counted. Scalar.
Var cross_entropy(Var logits, Var labels);
// cross_entropy(linear(x, w), labels) without the [T, V] logits: the vocabulary is processed in tiles of
// vocab_tile rows of w with an online log-sum-exp; the backward recomputes each tile's logits and adds its
// share of dx with the linear's accumulate. Peak extra memory is one [T, vocab_tile] tile.
Var linear_cross_entropy(Var x, Var w, Var labels, int64_t vocab_tile);
// x rounded per 32-value block through GGML's Q8_0 activation format (d = amax/127, nearest-even, f16 d), as
// llama.cpp's CPU matmuls round the input of a Q4_0/Q8_0 weight; backward is the identity. Only for
// reproducing llama.cpp's numbers (q4tune logits --llama-cpp-numerics); cols must be a multiple of 32.
Var act_round_q8_0(Var x);
// The same through GGML's Q8_K activation blocks (256 values, f32 scale -1/127 of the value of largest |x|), as
// llama.cpp's CPU matmuls round the input of a Q4_K/Q6_K weight.
Var act_round_q8_k(Var x);
// Inverted dropout y = x * mask / (1 - p), the mask drawn from seed and, when given, salt (i32 [2]): its values
// are read each time the op runs, so rewriting the salt draws a new mask without rebuilding the graph.
Var dropout(Var x, double p, uint64_t seed, Var salt = {});

// Every op, registered by its file (see OpRegistration), sorted by name.
const std::vector<const OpDef*>& op_table();

struct GradcheckCase;
// Each op file registers its ops and the gradient-check cases that cover them with one static
//   const OpRegistration kRegistration({&kFooOp, &kBarOp}, add_foo_cases);
// The autograd library is an object library, so every file's registration is linked in.
struct OpRegistration {
  OpRegistration(std::initializer_list<const OpDef*> ops, void (*add_cases)(std::vector<GradcheckCase>&));
};

// --- Decoding with a KV cache (autograd/ops/decode.cpp) ------------------------------------------------------
// start [1] (i32) is the cache position of the first of the T new tokens: a tensor, not a parameter, so the
// host rewrites it before each forward and one recorded graph serves every step. S = cache rows (max context).
// The CPU throws std::out_of_range at forward time for positions outside [0, S); Vulkan drops such rows.

// rope() with token t at position start + t (the same op, reading its positions from start); differentiable in x.
Var rope_at(Var x, Var start, int64_t n_head, int64_t head_dim, RopeMode mode, const RopeFreqs& freqs);
Var rope_at(Var x, Var start, int64_t n_head, int64_t head_dim, RopeMode mode, double freq_base);
// The cache [S, C] with rows start .. start+T-1 replaced by x [T, C]. The output is the cache itself (same
// storage, written in place). Inference only: no input may depend on a parameter.
Var kv_cache_write(Var cache, Var x, Var start);
// attention() of q [T, H*D] at positions start .. start+T-1 over cache rows k, v [S, Hkv*D]: query t attends
// rows 0 .. start+t (grouped-query heads, f32 softmax with the row max subtracted). Out [T, H*D]. Inference only.
Var cached_attention(Var q, Var k_cache, Var v_cache, Var start, int64_t n_head, int64_t n_head_kv,
                     const AttentionOptions& o = {});

}  // namespace q4t::ag
