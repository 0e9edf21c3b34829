// Shared parts of the tensor-core attention passes (attention_coop_*.comp), for devices with
// VK_NV_cooperative_matrix and subgroups of 32 (autograd/ops/attention.cpp picks them): causal self-attention as in
// attention_flash.glsl, whose layout they use with SPLIT = 1: DPL is the head dim D (a multiple of 16), TILE the BC
// rows of the other side staged per step, WG the invocations (WG / 32 subgroups of 16 rows each). Numerics near
// f32: every matrix input as f16 hi + lo (split8_in_order), every product as hi·hi + hi·lo + lo·hi into f32; the
// *_mixed passes (MIXED: the forward a variant, the backward's sources of their own that keep P and dS in
// registers) take one f16 rounded to nearest and one product, as mixed_gemm.comp. Values must stay within f16's
// range (|x| < 65504). Accuracy as measured: docs/kernels.md, "Tensor-core attention".
// The including shader binds its buffers, defines SEG_IDS, includes this, then declares `shared uvec4 tiles[]`
// (the helpers that touch it are macros). Row-wise work (masks, softmax) runs on 16 x BC blocks in a subgroup's
// own part of tiles, two lanes per row, each with HALF = BC / 2 columns.
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#include "attention_flash.glsl"
#include "f16_split.glsl"

#define F32_MAT fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16_MAT fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
const uint D = DPL, DF = D / 16u, BC = TILE, NSG = WG / 32u, BR = 16u * NSG, HALF = BC / 2u;
const uint KS = D / 8u + 1u;   // row stride of a staged [rows][D] f16 tile, in uvec4s of 8 halves (+1 padding)
const uint SS = BC / 4u + 1u;  // ... of a 16 x BC f32 block (uvec4s of 4 floats)
const uint PS = BC / 8u + 1u;  // ... of a 16 x BC f16 block

// Powers of two that keep the split values inside f16's normal range, where the low parts keep their bits: the
// probabilities (at most 1) enter as P·P_SCALE, and the backward's dO as dO·γ (dout_scale), so that dP and dS
// scale with it however small the gradients are; the sums are divided back, exactly.
const float P_SCALE = 4096.0;
#ifdef DOUT_MAX
// γ brings the largest |dO| (the maximum of the partials of attention_dout_max.comp) to [2^7, 2^8); 1 when dO is 0.
float dout_scale() {
  float m = 0.0;
  for (uint g = 0u; g < DOUT_MAX_GROUPS; ++g) m = max(m, DOUT_MAX[g]);
  if (!(m > 0.0) || isinf(m)) return 1.0;
  int e;
  frexp(m, e);  // m = f·2^e, f in [0.5, 1)
  return ldexp(1.0, 8 - e);
}
#endif

// acc += a·b for split a (a_hi, a_lo) and b (b_hi, b_lo). MIXED (mixed precision, kernels/precision.h): every input
// is one f16 rounded to nearest (SPLIT8 leaves the lo parts zero, and no load of them survives), one product.
#ifdef MIXED
#define MMA3(acc, a_hi, a_lo, b_hi, b_lo) acc = coopMatMulAddNV(a_hi, b_hi, acc)
#define SPLIT8(a, b, h, l)                                                                           \
  h = uvec4(packHalf2x16((a).xy), packHalf2x16((a).zw), packHalf2x16((b).xy), packHalf2x16((b).zw)); \
  l = uvec4(0u)
#else
#define MMA3(acc, a_hi, a_lo, b_hi, b_lo) \
  acc = coopMatMulAddNV(a_hi, b_hi, acc); \
  acc = coopMatMulAddNV(a_hi, b_lo, acc); \
  acc = coopMatMulAddNV(a_lo, b_hi, acc)
#define SPLIT8(a, b, h, l) split8_in_order(a, b, h, l)
#endif

// Rows r0 .. r0 + n of `buf` (vec4[], rows of `stride` floats, D of them from float col0 on) times `scale`, as
// f16 hi/lo into tiles[hi], tiles[lo] (rows of KS); rows from T on are zero. The whole workgroup takes part.
#define STAGE_ROWS(buf, hi, lo, r0, n, stride, col0, scale)                                   \
  for (uint e_ = gl_LocalInvocationIndex; e_ < (n) * (D / 8u); e_ += WG) {                     \
    const uint row_ = e_ / (D / 8u), g_ = e_ % (D / 8u), src_ = (r0) + row_;                    \
    const uint base_ = (min(src_, u.T - 1u) * (stride) + (col0)) / 4u + 2u * g_;                \
    const bool ok_ = src_ < u.T;                                                                \
    uvec4 h_, l_;                                                                               \
    const vec4 a_ = ok_ ? (scale) * buf[base_] : vec4(0.0), b_ = ok_ ? (scale) * buf[base_ + 1u] : vec4(0.0); \
    SPLIT8(a_, b_, h_, l_);                                                                     \
    tiles[(hi) + row_ * KS + g_] = h_;                                                          \
    tiles[(lo) + row_ * KS + g_] = l_;                                                          \
  }

// The same rows as f16 alone (rounded to nearest) into tiles[at ..]: the mixed passes' staging.
#define STAGE_F16(buf, at, r0, n, stride, col0, scale)                                                      \
  for (uint e_ = gl_LocalInvocationIndex; e_ < (n) * (D / 8u); e_ += WG) {                                   \
    const uint row_ = e_ / (D / 8u), g_ = e_ % (D / 8u), src_ = (r0) + row_;                                  \
    const uint base_ = (min(src_, u.T - 1u) * (stride) + (col0)) / 4u + 2u * g_;                              \
    const bool ok_ = src_ < u.T;                                                                              \
    const vec4 a_ = ok_ ? (scale) * buf[base_] : vec4(0.0), b_ = ok_ ? (scale) * buf[base_ + 1u] : vec4(0.0); \
    tiles[(at) + row_ * KS + g_] =                                                                            \
        uvec4(packHalf2x16(a_.xy), packHalf2x16(a_.zw), packHalf2x16(b_.xy), packHalf2x16(b_.zw));            \
  }

// v = this lane's HALF columns (half kh) of row r of the 16 x BC f32 block at `at`.
#define GET_ROW(v, at, r, kh)                                                         \
  [[unroll]] for (uint e_ = 0u; e_ < HALF / 4u; ++e_) {                               \
    const vec4 x_ = uintBitsToFloat(tiles[(at) + (r) * SS + (kh) * (HALF / 4u) + e_]); \
    [[unroll]] for (uint c_ = 0u; c_ < 4u; ++c_) v[4u * e_ + c_] = x_[c_];            \
  }

// The same HALF values as f16 hi/lo into row r of the 16 x BC f16 blocks at hi and lo.
#define PUT_SPLIT_ROW(hi, lo, r, kh, v)                                                                    \
  [[unroll]] for (uint e_ = 0u; e_ < HALF / 8u; ++e_) {                                                    \
    uvec4 h_, l_;                                                                                          \
    SPLIT8(vec4(v[8u * e_], v[8u * e_ + 1u], v[8u * e_ + 2u], v[8u * e_ + 3u]),                            \
           vec4(v[8u * e_ + 4u], v[8u * e_ + 5u], v[8u * e_ + 6u], v[8u * e_ + 7u]), h_, l_);              \
    tiles[(hi) + (r) * PS + (kh) * (HALF / 8u) + e_] = h_;                                                 \
    tiles[(lo) + (r) * PS + (kh) * (HALF / 8u) + e_] = l_;                                                 \
  }

// dst[base + (r0 + row)·stride + col0 + 16f + c] = m[f][row][c] for the DF matrices m[f] (STORE_ROWS), or +=
// (ADD_ROWS), for the rows r0 + row before T: straight to memory when all 16 rows are, else through `at` in the
// subgroup's part of tiles (64 uvec4s). STORE_ROWS never reads dst, which may then be writeonly. One edge test
// covers all DF matrices (docs/kernels.md, "Tensor-core attention").
#define NO_OLD_(dst, m, a0_, stride)
#define ADD_OLD_(dst, m, a0_, stride)                                   \
  {                                                                     \
    F32_MAT old_;                                                       \
    coopMatLoadNV(old_, dst, a0_, stride, false);                       \
    [[unroll]] for (int e_ = 0; e_ < m.length(); ++e_) m[e_] += old_[e_]; \
  }
#define STORE_ROWS_(dst, m, base, r0, col0, stride, at, PRE, OLD)                                        \
  if ((r0) + 16u <= u.T) {                                                                               \
    [[unroll]] for (uint f_ = 0u; f_ < DF; ++f_) {                                                       \
      const uint a0_ = (base) + (r0) * (stride) + (col0) + 16u * f_;                                     \
      PRE(dst, m[f_], a0_, stride)                                                                       \
      coopMatStoreNV(m[f_], dst, a0_, stride, false);                                                    \
    }                                                                                                    \
  } else {                                                                                               \
    [[unroll]] for (uint f_ = 0u; f_ < DF; ++f_) {                                                       \
      subgroupBarrier();                                                                                 \
      coopMatStoreNV(m[f_], tiles, at, 4u, false);                                                       \
      subgroupMemoryBarrierShared();                                                                     \
      subgroupBarrier();                                                                                 \
      [[unroll]] for (uint e0_ = 0u; e0_ < 256u; e0_ += 32u) {                                           \
        const uint e_ = e0_ + gl_SubgroupInvocationID, row_ = (r0) + e_ / 16u;                           \
        const uint a_ = (base) + row_ * (stride) + (col0) + 16u * f_ + e_ % 16u;                         \
        if (row_ < u.T) dst[a_] = OLD + uintBitsToFloat(tiles[(at) + e_ / 4u][e_ % 4u]);                 \
      }                                                                                                  \
    }                                                                                                    \
  }
#define STORE_ROWS(dst, m, base, r0, col0, stride, at) STORE_ROWS_(dst, m, base, r0, col0, stride, at, NO_OLD_, 0.0)
#define ADD_ROWS(dst, m, base, r0, col0, stride, at) STORE_ROWS_(dst, m, base, r0, col0, stride, at, ADD_OLD_, dst[a_])
