#version 450
// dX[T, n_in] (+)= dY[T, j_start:j_end] · W[j_start:j_end, :], W in Q4_0, on cooperative matrices: the tiled dx of
// q4_0_dx_gemm.comp with M = T, N = n_in and K = the rows j of W in [k_begin, k_end); a K step of BK = 32 rows
// covers BN / 32 = 4 blocks of each. The block scales d vary along K, so each weight enters as two exact f16 parts:
// d8 (d's top 8 significant bits) and d3 = d - d8, scaled by D3_SCALE = 2^12 so that it is a normal f16 for every
// normal d; d8·(q - 8) and d3·(q - 8) are then exact. dY is scaled per row and split into hi + lo as X is in
// q4_0_coop.glsl; per K slice of 16: acc += dY_hi·W8 + dY_lo·W8, acc3 += dY_hi·W3 (dY_lo·W3 is below f32's
// rounding of the sum). Workgroup, tiles, prefetch and way out as in q4_0_gemm_coop.comp; invocations 0 .. 127
// each fetch a whole block of W. How this design was chosen: docs/kernels.md, "Q4_0 tensor-core dx".
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
layout(std430, binding = 1) readonly buffer A { float a[]; };  // dY, rows of lda floats
layout(std430, binding = 1) readonly buffer A4 { vec4 a4[]; };
// A_SPLIT: dY comes already scaled and split (coop_split_rows.comp with DY, from uvec4 p.ldb on, runs of 8
// from row k_begin on), made once per product instead of once per workgroup along N.
layout(constant_id = 0) const bool A_SPLIT = false;
layout(std430, binding = 2) readonly buffer W { uint w[]; };
// LORA_R > 0: dX also gets dh·A, a LoRA adapter's term (dh [M, LORA_R], A [LORA_R, N], f32 and dense; the
// adapter reads the frozen product's input), added by the workgroups of the first K slice after their main loop
// (lora_term, below); LORA_R <= 32. With LORA_R = 0 bindings 3 and 4 are not read (the host binds any buffers).
layout(constant_id = 1) const uint LORA_R = 0;
layout(std430, binding = 3) readonly buffer DH { float dh[]; };
layout(std430, binding = 4) readonly buffer LA { vec2 la2[]; };
#include "gemm_push.glsl"
#define Q4_0_WORDS w
#include "q4_0.glsl"
#include "f16_split.glsl"

const uint NT = 32u * SG_M * SG_N, BM = 32u * SG_M, BN = 32u * SG_N, BK = 32u, FN = 2u;
const uint NBLK = BN / 32u;                 // blocks per row of the W tile
const uint DY_ROW_STRIDE = BK / 8u + 1u;    // dY tile row stride in uvec4s: 32 halves and one of padding
const uint W_ROW_STRIDE = BN / 8u + 1u;     // W tile row stride: 128 halves and one of padding
const uint A_HI = 0u, A_LO = BM * DY_ROW_STRIDE, B_8 = 2u * BM * DY_ROW_STRIDE, B_3 = B_8 + BK * W_ROW_STRIDE;
const uint DY_RUNS_PER_INVOCATION = BM * BK / 8u / NT;  // runs of 8 dY values per invocation and step (1)
const uint W_BLOCKS = BK * NBLK;            // blocks of W per step: invocations 0 .. W_BLOCKS - 1 take one
const float D3_SCALE = 4096.0;
#define F32_MAT fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16_MAT fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

// The tiles: dY hi [m][k], dY lo [m][k], W8 [k][n], W3 [k][n] (row-major: a row of W is contiguous in n).
shared uvec4 tiles[2u * BM * DY_ROW_STRIDE + 2u * BK * W_ROW_STRIDE];
shared float row_scale[BM], row_unscale[BM];
shared float lora_unscale[BM + 1u];  // per row of dh: 1 / its power-of-two scale; then A's tile's
shared float lora_max[NT / 32u];

vec4 dy_prefetch[DY_RUNS_PER_INVOCATION][2];
uint w_prefetch[5];    // the 5 words that hold this invocation's block
bool starts_mid_word;  // the block starts mid-word

// s_m for rows m0 .. m0 + BM of dY over the K range (any alignment: scalar loads): the row's largest |value|
// brought near 2^13, as find_row_scales in q4_0_coop.glsl. Needs a barrier before row_scale is read.
void dy_row_scales(uint m0, uint k_first, uint k_last) {
  const uint lane = gl_SubgroupInvocationID;
  for (uint r0 = gl_SubgroupID * 8u; r0 < BM; r0 += 8u * gl_NumSubgroups) {
    float amax[8];
    [[unroll]] for (uint r = 0u; r < 8u; ++r) amax[r] = 0.0;
    for (uint k = k_first + lane; k < k_last; k += gl_SubgroupSize)
      [[unroll]] for (uint r = 0u; r < 8u; ++r) {
        const uint row = min(m0 + r0 + r, p.M - 1u);  // rows past M: any row; their dY is never used
        amax[r] = max(amax[r], abs(a[row * p.lda + k]));
      }
    [[unroll]] for (uint r = 0u; r < 8u; ++r) {
      const float v = subgroupMax(amax[r]);
      if (subgroupElect()) {
        const int e = split_scale_exponent(v);
        row_scale[r0 + r] = ldexp(1.0, e);
        row_unscale[r0 + r] = ldexp(1.0, -e);
      }
    }
  }
}

void fetch(uint m0, uint n0, uint k0, uint k_last, uint n_blocks) {
  const uint t = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < DY_RUNS_PER_INVOCATION; ++i) {
    const uint idx = t + NT * i, m = idx / (BK / 8u), g = idx % (BK / 8u);
    const uint k = k0 + 8u * g;
    const bool row_ok = m0 + m < p.M;
    if (A_SPLIT) {
      const uint runs = (p.k_end - p.k_begin + 7u) / 8u;
      const uint base = p.ldb + 2u * ((m0 + m) * runs + (k - p.k_begin) / 8u);  // the (hi, lo) pair
      dy_prefetch[i][0] = row_ok && k < k_last ? a4[base] : vec4(0.0);
      dy_prefetch[i][1] = row_ok && k < k_last ? a4[base + 1u] : vec4(0.0);
    } else {
      const uint base = (m0 + m) * p.lda + k;
      float v[8];
      [[unroll]] for (uint e = 0u; e < 8u; ++e) v[e] = row_ok && k + e < k_last ? a[base + e] : 0.0;
      dy_prefetch[i][0] = vec4(v[0], v[1], v[2], v[3]);
      dy_prefetch[i][1] = vec4(v[4], v[5], v[6], v[7]);
    }
  }
  if (t < W_BLOCKS) {
    const uint r = t / NBLK, b = n0 / 32u + t % NBLK;
    const uint B = (k0 + r) * n_blocks + b, wa = (B * Q4_0_BLOCK_BYTES) >> 2u;
    const bool ok = k0 + r < k_last && b < n_blocks;
    [[unroll]] for (uint e = 0u; e < 5u; ++e) w_prefetch[e] = ok ? w[wa + e] : 0x88888888u;  // codes 0
    if (!ok) w_prefetch[0] = 0u;                                                            // scale 0 (either half)
    starts_mid_word = (B & 1u) == 0u;  // even block: scale in the low half of its first word, quants from byte 2 on
  }
}

// Two f16 codes q - 8 from the nibbles at bits s..s+3 and s+8..s+11 of v (neighbouring bytes: positions in order).
f16vec2 codes_pair(uint v, uint s) {
  const uint biased = ((v >> s) & 0x0000000Fu) | (((v >> (s + 8u)) & 0x0000000Fu) << 16u) | 0x64006400u;
  return unpackFloat2x16(biased) - f16vec2(1032.0hf);  // 1024 + q, minus 1032
}

void stash() {
  const uint t = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < DY_RUNS_PER_INVOCATION; ++i) {
    const uint idx = t + NT * i, m = idx / (BK / 8u), g = idx % (BK / 8u);
    uvec4 hi = floatBitsToUint(dy_prefetch[i][0]), lo = floatBitsToUint(dy_prefetch[i][1]);
    if (!A_SPLIT) split8_in_order(dy_prefetch[i][0] * row_scale[m], dy_prefetch[i][1] * row_scale[m], hi, lo);
    tiles[A_HI + m * DY_ROW_STRIDE + g] = hi;
    tiles[A_LO + m * DY_ROW_STRIDE + g] = lo;
  }
  if (t < W_BLOCKS) {
    const uint r = t / NBLK, blk = t % NBLK;
    uint q[4];
    [[unroll]] for (uint e = 0u; e < 4u; ++e)
      q[e] = starts_mid_word ? (w_prefetch[e] >> 16u) | (w_prefetch[e + 1u] << 16u) : w_prefetch[e + 1u];
    // d = d8 + d3: d8 keeps the top 8 significant bits (3 low mantissa bits cleared), d3 the rest, scaled.
    const uint dbits = (starts_mid_word ? w_prefetch[0] : w_prefetch[0] >> 16u) & 0xFFFFu;
    const float d = unpackHalf2x16(dbits).x, d8 = unpackHalf2x16(dbits & 0xFFF8u).x;
    const f16vec2 s8 = f16vec2(float16_t(d8)), s3 = f16vec2(float16_t((d - d8) * D3_SCALE));
    [[unroll]] for (uint h = 0u; h < 2u; ++h) {
      const uint q0 = q[2u * h], q1 = q[2u * h + 1u];
      // Low nibbles: block positions 8h .. 8h + 7; high nibbles: 16 + 8h .. 16 + 8h + 7.
      f16vec2 cl[4] = {codes_pair(q0, 0u), codes_pair(q0, 16u), codes_pair(q1, 0u), codes_pair(q1, 16u)};
      f16vec2 ch[4] = {codes_pair(q0, 4u), codes_pair(q0, 20u), codes_pair(q1, 4u), codes_pair(q1, 20u)};
      uvec4 l8, l3, h8, h3;
      [[unroll]] for (uint e = 0u; e < 4u; ++e) {
        l8[e] = packFloat2x16(cl[e] * s8);
        l3[e] = packFloat2x16(cl[e] * s3);
        h8[e] = packFloat2x16(ch[e] * s8);
        h3[e] = packFloat2x16(ch[e] * s3);
      }
      const uint o = r * W_ROW_STRIDE + blk * 4u + h;  // uvec4 of positions 8h .. 8h + 7 of block blk in row r
      tiles[B_8 + o] = l8;
      tiles[B_3 + o] = l3;
      tiles[B_8 + o + 2u] = h8;
      tiles[B_3 + o + 2u] = h3;
    }
  }
}

// The adapter's term of the workgroup's tile: L = dh·A for rows m0.. and columns n0.. as split f16 products, as
// in q4_0_gemm_coop.comp: each row of dh scaled by its own power of two, A's tile [K, BN] by one, both cut into hi
// + lo; L = dh_hi·A_hi + dh_lo·A_hi + dh_hi·A_lo, K = LORA_R padded to a multiple of 16 with zeros. Called after
// the main loop's last barrier (the tiles are free); ends with one.
const uint LR16 = (LORA_R + 15u) / 16u, LK = LR16 == 0u ? 16u : 16u * LR16;
const uint LS = 2u * LR16 + 1u;  // dh staging row stride (uvec4s)
const uint PAIRS = LK * BN / 2u, PAIRS_PER_INVOCATION = (PAIRS + NT - 1u) / NT;  // A's tile as pairs of columns
void lora_term(uint m0, uint n0, uint sm, uint sn, inout F32_MAT acc[2][FN]) {
  const uint t = gl_LocalInvocationID.x;
  const uint H_HI = 0u, H_LO = BM * LS, L_HI = 2u * BM * LS, L_LO = L_HI + LK * W_ROW_STRIDE;
  if (t < BM) {  // row t of dh
    const uint row = m0 + t;
    float v[LK];
    float vmax = 0.0;
    [[unroll]] for (uint k = 0u; k < LK; ++k) {
      v[k] = row < p.M && k < LORA_R ? dh[row * LORA_R + k] : 0.0;
      vmax = max(vmax, abs(v[k]));
    }
    const int e = split_scale_exponent(vmax);
    const float sc = ldexp(1.0, e);
    lora_unscale[t] = ldexp(1.0, -e);
    [[unroll]] for (uint k = 0u; k < LK; k += 8u) {
      uvec4 hi, lo;
      split8_in_order(vec4(v[k], v[k + 1u], v[k + 2u], v[k + 3u]) * sc,
                      vec4(v[k + 4u], v[k + 5u], v[k + 6u], v[k + 7u]) * sc, hi, lo);
      tiles[H_HI + t * LS + k / 8u] = hi;
      tiles[H_LO + t * LS + k / 8u] = lo;
    }
  }
  // A's tile, two columns per pair: pair q is row q / (BN / 2), columns 2 (q % (BN / 2)) and one more.
  vec2 pv[PAIRS_PER_INVOCATION];
  float amax = 0.0;
  [[unroll]] for (uint i = 0u; i < PAIRS_PER_INVOCATION; ++i) {
    const uint q = t + NT * i, k = q / (BN / 2u), col = n0 + 2u * (q % (BN / 2u));
    pv[i] = q < PAIRS && k < LORA_R && col < p.N ? la2[(k * p.N + col) / 2u] : vec2(0.0);
    amax = max(amax, max(abs(pv[i].x), abs(pv[i].y)));
  }
  amax = subgroupMax(amax);
  if (subgroupElect()) lora_max[gl_SubgroupID] = amax;
  barrier();
  amax = 0.0;
  [[unroll]] for (uint i = 0u; i < NT / 32u; ++i) amax = max(amax, lora_max[i]);
  const int e = split_scale_exponent(amax);
  const float sc = ldexp(1.0, e);
  if (t == 0u) lora_unscale[BM] = ldexp(1.0, -e);
  [[unroll]] for (uint i = 0u; i < PAIRS_PER_INVOCATION; ++i) {
    const uint q = t + NT * i, k = q / (BN / 2u), cp = q % (BN / 2u);
    if (q >= PAIRS) break;
    const vec2 v = pv[i] * sc;
    const vec2 hi = uintBitsToFloat(floatBitsToUint(v) & 0xFFFFE000u);
    tiles[L_HI + k * W_ROW_STRIDE + cp / 4u][cp % 4u] = packHalf2x16(hi);
    tiles[L_LO + k * W_ROW_STRIDE + cp / 4u][cp % 4u] = packHalf2x16(v - hi);
  }
  barrier();
  F32_MAT l[2][FN];
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) l[i][j] = F32_MAT(0.0);
  [[unroll]] for (uint kk = 0u; kk < LR16; ++kk) {
    F16_MAT hh[2], hl[2], ah[FN], al[FN];
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
      coopMatLoadNV(hh[i], tiles, H_HI + (sm * 32u + 16u * i) * LS + 2u * kk, LS, false);
      coopMatLoadNV(hl[i], tiles, H_LO + (sm * 32u + 16u * i) * LS + 2u * kk, LS, false);
    }
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      coopMatLoadNV(ah[j], tiles, L_HI + 16u * kk * W_ROW_STRIDE + (sn * 32u + 16u * j) / 8u, W_ROW_STRIDE, false);
      coopMatLoadNV(al[j], tiles, L_LO + 16u * kk * W_ROW_STRIDE + (sn * 32u + 16u * j) / 8u, W_ROW_STRIDE, false);
    }
    [[unroll]] for (uint i = 0u; i < 2u; ++i)
      [[unroll]] for (uint j = 0u; j < FN; ++j) {
        l[i][j] = coopMatMulAddNV(hh[i], ah[j], l[i][j]);
        l[i][j] = coopMatMulAddNV(hl[i], ah[j], l[i][j]);
        l[i][j] = coopMatMulAddNV(hh[i], al[j], l[i][j]);
      }
  }
  const float fa = lora_unscale[BM];
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    F32_MAT fm;
    coopMatLoadNV(fm, lora_unscale, sm * 32u + 16u * i, 0u, true);  // row m: its factor
    [[unroll]] for (uint j = 0u; j < FN; ++j)
      [[unroll]] for (int e2 = 0; e2 < acc[i][j].length(); ++e2) acc[i][j][e2] += l[i][j][e2] * fm[e2] * fa;
  }
  barrier();  // every subgroup is done with the tiles
}

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint sm = sg / SG_N, sn = sg % SG_N;  // this subgroup's corner: rows sm*32.., columns sn*32..
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint n_blocks = p.N / 32u;
  // Split K (p.k_slice != 0, a multiple of BK): workgroup z sums its slice of rows only and writes it, without
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
    const uint runs = (p.k_end - p.k_begin + 7u) / 8u;
    for (uint m = gl_LocalInvocationID.x; m < BM; m += NT)
      row_unscale[m] = a[4u * (p.ldb + 2u * p.M * runs) + min(m0 + m, p.M - 1u)];
  } else {
    dy_row_scales(m0, k_first, k_last);
  }

  F32_MAT acc[2][FN], acc3[2][FN];
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      acc[i][j] = F32_MAT(0.0);
      acc3[i][j] = F32_MAT(0.0);
    }

  fetch(m0, n0, k_first, k_last, n_blocks);
  barrier();  // row_scale
  stash();
  barrier();
  for (uint k0 = k_first; k0 < k_last; k0 += BK) {
    const bool more = k0 + BK < k_last;
    if (more) fetch(m0, n0, k0 + BK, k_last, n_blocks);
    [[unroll]] for (uint kk = 0u; kk < BK / 16u; ++kk) {  // K slices of 16: dY uvec4 offset 2kk, W row 16kk
      F16_MAT xh[2], xl[2], b8[FN], b3[FN];
      [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        coopMatLoadNV(xh[i], tiles, A_HI + (sm * 32u + 16u * i) * DY_ROW_STRIDE + 2u * kk, DY_ROW_STRIDE, false);
        coopMatLoadNV(xl[i], tiles, A_LO + (sm * 32u + 16u * i) * DY_ROW_STRIDE + 2u * kk, DY_ROW_STRIDE, false);
      }
      [[unroll]] for (uint j = 0u; j < FN; ++j) {
        coopMatLoadNV(b8[j], tiles, B_8 + 16u * kk * W_ROW_STRIDE + (sn * 32u + 16u * j) / 8u, W_ROW_STRIDE, false);
        coopMatLoadNV(b3[j], tiles, B_3 + 16u * kk * W_ROW_STRIDE + (sn * 32u + 16u * j) / 8u, W_ROW_STRIDE, false);
      }
      [[unroll]] for (uint i = 0u; i < 2u; ++i)
        [[unroll]] for (uint j = 0u; j < FN; ++j) {
          acc[i][j] = coopMatMulAddNV(xh[i], b8[j], acc[i][j]);
          acc[i][j] = coopMatMulAddNV(xl[i], b8[j], acc[i][j]);
          acc3[i][j] = coopMatMulAddNV(xh[i], b3[j], acc3[i][j]);
        }
    }
    barrier();  // every subgroup is done with the tiles
    if (more) {
      stash();
      barrier();
    }
  }

  // dX (+)= (acc + acc3 / D3_SCALE) / s_m (+ the adapter's term), out as in q4_0_gemm_coop.comp.
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    F32_MAT u;
    coopMatLoadNV(u, row_unscale, sm * 32u + 16u * i, 0u, true);  // column-major, stride 0: u[m][n] = 1 / s_m
    [[unroll]] for (uint j = 0u; j < FN; ++j)
      [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e)
        acc[i][j][e] = (acc[i][j][e] + acc3[i][j][e] * (1.0 / D3_SCALE)) * u[e];
  }
  if (LORA_R > 0u && gl_WorkGroupID.z == 0u) lora_term(m0, n0, sm, sn, acc);
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
