#version 450
// Y[T, n_out] = X[T, n_in] · Wᵀ, W in Q4_0, on cooperative matrices (VK_NV_cooperative_matrix: 16x16x16, f16
// inputs, f32 accumulators). M = T, N = n_out, K = n_in; W's rows from p.row0 on (a vocabulary tile of the loss).
// Numerics at f32 level (q4_0_coop.glsl): X scaled per row and split into f16 hi + lo, 2 products per step; W as its
// exact codes q - 8, each block's scale d applied to the f32 partial product (a matrix loaded with row stride 0).
// 256 invocations = 8 subgroups of 32; tile BM x BN = 64 x 128, each subgroup a 32 x 32 corner of 2 x 2
// accumulators; K steps of BK = 32·NB (NB blocks of every row); every loop over matrices unrolled. Each invocation
// fetches its activations and whole blocks of W (the 5 words of each) into registers before the products of the
// step before, and stashes them into the tiles after. LORA_R > 0 adds an adapter's hs·Bᵀ in the same pass.
// How this design was chosen, with its measurements: docs/kernels.md, "Q4_0 tensor-core GEMM".
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#define SG_M 2u  // subgroups along M
#define SG_N 4u  // ... and along N
layout(local_size_x = 32u * SG_M * SG_N) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { vec4 a4[]; };
layout(std430, binding = 1) readonly buffer AF { float af[]; };
// A_SPLIT: A comes already scaled and split (coop_split_rows.comp, from uvec4 p.ldb on, rows of p.lda values),
// made once per product instead of once per workgroup along N (linear_kernels.cpp: kCoopSplitAMinTilesN).
layout(constant_id = 0) const bool A_SPLIT = false;
layout(std430, binding = 2) readonly buffer W { uint w[]; };
// LORA_R > 0: C also gets hs·Bᵀ, a LoRA adapter's term (hs [M, LORA_R], B [N, LORA_R], both f32 and dense), added
// by the workgroups of the first K slice after their main loop (lora_term, below); LORA_R <= 32. With LORA_R = 0
// bindings 3 and 4 are not read (the host binds any buffers there).
layout(constant_id = 1) const uint LORA_R = 0;
layout(std430, binding = 3) readonly buffer HS { float hs[]; };
layout(std430, binding = 4) readonly buffer LB { float lb[]; };
#include "gemm_push.glsl"
#define Q4_0_WORDS w
#include "q4_0.glsl"
#define BM (32u * SG_M)
#include "q4_0_coop.glsl"

const uint NB = 2u;  // Q4_0 blocks of every row per K step
const uint NT = 32u * SG_M * SG_N, BN = 32u * SG_N, BK = 32u * NB, FN = 2u;
const uint X_RUNS = BM * BK / 8u, W_BLOCKS = BN * NB;  // per step: runs of 8 activations, blocks of W
const uint X_RUNS_PER_INVOCATION = (X_RUNS + NT - 1u) / NT, W_BLOCKS_PER_INVOCATION = (W_BLOCKS + NT - 1u) / NT;
const uint ROW_STRIDE = BK / 8u + 1u;  // tile row stride in uvec4s (one of padding: conflict-free matrix loads)
// The tiles: X hi [m][k], X lo [m][k], codes [n][k]. After the loop, each subgroup's 16 x 16 f32 output staging.
const uint A_HI = 0u, A_LO = BM * ROW_STRIDE, B_Q = 2u * BM * ROW_STRIDE;
#define F32_MAT fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16_MAT fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

shared uvec4 tiles[2u * BM * ROW_STRIDE + BN * ROW_STRIDE];
shared float block_scales[NB * BN];  // the step's block scales [block][n]
shared float lora_unscale[BM + BN];  // per row of hs (m) and of B (n): 1 / its power-of-two scale

// Prefetch registers (the shifts that need loaded values wait until stash(), so fetch() issues its loads and
// moves on): per invocation, its runs of 8 activations and its blocks of W (the 5 words that hold each).
vec4 x_prefetch[X_RUNS_PER_INVOCATION][2];
uint w_prefetch[W_BLOCKS_PER_INVOCATION][5];
uint starts_mid_word;  // bit i: the invocation's block i starts mid-word

void fetch(uint m0, uint n0, uint k0, uint k_last, uint n_blocks) {
  const uint t = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < X_RUNS_PER_INVOCATION; ++i) {
    const uint idx = t + NT * i, m = idx / (BK / 8u), g = idx % (BK / 8u);
    const bool ok = idx < X_RUNS && m0 + m < p.M && k0 + 8u * g < k_last;
    const uint base = A_SPLIT ? p.ldb + 2u * ((m0 + m) * (p.lda / 8u) + k0 / 8u + g)  // the (hi, lo) pair
                              : ((m0 + m) * p.lda + k0) / 4u + 2u * g;                  // 8 floats
    x_prefetch[i][0] = ok ? a4[base] : vec4(0.0);
    x_prefetch[i][1] = ok ? a4[base + 1u] : vec4(0.0);
  }
  starts_mid_word = 0u;
  [[unroll]] for (uint i = 0u; i < W_BLOCKS_PER_INVOCATION; ++i) {
    const uint idx = t + NT * i, r = idx / NB, blk = idx % NB;
    const uint kb = k0 / 32u + blk;
    if (idx < W_BLOCKS && n0 + r < p.N && kb < k_last / 32u) {
      const uint B = (p.row0 + n0 + r) * n_blocks + kb, wa = (B * Q4_0_BLOCK_BYTES) >> 2u;
      [[unroll]] for (uint e = 0u; e < 5u; ++e) w_prefetch[i][e] = w[wa + e];
      if ((B & 1u) == 0u) starts_mid_word |= 1u << i;  // even block: scale in the low half of its first word
    } else {
      [[unroll]] for (uint e = 0u; e < 5u; ++e) w_prefetch[i][e] = 0x88888888u;  // codes 0
      w_prefetch[i][0] = 0u;                                                        // scale 0 (either half)
      w_prefetch[i][1] = 0x88888888u;
    }
  }
}

void stash() {
  const uint t = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < X_RUNS_PER_INVOCATION; ++i) {
    const uint idx = t + NT * i, m = idx / (BK / 8u), g = idx % (BK / 8u);
    if (idx >= X_RUNS) break;
    uvec4 hi = floatBitsToUint(x_prefetch[i][0]), lo = floatBitsToUint(x_prefetch[i][1]);
    if (!A_SPLIT) split8(x_prefetch[i][0] * row_scale[m], x_prefetch[i][1] * row_scale[m], hi, lo);
    tiles[A_HI + m * ROW_STRIDE + g] = hi;
    tiles[A_LO + m * ROW_STRIDE + g] = lo;
  }
  [[unroll]] for (uint i = 0u; i < W_BLOCKS_PER_INVOCATION; ++i) {
    const uint idx = t + NT * i, r = idx / NB, blk = idx % NB;
    if (idx >= W_BLOCKS) break;
    const bool mid = ((starts_mid_word >> i) & 1u) != 0u;  // quants from byte 2 of the first word on
    uint q[4];
    [[unroll]] for (uint e = 0u; e < 4u; ++e)
      q[e] = mid ? (w_prefetch[i][e] >> 16u) | (w_prefetch[i][e + 1u] << 16u) : w_prefetch[i][e + 1u];
    const uint o = B_Q + r * ROW_STRIDE + 4u * blk;
    [[unroll]] for (uint h = 0u; h < 2u; ++h) {
      const uint q0 = q[2u * h], q1 = q[2u * h + 1u];
      tiles[o + h] = uvec4(codes2(q0, 0u), codes2(q0, 8u), codes2(q1, 0u), codes2(q1, 8u));
      tiles[o + 2u + h] = uvec4(codes2(q0, 4u), codes2(q0, 12u), codes2(q1, 4u), codes2(q1, 12u));
    }
    block_scales[blk * BN + r] = unpackHalf2x16(mid ? w_prefetch[i][0] : w_prefetch[i][0] >> 16u).x;
  }
}

// The adapter's term of the workgroup's tile: L = hs·Bᵀ for rows m0.. and columns n0.. as split f16 products.
// Each row of hs and each row of B is scaled by its own power of two (its largest |value| near 2^13, as
// find_row_scales) and cut into hi + lo (split8); L = hs_hi·B_hi + hs_lo·B_hi + hs_hi·B_lo, K = LORA_R padded to
// a multiple of 16 with zeros, and each entry of L is scaled back by its row's and column's factors. Rows past M
// and columns past N are zeros. Called after the main loop's last barrier (the tiles are free); ends with one.
const uint LR16 = (LORA_R + 15u) / 16u, LS = 2u * LR16 + 1u;  // 16s of K; staging row stride (uvec4s)
const uint LK = LR16 == 0u ? 16u : 16u * LR16;                 // K padded (16 when unused: no empty arrays)
void lora_term(uint m0, uint n0, uint sm, uint sn, inout F32_MAT acc[2][FN]) {
  const uint t = gl_LocalInvocationID.x;
  // Invocations 0..BM-1 stage row t of hs, BM..BM+BN-1 row t - BM of B (hi rows, then lo rows past them).
  if (t < BM + BN) {
    const bool is_h = t < BM;
    const uint row = is_h ? m0 + t : n0 + t - BM;
    const bool ok = row < (is_h ? p.M : p.N);
    float v[LK];
    float vmax = 0.0;
    [[unroll]] for (uint k = 0u; k < LK; ++k) {
      v[k] = ok && k < LORA_R ? (is_h ? hs[row * LORA_R + k] : lb[row * LORA_R + k]) : 0.0;
      vmax = max(vmax, abs(v[k]));
    }
    const int e = split_scale_exponent(vmax);
    const float sc = ldexp(1.0, e);
    lora_unscale[t] = ldexp(1.0, -e);
    const uint hi0 = is_h ? t * LS : 2u * BM * LS + (t - BM) * LS;
    const uint lo0 = hi0 + (is_h ? BM * LS : BN * LS);
    [[unroll]] for (uint k = 0u; k < LK; k += 8u) {
      uvec4 hi, lo;
      split8_in_order(vec4(v[k], v[k + 1u], v[k + 2u], v[k + 3u]) * sc,
                      vec4(v[k + 4u], v[k + 5u], v[k + 6u], v[k + 7u]) * sc, hi, lo);
      tiles[hi0 + k / 8u] = hi;
      tiles[lo0 + k / 8u] = lo;
    }
  }
  barrier();
  const uint H_HI = 0u, H_LO = BM * LS, B_HI = 2u * BM * LS, B_LO = 2u * BM * LS + BN * LS;
  F32_MAT l[2][FN];
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) l[i][j] = F32_MAT(0.0);
  [[unroll]] for (uint kk = 0u; kk < LR16; ++kk) {
    F16_MAT hh[2], hl[2], bh[FN], bl[FN];
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
      coopMatLoadNV(hh[i], tiles, H_HI + (sm * 32u + 16u * i) * LS + 2u * kk, LS, false);
      coopMatLoadNV(hl[i], tiles, H_LO + (sm * 32u + 16u * i) * LS + 2u * kk, LS, false);
    }
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      coopMatLoadNV(bh[j], tiles, B_HI + (sn * 32u + 16u * j) * LS + 2u * kk, LS, true);
      coopMatLoadNV(bl[j], tiles, B_LO + (sn * 32u + 16u * j) * LS + 2u * kk, LS, true);
    }
    [[unroll]] for (uint i = 0u; i < 2u; ++i)
      [[unroll]] for (uint j = 0u; j < FN; ++j) {
        l[i][j] = coopMatMulAddNV(hh[i], bh[j], l[i][j]);
        l[i][j] = coopMatMulAddNV(hl[i], bh[j], l[i][j]);
        l[i][j] = coopMatMulAddNV(hh[i], bl[j], l[i][j]);
      }
  }
  // Row factors as a matrix loaded column-major with stride 0 (row m: its factor), column factors row-major.
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    F32_MAT fm;
    coopMatLoadNV(fm, lora_unscale, sm * 32u + 16u * i, 0u, true);
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      F32_MAT fn;
      coopMatLoadNV(fn, lora_unscale, BM + sn * 32u + 16u * j, 0u, false);
      [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e) acc[i][j][e] += l[i][j][e] * fm[e] * fn[e];
    }
  }
  barrier();  // every subgroup is done with the tiles
}

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint sm = sg / SG_N, sn = sg % SG_N;  // this subgroup's corner: rows sm*32.., columns sn*32..
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint n_blocks = p.k_end / 32u;  // W's row length (k_begin is 0)
  // Split K (p.k_slice != 0, a multiple of BK): workgroup z sums its slice only and writes it, without
  // accumulating, to slice z of C (then [slices, M, N]); q4_0_dx_reduce.comp adds the slices in order.
  uint k_first = p.k_begin, k_last = p.k_end, c0 = 0u;
  bool add_to_c = p.accumulate != 0u;
  if (p.k_slice != 0u) {
    k_first = p.k_begin + gl_WorkGroupID.z * p.k_slice;
    k_last = min(p.k_end, k_first + p.k_slice);
    c0 = gl_WorkGroupID.z * p.M * p.N;
    add_to_c = false;
  }

  if (A_SPLIT) {
    for (uint m = gl_LocalInvocationID.x; m < BM; m += NT)
      row_unscale[m] = af[4u * p.ldb + p.M * p.lda + min(m0 + m, p.M - 1u)];
  } else {
    find_row_scales(m0, p.M, p.lda, k_first, k_last);
  }

  F32_MAT acc[2][FN];
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) acc[i][j] = F32_MAT(0.0);

  fetch(m0, n0, k_first, k_last, n_blocks);
  barrier();  // row_scale
  stash();
  barrier();
  for (uint k0 = k_first; k0 < k_last; k0 += BK) {
    const bool more = k0 + BK < k_last;
    if (more) fetch(m0, n0, k0 + BK, k_last, n_blocks);
    [[unroll]] for (uint blk = 0u; blk < NB; ++blk) {
      F32_MAT part[2][FN];
      [[unroll]] for (uint i = 0u; i < 2u; ++i)
        [[unroll]] for (uint j = 0u; j < FN; ++j) part[i][j] = F32_MAT(0.0);
      [[unroll]] for (uint kk = 0u; kk < 4u; kk += 2u) {  // two K slices of 16: uvec4 offsets 0 and 2
        F16_MAT xh[2], xl[2], b[FN];
        [[unroll]] for (uint i = 0u; i < 2u; ++i) {
          coopMatLoadNV(xh[i], tiles, A_HI + (sm * 32u + 16u * i) * ROW_STRIDE + 4u * blk + kk, ROW_STRIDE, false);
          coopMatLoadNV(xl[i], tiles, A_LO + (sm * 32u + 16u * i) * ROW_STRIDE + 4u * blk + kk, ROW_STRIDE, false);
        }
        [[unroll]] for (uint j = 0u; j < FN; ++j)
          coopMatLoadNV(b[j], tiles, B_Q + (sn * 32u + 16u * j) * ROW_STRIDE + 4u * blk + kk, ROW_STRIDE, true);
        [[unroll]] for (uint i = 0u; i < 2u; ++i)
          [[unroll]] for (uint j = 0u; j < FN; ++j) {
            part[i][j] = coopMatMulAddNV(xh[i], b[j], part[i][j]);
            part[i][j] = coopMatMulAddNV(xl[i], b[j], part[i][j]);
          }
      }
      [[unroll]] for (uint j = 0u; j < FN; ++j) {
        F32_MAT d;
        coopMatLoadNV(d, block_scales, blk * BN + sn * 32u + 16u * j, 0u, false);  // stride 0: 16 equal rows
        [[unroll]] for (uint i = 0u; i < 2u; ++i)
          [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e) acc[i][j][e] += part[i][j][e] * d[e];
      }
    }
    barrier();  // every subgroup is done with the tiles
    if (more) {
      stash();
      barrier();
    }
  }

  // C (+)= acc / s_m (+ the adapter's term). The 1 / s_m enter as a matrix loaded column-major with stride 0 (row
  // m: row_unscale[m]).
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    F32_MAT u;
    coopMatLoadNV(u, row_unscale, sm * 32u + 16u * i, 0u, true);
    [[unroll]] for (uint j = 0u; j < FN; ++j)
      [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e) acc[i][j][e] *= u[e];
  }
  if (LORA_R > 0u && gl_WorkGroupID.z == 0u) lora_term(m0, n0, sm, sn, acc);
  // A tile inside C goes straight to memory (rows 16-byte aligned: N a multiple of 4); edge tiles go through
  // the subgroup's staging tile (the tiles are free after the loop's last barrier), in a loop unrolled in full:
  // the way out decides how fast the main loop runs (a `continue` here put the shader in local memory).
  if (m0 + BM <= p.M && n0 + BN <= p.N && p.N % 4u == 0u) {
    [[unroll]] for (uint i = 0u; i < 2u; ++i)
      [[unroll]] for (uint j = 0u; j < FN; ++j) {
        const uint idx = c0 + (m0 + sm * 32u + 16u * i) * p.N + n0 + sn * 32u + 16u * j;
        if (add_to_c) {
          F32_MAT old;
          coopMatLoadNV(old, c, idx, p.N, false);
          [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e) acc[i][j][e] += old[e];
        }
        coopMatStoreNV(acc[i][j], c, idx, p.N, false);
      }
    return;
  }
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      coopMatStoreNV(acc[i][j], tiles, sg * 64u, 4u, false);  // 16 rows of 4 uvec4s
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
        const uint e = e0 + lane;
        const uint ml = sm * 32u + 16u * i + e / 16u, n = n0 + sn * 32u + 16u * j + e % 16u;
        const uint idx = c0 + (m0 + ml) * p.N + n;
        const float v = uintBitsToFloat(tiles[sg * 64u + e / 4u][e % 4u]);
        if (m0 + ml < p.M && n < p.N) c[idx] = (add_to_c ? c[idx] : 0.0) + v;
      }
      subgroupBarrier();
    }
}
