// The ops of decoding with a KV cache: kv_cache_write and cached_attention (rope_at, the rope of a decode step,
// is ops rope reading its first position from start; norm_rope_act.cpp).
//   T new tokens, S cache rows (the maximum context), H query heads, Hkv key/value heads, D head dim, C = Hkv*D.
// A decode graph is recorded once and run at every step, so the one value that changes per step, the cache
// position of the first new token, is not a push constant but start [1] (i32), a tensor the host rewrites
// before each forward. Token t of a step sits at position start + t and is stored in cache row start + t.
//
// kv_cache_write and cached_attention are inference only: their shape rules refuse inputs that need a gradient.
// Positions past the cache are an error on the CPU (std::out_of_range at forward time); a shader cannot throw,
// so on Vulkan writes past row S-1 are dropped and a query reads rows 0 .. min(start + t, S - 1).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"

namespace q4t::ag {

namespace {

void check_start(const char* op, const Tensor& start) {
  if (start.dtype() != DType::I32 || start.shape() != Shape{1})
    throw GraphError(std::string(op) + ": start must be an i32 tensor [1] (the position of the first new token), not " +
                     dtype_name(start.dtype()) + " " + shape_str(start.shape()));
}

void check_inference_only(const char* op, const Node& n) {
  if (n.requires_grad)
    throw GraphError(std::string(op) + " is for inference and has no backward: none of its inputs may depend on a "
                     "parameter");
}

// The start position, read on the CPU at forward time.
int64_t start_of(const OpContext& c, int k, int64_t rows, int64_t cache_rows, const char* op) {
  const int64_t start = c.in(k).data<int32_t>()[0];
  if (start < 0 || (cache_rows > 0 && start + rows > cache_rows))
    throw std::out_of_range(std::string(op) + ": tokens at positions " + std::to_string(start) + " .. " +
                            std::to_string(start + rows - 1) +
                            (cache_rows > 0 ? " do not fit the cache's " + std::to_string(cache_rows) + " rows"
                                            : " (a position must be non-negative)"));
  return start;
}

// --- kv_cache_write: cache [S, C] with rows start .. start+T-1 set to x [T, C] -------------------------------
// Inputs: cache, x, start. The output is the cache itself (prepare makes node.value a view of its storage), so
// an attention that takes the output reads the updated cache, ordered after the write by the graph.

struct KvWritePush {
  uint32_t n, cols, cache_rows;
};

Shape kv_cache_write_shape(const Graph& g, const Node& n) {
  const Tensor &cache = g.node(n.inputs[0]).value, &x = g.node(n.inputs[1]).value;
  if (!is_real(cache.dtype()) || !is_real(x.dtype()))
    throw GraphError(std::string("kv_cache_write: the cache and x must be real tensors, got ") +
                     dtype_name(cache.dtype()) + " and " + dtype_name(x.dtype()));
  if (cache.shape().size() != 2 || x.shape().size() != 2 || x.cols() != cache.cols() || x.rows() > cache.rows())
    throw GraphError("kv_cache_write: x " + shape_str(x.shape()) + " must be [T, C] rows of the cache " +
                     shape_str(cache.shape()) + " [S, C], with T <= S");
  check_start("kv_cache_write", g.node(n.inputs[2]).value);
  check_inference_only("kv_cache_write", n);
  return cache.shape();
}

void kv_cache_write_prepare(OpContext& c) { c.node.value = c.in(0).view(c.in(0).shape()); }

template <class Real>
void kv_cache_write_cpu(OpContext& c) {
  const Tensor& x = c.in(1);
  const int64_t start = start_of(c, 2, x.rows(), c.in(0).rows(), "kv_cache_write");
  std::memcpy(c.node.value.data<Real>() + start * x.cols(), x.data<Real>(), size_t(x.numel()) * sizeof(Real));
}

void kv_cache_write_forward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? kv_cache_write_cpu<double>(c) : kv_cache_write_cpu<float>(c);
  const Tensor& x = c.in(1);
  const KvWritePush push{uint32_t(x.numel()), uint32_t(x.cols()), uint32_t(c.in(0).rows())};
  c.seq->dispatch(c.be.pipeline("kv_cache_write", 3, sizeof(push)),
                  {&c.node.value.buffer(), &x.buffer(), &c.in(2).buffer()}, push, groups_for(x.numel(), 256));
}

// --- cached_attention: q [T, H*D] at positions start + t over cache rows k, v [S, Hkv*D] ---------------------
// Query t attends rows j ≤ start + t; S[h, t, j] = q_t · k_j / sqrt(D), softmax over j (row max subtracted),
// out_t = Σ_j P[h, t, j] v_j; query head h reads kv head h / (H / Hkv). The CPU sums in the order of ops
// attention, so both give the same numbers for the same q, k and v; Vulkan runs one pass with an online softmax
// (cached_attention.comp), so no [H, T, S] scores buffer exists.
// Inputs: q, k_cache, v_cache, start.

struct CachedAttentionParams {
  int64_t n_head, n_head_kv;
  AttentionOptions options;  // window and softcap, 0: none
};
struct CachedAttentionPush {
  uint32_t T, S, H, Hkv, D;
  float scale;
  uint32_t window;
  float softcap;
};
constexpr int64_t kMaxVulkanHeadDim = 256;  // MAX_D of cached_attention.comp

Shape cached_attention_shape(const Graph& g, const Node& n) {
  const Tensor &q = g.node(n.inputs[0]).value, &k = g.node(n.inputs[1]).value, &v = g.node(n.inputs[2]).value;
  const CachedAttentionParams& params = n.params_as<CachedAttentionParams>();
  const int64_t H = params.n_head, Hkv = params.n_head_kv;
  auto fail = [&](const std::string& why) {
    throw GraphError("cached_attention: " + why + " (q " + shape_str(q.shape()) + ", k cache " + shape_str(k.shape()) +
                     ", v cache " + shape_str(v.shape()) + ", n_head " + std::to_string(H) + ", n_head_kv " +
                     std::to_string(Hkv) + ")");
  };
  for (const Tensor* t : {&q, &k, &v})
    if (!is_real(t->dtype())) fail(std::string("inputs must be real tensors, got ") + dtype_name(t->dtype()));
  if (q.shape().size() != 2 || k.shape().size() != 2 || k.shape() != v.shape())
    fail("q must be [T, n_head * D] and the caches one shape [S, n_head_kv * D]");
  if (H <= 0 || Hkv <= 0 || H % Hkv != 0) fail("n_head must be a positive multiple of n_head_kv");
  if (q.cols() % H != 0) fail("q's columns are not a multiple of n_head");
  const int64_t D = q.cols() / H;
  if (k.cols() != Hkv * D) fail("the caches need n_head_kv * D = " + std::to_string(Hkv * D) + " columns");
  if (q.rows() > k.rows()) fail("more new tokens than cache rows");
  if (!g.backend().is_cpu() && D > kMaxVulkanHeadDim)
    fail("the Vulkan kernel takes a head dim of at most " + std::to_string(kMaxVulkanHeadDim));
  check_start("cached_attention", g.node(n.inputs[3]).value);
  check_inference_only("cached_attention", n);
  return q.shape();
}

template <class Real>
void cached_attention_cpu(OpContext& c) {
  const CachedAttentionParams& params = c.node.params_as<CachedAttentionParams>();
  const int64_t H = params.n_head, Hkv = params.n_head_kv, T = c.in(0).rows(), D = c.in(0).cols() / H;
  const int64_t start = start_of(c, 3, T, c.in(1).rows(), "cached_attention");
  const Real *q = c.in(0).data<Real>(), *k = c.in(1).data<Real>(), *v = c.in(2).data<Real>();
  Real* out = c.node.value.data<Real>();
  const Real scale = Real(1 / std::sqrt(double(D)));
  const int64_t qs = H * D, ks = Hkv * D, G = H / Hkv, W = params.options.window;
  const double cap = params.options.softcap;
  std::vector<Real> p(size_t(start + T));  // one row of probabilities
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kvo = (h / G) * D;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t last = start + t, first = W > 0 ? std::max<int64_t>(0, last - W + 1) : 0;
      const Real* qt = q + t * qs + h * D;
      Real m = -std::numeric_limits<Real>::infinity();
      for (int64_t j = first; j <= last; ++j) {
        Real s = 0;
        for (int64_t d = 0; d < D; ++d) s += qt[d] * k[j * ks + kvo + d];
        p[size_t(j)] = cap > 0 ? Real(cap) * std::tanh(scale * s / Real(cap)) : scale * s;
        m = std::max(m, p[size_t(j)]);
      }
      Real sum = 0;
      for (int64_t j = first; j <= last; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - m);
      for (int64_t j = first; j <= last; ++j) p[size_t(j)] /= sum;
      Real* o = out + t * qs + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = 0;
      for (int64_t j = first; j <= last; ++j)
        for (int64_t d = 0; d < D; ++d) o[d] += p[size_t(j)] * v[j * ks + kvo + d];
    }
  }
}

void cached_attention_forward(OpContext& c) {
  if (c.be.is_cpu())
    return c.be.real() == DType::F64 ? cached_attention_cpu<double>(c) : cached_attention_cpu<float>(c);
  const CachedAttentionParams& params = c.node.params_as<CachedAttentionParams>();
  const int64_t H = params.n_head, T = c.in(0).rows(), D = c.in(0).cols() / H, W = params.options.window;
  const CachedAttentionPush push{uint32_t(T), uint32_t(c.in(1).rows()), uint32_t(H), uint32_t(params.n_head_kv),
                                 uint32_t(D), float(1 / std::sqrt(double(D))),
                                 W > 0 && W < c.in(1).rows() ? uint32_t(W) : 0xFFFFFFFFu,
                                 float(params.options.softcap)};
  c.seq->dispatch(c.be.pipeline("cached_attention", 5, sizeof(push)),
                  {&c.node.value.buffer(), &c.in(0).buffer(), &c.in(1).buffer(), &c.in(2).buffer(), &c.in(3).buffer()},
                  push, groups_for(H * T * 64, 64));  // one workgroup of 64 per row (h, t)
}

const OpDef kKvCacheWriteOp{"kv_cache_write", kv_cache_write_shape, kv_cache_write_prepare, kv_cache_write_forward,
                            nullptr};
const OpDef kCachedAttentionOp{"cached_attention", cached_attention_shape, nullptr, cached_attention_forward,
                               nullptr};

// --- cases: the two inference-only ops compare their forward across backends ------

GradcheckCase forward_only(GradcheckCase c) {
  c.forward_only = true;
  return c;
}

GradcheckCase kv_cache_write_case(int64_t S, int64_t C, int64_t T, int32_t start) {
  return forward_only({"kv_cache_write S=" + std::to_string(S) + " C=" + std::to_string(C) + " T=" +
                           std::to_string(T) + " start=" + std::to_string(start),
                       [=](Graph& g, std::mt19937& r) {
                         Var cache = random_constant(g, r, {S, C}, "cache");
                         Var x = random_constant(g, r, {T, C}, "x", 2, 3);  // apart from the old rows' values
                         return kv_cache_write(cache, x, ids_constant(g, {start}, "start"));
                       }});
}

GradcheckCase cached_attention_case(int64_t T, int64_t S, int32_t start, int64_t H, int64_t Hkv, int64_t D,
                                    const std::string& note = "", AttentionOptions o = {}) {
  return forward_only({"cached_attention T=" + std::to_string(T) + " S=" + std::to_string(S) + " start=" +
                           std::to_string(start) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) +
                           " D=" + std::to_string(D) + note,
                       [=](Graph& g, std::mt19937& r) {
                         Var q = random_constant(g, r, {T, H * D}, "q");
                         Var k = random_constant(g, r, {S, Hkv * D}, "k_cache");
                         Var v = random_constant(g, r, {S, Hkv * D}, "v_cache");
                         return cached_attention(q, k, v, ids_constant(g, {start}, "start"), H, Hkv, o);
                       }});
}

void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back(kv_cache_write_case(9, 12, 3, 4));
  out.push_back(kv_cache_write_case(9, 12, 1, 8));
  out.push_back(cached_attention_case(1, 16, 9, 4, 2, 8));
  out.push_back(cached_attention_case(5, 12, 3, 2, 1, 16));
  out.push_back(cached_attention_case(4, 8, 0, 3, 3, 4, " (the prompt's first chunk)"));
  out.push_back(cached_attention_case(2, 150, 100, 2, 1, 4, " (keys in several blocks of 64)"));
  out.push_back(cached_attention_case(3, 70, 66, 4, 2, 72, " (more dims than a workgroup's lanes)"));
  out.push_back(cached_attention_case(2, 150, 100, 2, 1, 4, " (window 70, softcap 2)", {70, 2.0}));
  out.push_back(cached_attention_case(4, 12, 3, 2, 1, 8, " (window 3)", {3, 0}));
}

const OpRegistration kRegistration({&kKvCacheWriteOp, &kCachedAttentionOp}, add_cases);

}  // namespace

Var kv_cache_write(Var cache, Var x, Var start) { return cache.g->add(kKvCacheWriteOp, {cache, x, start}); }

Var cached_attention(Var q, Var k_cache, Var v_cache, Var start, int64_t n_head, int64_t n_head_kv,
                     const AttentionOptions& o) {
  if (o.window < 0 || !(o.softcap >= 0) || !std::isfinite(o.softcap))
    throw GraphError("cached_attention: window " + std::to_string(o.window) + " and softcap " +
                     std::to_string(o.softcap) + " must be non-negative (0: none)");
  return q.g->add(kCachedAttentionOp, {q, k_cache, v_cache, start},
                  CachedAttentionParams{.n_head = n_head, .n_head_kv = n_head_kv, .options = o});
}

}  // namespace q4t::ag
