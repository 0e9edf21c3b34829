// attention: causal self-attention with grouped-query heads.
//   T tokens, H query heads, Hkv key/value heads, G = H / Hkv query heads per kv head, D head dim.
//   q [T, H*D], k and v [T, Hkv*D], out [T, H*D]; query head h reads kv head hk = h / G.
// Forward, per head h and query token i:
//   S[h, i, j] = q_i · k_j / sqrt(D) for j ≤ i (causal), P = softmax over j (row max subtracted),
//   out_i = Σ_j P[h, i, j] v_j.
// Segmented (an optional fourth input seg [T] i32, one id per packed example): query i attends key j only if
// j ≤ i and seg[j] == seg[i]. With a sliding window W, also only if i − j < W. With soft-capping (gemma2),
// S = cap·tanh(q_i · k_j / sqrt(D) / cap), and dS below is multiplied by 1 − tanh². Every sum below then runs over those j only; entries of P (and dS) outside the
// mask are never written nor read, on the CPU and in every attention_*.comp.
// Backward, with dO = dL/d(out):
//   dP = dO · vᵀ, dS = P ∘ (dP - rowsum(dP ∘ P)),
//   dq = dS · k / sqrt(D), dk = dSᵀ · q / sqrt(D), dv = Pᵀ · dO, dk and dv of a kv head summing over its G heads.
// The CPU forward saves P [H, T, T] (entries j > i are never written nor read). On Vulkan the fused kernels
// (attention_flash_*.comp, and attention_coop_*.comp on tensor cores) keep no T×T matrix: the forward saves LSE
// [H, T] (each row's max plus log of its softmax denominator) and the backward recomputes P tile by tile from
// it, with Δ_i = dO_i·O_i in a [H, T] scratch.
// Every sum runs in a fixed order: no atomics, deterministic results.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/ops/vk_util.h"

namespace q4t::ag {

namespace {

struct Dims {
  int64_t T, H, Hkv, D;
  int64_t G() const { return H / Hkv; }
};

bool is_segmented(const OpContext& c) { return c.node.inputs.size() == 4; }

struct AttentionParams {
  int64_t n_head, n_head_kv;
  AttentionOptions options;  // window and softcap, 0: none
};
const AttentionParams& params_of(const OpContext& c) { return c.node.params_as<AttentionParams>(); }
int64_t window_of(const OpContext& c) { return params_of(c).options.window; }
double softcap_of(const OpContext& c) { return params_of(c).options.softcap; }
Dims attention_dims(const OpContext& c) {
  const AttentionParams& p = params_of(c);
  return {c.in(0).rows(), p.n_head, p.n_head_kv, c.in(0).cols() / p.n_head};
}

Shape attention_shape(const Graph& g, const Node& n) {
  const Tensor &q = g.node(n.inputs[0]).value, &k = g.node(n.inputs[1]).value, &v = g.node(n.inputs[2]).value;
  const AttentionParams& params = n.params_as<AttentionParams>();
  const int64_t H = params.n_head, Hkv = params.n_head_kv;
  auto fail = [&](const std::string& why) {
    throw GraphError("attention: " + why + " (q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " +
                     shape_str(v.shape()) + ", n_head " + std::to_string(H) + ", n_head_kv " + std::to_string(Hkv) +
                     ")");
  };
  for (const Tensor* t : {&q, &k, &v})
    if (!is_real(t->dtype())) fail(std::string("inputs must be real tensors, got ") + dtype_name(t->dtype()));
  if (q.shape().size() != 2 || k.shape().size() != 2 || v.shape().size() != 2)
    fail("q, k and v must be matrices [T, heads * D]");
  if (H <= 0 || Hkv <= 0 || H % Hkv != 0) fail("n_head must be a positive multiple of n_head_kv");
  if (q.cols() % H != 0) fail("q's " + std::to_string(q.cols()) + " columns are not divisible by n_head");
  if (k.shape() != v.shape()) fail("k and v must have the same shape");
  if (k.rows() != q.rows()) fail("k and v must have as many tokens (rows) as q");
  const int64_t D = q.cols() / H;
  if (k.cols() != Hkv * D)
    fail("k and v need n_head_kv * D = " + std::to_string(Hkv * D) + " columns for head dim D = " + std::to_string(D));
  if (q.rows() == 0 || D == 0) fail("needs at least one token and a non-empty head");
  if (n.inputs.size() == 4) {
    const Tensor& seg = g.node(n.inputs[3]).value;
    if (seg.dtype() != DType::I32 || seg.shape() != Shape{q.rows()})
      fail("segment_ids must be an i32 vector [T] = [" + std::to_string(q.rows()) + "], got " +
           dtype_name(seg.dtype()) + " " + shape_str(seg.shape()));
  }
  return q.shape();
}

// How the fused Vulkan kernels split a head's D dims over the invocations of a row (attention_flash.glsl).
struct FlashLayout {
  uint32_t split = 1, dpl = 1, tile = 32;
};

// The fused kernels' passes, and the head dims each gives one invocation (kFlashDims) at most; shared tiles of
// kFlashTile rows at most; workgroups of kFlashWorkgroup invocations (attention_flash.glsl's WG). H100,
// tinyllama-1.1b at batch 4 (2048 tokens, D = 64), forward + backward ms per step: with 64 invocations and tiles
// of 32 rows, 32/32/16 dims, 22.6 + 65.9; tiles of 16 14.0 + 40.5 (8: 13.9 + 42.4; 64: 38.9 + 117.8); then 64 dims
// in the forward 12.6 (16: 40.6), 32 in the dK/dV pass 32.7 (64: 85.1; 64 in the dq pass 42.0). With 128
// invocations and tiles of 32, 11.1 + 27.6 (tiles of 16: 11.2 + 29.8; 256 invocations: 12.9 + 30.0).
enum FlashPass { kFlashForward, kFlashDq, kFlashDkv };
constexpr uint32_t kFlashDims[3] = {64, 32, 32};
constexpr uint32_t kFlashTile = 32;
constexpr uint32_t kFlashWorkgroup = 128;
// The two [TILE, DP] f32 tiles of a pass fit in this; the rest of the 32 KiB of shared memory every device has
// is left for the small arrays (a tile's segment ids and LSE and Δ rows, the tile bits of tile_meets).
constexpr uint32_t kFlashTileBytes = 32768 - 1024;
static_assert(kFlashTile <= kFlashWorkgroup, "a tile's segment ids are staged one per invocation");
static_assert(kFlashWorkgroup % 32 == 0, "tile_meets (attention_flash.glsl) keeps a bit per invocation in 32-bit words");

// Rows of up to kFlashDims[pass] head dims per invocation, SPLIT a power of two within the subgroup (and at most
// 64), DPL rounded up to whole vec4s; shared tiles of TILE rows keep two [TILE, DP] arrays within kFlashTileBytes.
FlashLayout flash_layout(int64_t D, FlashPass pass, uint32_t subgroup) {
  FlashLayout f;
  const uint32_t dims = kFlashDims[pass];
  while (f.split < 64 && f.split * 2 <= subgroup && (uint32_t(D) + f.split - 1) / f.split > dims) f.split *= 2;
  f.dpl = ((uint32_t(D) + f.split - 1) / f.split + 3) / 4 * 4;
  const uint32_t dp = f.split * f.dpl;
  f.tile = kFlashTile;
  while (f.tile > 4 && 2 * f.tile * dp * 4 > kFlashTileBytes) f.tile /= 2;
  return f;
}

// Workgroups covering T rows, kFlashWorkgroup / SPLIT rows each (attention_flash.glsl's ROWS).
uint32_t row_groups(int64_t T, const FlashLayout& f) {
  const int64_t rows = kFlashWorkgroup / f.split;
  return uint32_t((T + rows - 1) / rows);
}

// The tensor-core passes (attention_coop_*.comp, attention_flash.glsl's layout with SPLIT = 1): where the device
// has cooperative matrices, for head dims that are multiples of 16 (up to 128 in the forward and in the mixed
// backward, whose tiles are f16 alone; 64 in the f32 backward, whose shared tiles hold hi and lo parts of twice
// the rows) and at least kCoopAttentionMinTokens tokens (fewer would leave most of a 64-row tile empty). Tiles of
// kFlashTile rows of the other side (kCoopMixedBackwardTile in the mixed backward); workgroups of
// kFlashWorkgroup invocations, 16 rows per subgroup of 32.
constexpr int64_t kCoopAttentionMinTokens = 32;
// Soft-capped scores (gemma2) take the FP32 passes.
bool coop_attention(const OpContext& c, const Dims& n, bool backward) {
  const bool f32_backward = backward && c.be.precision() != Precision::Mixed;
  return c.be.device().coop_matrix() && n.D % 16 == 0 && n.D <= (f32_backward ? 64 : 128) &&
         n.T >= kCoopAttentionMinTokens && softcap_of(c) == 0;
}
// A tensor-core pass's shader: its mixed-precision variant (one f16 product per step) under --precision mixed.
std::string coop_pass(const OpContext& c, const char* pass) {
  return c.be.precision() == Precision::Mixed ? std::string(pass) + "_mixed" : std::string(pass);
}

// The backward's scale of dO (attention_coop.glsl: dout_scale) comes from kDoutMaxGroups partial maxima.
constexpr uint32_t kDoutMaxGroups = 64;
// The mixed backward passes (attention_coop_dq_mixed.comp, _dkv_mixed.comp) keep P and dS in registers and stage
// f16 tiles alone, which leaves room for tiles of kCoopMixedBackwardTile keys or queries.
constexpr uint32_t kCoopMixedBackwardTile = 64;
static_assert(kCoopMixedBackwardTile <= kFlashWorkgroup, "a tile's per-row values are staged one per invocation");
std::vector<uint32_t> coop_spec(const Dims& n, uint32_t tile = kFlashTile) {
  return {1, uint32_t(n.D), tile, kFlashWorkgroup, kDoutMaxGroups};
}
// The mixed forward's f16-only tiles (attention_coop_fwd.comp, MIXED) hold kCoopMixedForwardTile keys for head dims
// up to 64 in 37 KiB of shared memory: half the key steps of kFlashTile, each with its barriers and softmax pass.
constexpr uint32_t kCoopMixedForwardTile = 64;
constexpr uint32_t kCoopMixedForwardBytes = 40 * 1024;
uint32_t forward_tile(const OpContext& c, const Dims& n) {
  const bool wide = c.be.precision() == Precision::Mixed && n.D <= 64 &&
                    c.be.device().properties().limits.maxComputeSharedMemorySize >= kCoopMixedForwardBytes;
  return wide ? kCoopMixedForwardTile : kFlashTile;
}
uint32_t backward_tile(const OpContext& c) {
  return c.be.precision() == Precision::Mixed ? kCoopMixedBackwardTile : kFlashTile;
}
uint32_t coop_row_groups(int64_t T) {
  const int64_t rows = kFlashWorkgroup / 32 * 16;
  return uint32_t((T + rows - 1) / rows);
}

// Whether the dK/dV pass runs one workgroup per query head of each kv group (then adds the heads in a second
// pass): when G > 1 and the key tiles times the kv heads make fewer than kSplitBelowGroups workgroups, which
// leaves a large GPU idle (tinyllama's 4 kv heads: 32 at 512 tokens, 128 at 2048). The per-head sums cost
// 2G·T·Hkv·D floats per attention node. H100, tinyllama-1.1b: backward 45 -> 22 ms per bs1 step, 179 -> 132 at bs4.
constexpr int64_t kSplitBelowGroups = 4096;
bool split_dkv(const OpContext& c, const Dims& n) {
  const uint32_t key_groups = coop_attention(c, n, true)
                                  ? coop_row_groups(n.T)
                                  : row_groups(n.T, flash_layout(n.D, kFlashDkv, c.be.device().subgroup_size()));
  return n.G() > 1 && int64_t(key_groups) * n.Hkv < kSplitBelowGroups;
}

// CPU: P [H, T, T]. Vulkan: LSE [H, T]; when a gradient is needed also Δ [H, T], a stand-in for dq when q needs
// none (the pass that writes Δ writes dq too; else one float), and the per-head dK/dV sums [2G, T, Hkv*D] when
// the dK/dV pass is split over the query heads (split_dkv; else one float); on the tensor-core backward, the
// partial maxima of |dO|.
void attention_prepare(OpContext& c) {
  const Dims n = attention_dims(c);
  if (c.be.is_cpu()) {
    c.node.saved.push_back(c.scratch({n.H, n.T, n.T}, c.be.real(), Scratch::Saved));
    return;
  }
  for (FlashPass pass : {kFlashForward, kFlashDq, kFlashDkv}) {
    const FlashLayout f = flash_layout(n.D, pass, c.be.device().subgroup_size());
    if (f.tile * f.split * f.dpl * 4 * 2 > kFlashTileBytes)
      throw GraphError("attention: head dim " + std::to_string(n.D) + " is too large for the Vulkan kernels' shared tiles");
  }
  if (n.H * n.T > int64_t(std::numeric_limits<uint32_t>::max()) / 2 || n.T * n.H * n.D > int64_t(std::numeric_limits<uint32_t>::max()))
    throw GraphError("attention: " + std::to_string(n.T) + " tokens of " + std::to_string(n.H * n.D) +
                     " values exceed the 32-bit indexing of the Vulkan kernels; use fewer tokens");
  c.node.saved.push_back(c.scratch({n.H, n.T}, c.be.real(), Scratch::Saved));
  if (!c.node.requires_grad) return;
  c.node.saved.push_back(c.scratch({n.H, n.T}, c.be.real(), Scratch::Pass));
  c.node.saved.push_back(c.scratch(c.needs_grad(0) ? Shape{1} : c.in(0).shape(), c.be.real(), Scratch::Pass));
  const bool split = (c.needs_grad(1) || c.needs_grad(2)) && split_dkv(c, n);
  c.node.saved.push_back(c.scratch(split ? Shape{2 * n.G(), n.T, n.Hkv * n.D} : Shape{1}, c.be.real(), Scratch::Pass));
  if (coop_attention(c, n, true)) c.node.saved.push_back(c.scratch({kDoutMaxGroups}, DType::F32, Scratch::Pass));
}

// --- CPU ---------------------------------------------------------------------------------------------------

template <class Real>
Real dot(const Real* a, const Real* b, int64_t n) {
  Real s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Whether query i attends key j ≤ i: within the window (when there is one), and within its segment when seg [T]
// is given.
bool attends(const int32_t* seg, int64_t window, int64_t i, int64_t j) {
  return (window <= 0 || i - j < window) && (!seg || seg[j] == seg[i]);
}

// A score soft-capped: cap·tanh(s / cap), or s without a cap.
template <class Real>
Real capped(Real s, double cap) {
  return cap > 0 ? Real(cap) * std::tanh(s / Real(cap)) : s;
}

template <class Real>
void attention_forward_cpu(OpContext& c) {
  const Dims n = attention_dims(c);
  const Real *q = c.in(0).data<Real>(), *k = c.in(1).data<Real>(), *v = c.in(2).data<Real>();
  const int32_t* seg = is_segmented(c) ? c.in(3).data<int32_t>() : nullptr;
  Real *P = c.node.saved.at(0).data<Real>(), *out = c.node.value.data<Real>();
  const Real scale = Real(1 / std::sqrt(double(n.D)));
  const int64_t qs = n.H * n.D, ks = n.Hkv * n.D;  // row strides of q/out and k/v
  const int64_t W = window_of(c);
  const double cap = softcap_of(c);
  for (int64_t h = 0; h < n.H; ++h) {
    const int64_t kvo = (h / n.G()) * n.D;
    for (int64_t i = 0; i < n.T; ++i) {
      Real* p = P + (h * n.T + i) * n.T;  // row [T], attended j ≤ i used
      Real m = -std::numeric_limits<Real>::infinity();
      for (int64_t j = 0; j <= i; ++j) {
        if (!attends(seg, W, i, j)) continue;
        p[j] = capped(scale * dot(q + i * qs + h * n.D, k + j * ks + kvo, n.D), cap);
        m = std::max(m, p[j]);
      }
      Real sum = 0;
      for (int64_t j = 0; j <= i; ++j)
        if (attends(seg, W, i, j)) sum += p[j] = std::exp(p[j] - m);
      for (int64_t j = 0; j <= i; ++j)
        if (attends(seg, W, i, j)) p[j] /= sum;
      Real* o = out + i * qs + h * n.D;  // [D]
      for (int64_t d = 0; d < n.D; ++d) o[d] = 0;
      for (int64_t j = 0; j <= i; ++j)
        if (attends(seg, W, i, j))
          for (int64_t d = 0; d < n.D; ++d) o[d] += p[j] * v[j * ks + kvo + d];
    }
  }
}

// Row by row: dP_i, the row sum r_i = Σ_j P dP, then each dS entry goes straight into dq_i and dk_j (P into dv_j).
template <class Real>
void attention_backward_cpu(OpContext& c) {
  const Dims n = attention_dims(c);
  const Real *q = c.in(0).data<Real>(), *k = c.in(1).data<Real>(), *v = c.in(2).data<Real>();
  const Real *P = c.node.saved.at(0).data<Real>(), *dout = c.node.grad.data<Real>();
  const int32_t* seg = is_segmented(c) ? c.in(3).data<int32_t>() : nullptr;
  Real* dq = c.needs_grad(0) ? c.in_grad(0).data<Real>() : nullptr;
  Real* dk = c.needs_grad(1) ? c.in_grad(1).data<Real>() : nullptr;
  Real* dv = c.needs_grad(2) ? c.in_grad(2).data<Real>() : nullptr;
  const Real scale = Real(1 / std::sqrt(double(n.D)));
  const int64_t qs = n.H * n.D, ks = n.Hkv * n.D;
  const int64_t W = window_of(c);
  const double cap = softcap_of(c);
  std::vector<Real> dp(size_t(n.T));  // dP row [T]
  for (int64_t h = 0; h < n.H; ++h) {
    const int64_t kvo = (h / n.G()) * n.D;
    for (int64_t i = 0; i < n.T; ++i) {
      const Real* p = P + (h * n.T + i) * n.T;
      const Real* doi = dout + i * qs + h * n.D;
      Real r = 0;
      for (int64_t j = 0; j <= i; ++j) {
        if (!attends(seg, W, i, j)) continue;
        dp[size_t(j)] = dot(doi, v + j * ks + kvo, n.D);
        r += p[j] * dp[size_t(j)];
      }
      for (int64_t j = 0; j <= i; ++j) {
        if (!attends(seg, W, i, j)) continue;
        Real ds = scale * p[j] * (dp[size_t(j)] - r);  // dL/d(q_i·k_j)
        if (cap > 0) {  // through the cap: d(cap·tanh(s/cap))/ds = 1 − tanh²
          const Real t = std::tanh(scale * dot(q + i * qs + h * n.D, k + j * ks + kvo, n.D) / Real(cap));
          ds *= 1 - t * t;
        }
        for (int64_t d = 0; d < n.D; ++d) {
          if (dq) dq[i * qs + h * n.D + d] += ds * k[j * ks + kvo + d];
          if (dk) dk[j * ks + kvo + d] += ds * q[i * qs + h * n.D + d];
          if (dv) dv[j * ks + kvo + d] += p[j] * doi[d];
        }
      }
    }
  }
}

// --- Vulkan ------------------------------------------------------------------------------------------------

// The seg binding of the fused kernels; unsegmented, q's buffer stands in (never read).
const vk::Buffer& segment_buffer(const OpContext& c) { return c.in(is_segmented(c) ? 3 : 0).buffer(); }

// The fused kernels' push block (attention_flash.glsl).
struct FlashPush {
  uint32_t T, H, Hkv, D;
  float s;
  uint32_t segmented, flags, window;
  float softcap;
};

FlashPush flash_push(const OpContext& c, uint32_t flags) {
  const Dims n = attention_dims(c);
  const int64_t W = window_of(c);
  return {uint32_t(n.T), uint32_t(n.H), uint32_t(n.Hkv), uint32_t(n.D), float(1 / std::sqrt(double(n.D))),
          is_segmented(c) ? 1u : 0u, flags, W > 0 && W < n.T ? uint32_t(W) : 0xFFFFFFFFu, float(softcap_of(c))};
}

std::vector<uint32_t> flash_spec(const FlashLayout& f) { return {f.split, f.dpl, f.tile, kFlashWorkgroup}; }

void attention_forward_flash(OpContext& c) {
  const Dims n = attention_dims(c);
  const FlashPush push = flash_push(c, 0);
  const bool coop = coop_attention(c, n, false);
  const FlashLayout f = flash_layout(n.D, kFlashForward, c.be.device().subgroup_size());
  c.seq->dispatch(c.be.pipeline(coop ? coop_pass(c, "attention_coop_fwd") : "attention_flash_fwd", 6, sizeof(push),
                                coop ? coop_spec(n, forward_tile(c, n)) : flash_spec(f)),
                  {&c.node.value.buffer(), &c.node.saved.at(0).buffer(), &c.in(0).buffer(), &c.in(1).buffer(),
                   &c.in(2).buffer(), &segment_buffer(c)},
                  push, {coop ? coop_row_groups(n.T) : row_groups(n.T, f), uint32_t(n.H), 1});
}

void attention_backward_flash(OpContext& c) {
  const Dims n = attention_dims(c);
  const Tensor &lse = c.node.saved.at(0), &delta = c.node.saved.at(1);
  // Δ comes from the dq pass, which therefore always runs; its dq goes to a stand-in when q needs none.
  // The tensor-core passes take the FP32 ones' buffers in the same order, then the partial maxima of |dO|.
  const bool coop = coop_attention(c, n, true);
  // The FP32 passes leave binding 9 unused: it gets LSE there.
  const vk::Buffer* dout_max = coop ? &c.node.saved.at(4).buffer() : &c.node.saved.at(0).buffer();
  if (coop) {
    const uint32_t total = uint32_t(n.T * n.H * n.D);
    c.seq->dispatch(c.be.pipeline("attention_dout_max", 2, sizeof(total), {kDoutMaxGroups}),
                    {dout_max, &c.node.grad.buffer()}, total, {kDoutMaxGroups, 1, 1});
  }
  const FlashLayout fq = flash_layout(n.D, kFlashDq, c.be.device().subgroup_size());
  const FlashPush pq = flash_push(c, 0);
  const Tensor& dq = c.needs_grad(0) ? c.in_grad(0) : c.node.saved.at(2);
  const uint32_t bindings = 10;
  c.seq->dispatch(c.be.pipeline(coop ? coop_pass(c, "attention_coop_dq") : "attention_flash_dq", bindings, sizeof(pq),
                                coop ? coop_spec(n, backward_tile(c)) : flash_spec(fq)),
                  {&dq.buffer(), &delta.buffer(), &c.in(0).buffer(), &c.in(1).buffer(), &c.in(2).buffer(),
                   &c.node.value.buffer(), &c.node.grad.buffer(), &lse.buffer(), &segment_buffer(c), dout_max},
                  pq, {coop ? coop_row_groups(n.T) : row_groups(n.T, fq), uint32_t(n.H), 1});
  if (!c.needs_grad(1) && !c.needs_grad(2)) return;
  const FlashLayout fk = flash_layout(n.D, kFlashDkv, c.be.device().subgroup_size());
  const uint32_t want = (c.needs_grad(1) ? 1u : 0u) | (c.needs_grad(2) ? 2u : 0u);
  // A gradient not needed gets the other one's buffer as an unwritten stand-in.
  const Tensor& dk = c.needs_grad(1) ? c.in_grad(1) : c.in_grad(2);
  const Tensor& dv = c.needs_grad(2) ? c.in_grad(2) : c.in_grad(1);
  const uint32_t key_groups = coop ? coop_row_groups(n.T) : row_groups(n.T, fk);
  const auto& pipe = c.be.pipeline(coop ? coop_pass(c, "attention_coop_dkv") : "attention_flash_dkv", bindings, sizeof(FlashPush),
                                   coop ? coop_spec(n, backward_tile(c)) : flash_spec(fk));
  if (!split_dkv(c, n)) {
    const FlashPush pk = flash_push(c, want);
    c.seq->dispatch(pipe,
                    {&dk.buffer(), &dv.buffer(), &c.in(0).buffer(), &c.in(1).buffer(), &c.in(2).buffer(),
                     &c.node.grad.buffer(), &lse.buffer(), &delta.buffer(), &segment_buffer(c), dout_max},
                    pk, {key_groups, uint32_t(n.Hkv), 1});
    return;
  }
  // One workgroup per query head of each group, into the per-head scratch; then the heads added in order.
  const Tensor& part = c.node.saved.at(3);
  const FlashPush pk = flash_push(c, want | 4u);
  c.seq->dispatch(pipe,
                  {&part.buffer(), &part.buffer(), &c.in(0).buffer(), &c.in(1).buffer(), &c.in(2).buffer(),
                   &c.node.grad.buffer(), &lse.buffer(), &delta.buffer(), &segment_buffer(c), dout_max},
                  pk, {key_groups, uint32_t(n.Hkv), uint32_t(n.G())});
  struct { uint32_t n, G, flags; } red{uint32_t(n.T * n.Hkv * n.D), uint32_t(n.G()), want};
  c.seq->dispatch(c.be.pipeline("attention_dkv_reduce", 3, sizeof(red)), {&dk.buffer(), &dv.buffer(), &part.buffer()},
                  red, groups_for(n.T * n.Hkv * n.D, 256));
}

void attention_forward(OpContext& c) {
  if (!c.be.is_cpu()) return attention_forward_flash(c);
  c.be.real() == DType::F64 ? attention_forward_cpu<double>(c) : attention_forward_cpu<float>(c);
}
void attention_backward(OpContext& c) {
  if (!c.be.is_cpu()) return attention_backward_flash(c);
  c.be.real() == DType::F64 ? attention_backward_cpu<double>(c) : attention_backward_cpu<float>(c);
}

const OpDef kAttentionOp{"attention", attention_shape, attention_prepare, attention_forward, attention_backward};

GradcheckCase attention_case(int64_t T, int64_t H, int64_t Hkv, int64_t D, const std::string& note = "") {
  return {"attention T=" + std::to_string(T) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) +
              " D=" + std::to_string(D) + note,
          [=](Graph& g, std::mt19937& r) {
            Var q = random_param(g, r, {T, H * D}, "q");
            Var k = random_param(g, r, {T, Hkv * D}, "k");
            Var v = random_param(g, r, {T, Hkv * D}, "v");
            return attention(q, k, v, H, Hkv);
          }};
}

// Packed examples: seg [T] gives each token its example's id (0 = padding, itself one segment).
GradcheckCase segmented_attention_case(const std::vector<int32_t>& seg, int64_t H, int64_t Hkv, int64_t D,
                                       const std::string& note = "") {
  const int64_t T = int64_t(seg.size());
  return {"attention segmented T=" + std::to_string(T) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) +
              " D=" + std::to_string(D) + note,
          [=](Graph& g, std::mt19937& r) {
            Var q = random_param(g, r, {T, H * D}, "q");
            Var k = random_param(g, r, {T, Hkv * D}, "k");
            Var v = random_param(g, r, {T, Hkv * D}, "v");
            return attention(q, k, v, H, Hkv, ids_constant(g, seg, "segment_ids"));
          }};
}

// gemma's options: a sliding window of `window` keys and/or soft-capped scores (scores made large enough, by
// q and k of spread 3, that the cap bends them).
GradcheckCase windowed_attention_case(int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t window, double softcap,
                                      const std::vector<int32_t>& seg = {}, const std::string& note = "") {
  return {"attention window=" + std::to_string(window) + " softcap=" + std::to_string(int(softcap)) + " T=" +
              std::to_string(T) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " D=" +
              std::to_string(D) + (seg.empty() ? "" : " segmented") + note,
          [=](Graph& g, std::mt19937& r) {
            const double a = softcap > 0 ? 3 : 1;
            Var q = random_param(g, r, {T, H * D}, "q", -a, a);
            Var k = random_param(g, r, {T, Hkv * D}, "k", -a, a);
            Var v = random_param(g, r, {T, Hkv * D}, "v");
            const AttentionOptions o{window, softcap};
            if (seg.empty()) return attention(q, k, v, H, Hkv, o);
            return attention(q, k, v, H, Hkv, o, ids_constant(g, seg, "segment_ids"));
          }};
}

// Segments of the given lengths, numbered 1, 2, ...
std::vector<int32_t> segments_of(std::initializer_list<int32_t> lengths) {
  std::vector<int32_t> seg;
  int32_t id = 0;
  for (int32_t len : lengths) seg.insert(seg.end(), size_t(len), ++id);
  return seg;
}

void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back(attention_case(5, 4, 2, 8));
  out.push_back(attention_case(7, 3, 3, 4));
  out.push_back(attention_case(1, 2, 1, 16));
  out.push_back(attention_case(70, 2, 1, 4, " (rows longer than a key tile)"));
  out.push_back(segmented_attention_case({1, 1, 1, 2, 2, 3, 3}, 2, 1, 8));
  out.push_back(segmented_attention_case({1, 1, 2, 2, 2, 0}, 2, 1, 8, " (padding)"));
  out.push_back(segmented_attention_case({1, 2, 1, 2, 1, 2}, 4, 2, 4, " (interleaved ids)"));
  out.push_back(segmented_attention_case(segments_of({30, 25, 15}), 2, 1, 4, " (segments across key tiles)"));
  // The fused Vulkan kernels: head dims split over 2 to 8 invocations (D = 40, 72), key and query tiles that do
  // not divide T, and whole tiles skipped because their segments cannot meet.
  out.push_back(attention_case(45, 4, 2, 40, " (dims split over invocations)"));
  out.push_back(segmented_attention_case(segments_of({30, 25, 15}), 2, 1, 72, " (tiles skipped by segment)"));
  // The tensor-core passes where the device has them (D a multiple of 16, T >= 32): a last row tile of 6 rows
  // and a last key tile of 6 keys, dK/dV per query head (G = 2); D = 128 (the forward, and the mixed backward);
  // segments, tiles skipped; one query head per kv head (G = 1: the dK/dV pass adds into dK and dV itself).
  out.push_back(attention_case(70, 4, 2, 16, " (tensor cores)"));
  out.push_back(attention_case(40, 2, 1, 128, " (tensor-core forward)"));
  out.push_back(segmented_attention_case(segments_of({40, 33, 27}), 2, 1, 32, " (tensor cores)"));
  out.push_back(attention_case(50, 2, 2, 32, " (tensor cores, G = 1)"));
  // Sliding windows shorter than the rows (within and across key tiles), soft-capping, both, with segments; the
  // window on the tensor-core passes (soft-capping takes the FP32 ones).
  out.push_back(windowed_attention_case(9, 2, 1, 8, 3, 0));
  out.push_back(windowed_attention_case(7, 2, 2, 4, 0, 2.0));
  out.push_back(windowed_attention_case(70, 2, 1, 8, 37, 5.0, {}, " (rows longer than a key tile)"));
  out.push_back(windowed_attention_case(70, 4, 2, 16, 20, 0, {}, " (tensor cores)"));
  out.push_back(windowed_attention_case(45, 4, 2, 40, 11, 3.0, segments_of({20, 25}), " (dims split over invocations)"));
}

const OpRegistration kRegistration({&kAttentionOp}, add_cases);

}  // namespace

Var attention(Var q, Var k, Var v, int64_t n_head, int64_t n_head_kv, const AttentionOptions& o, Var segment_ids) {
  if (o.window < 0 || !(o.softcap >= 0) || !std::isfinite(o.softcap))
    throw GraphError("attention: window " + std::to_string(o.window) + " and softcap " + std::to_string(o.softcap) +
                     " must be non-negative (0: none)");
  const AttentionParams p{.n_head = n_head, .n_head_kv = n_head_kv, .options = o};
  if (!segment_ids.g) return q.g->add(kAttentionOp, {q, k, v}, p);
  return q.g->add(kAttentionOp, {q, k, v, segment_ids}, p);
}

Var attention(Var q, Var k, Var v, int64_t n_head, int64_t n_head_kv) {
  return attention(q, k, v, n_head, n_head_kv, AttentionOptions{});
}

Var attention(Var q, Var k, Var v, int64_t n_head, int64_t n_head_kv, Var segment_ids) {
  return attention(q, k, v, n_head, n_head_kv, AttentionOptions{}, segment_ids);
}

}  // namespace q4t::ag
