#version 450
// The mixed-precision GEMM of every frozen weight format: f16 inputs, f32 accumulation.
//   forward (default): C[M, N] (+)= s_m · A[M, K] · W[w_row0 + n, k]ᵀ    (K = n_in: Y = X·Wᵀ)
//   NN (dx):           C[M, N] (+)= s_m · A[M, K] · W[w_row0 + k, n]      (N = n_in: dX = dY·W over K rows of W)
// W_PANELS: W is F16 in the same k-panels (decode_f16.comp's output for a decoded product).
// A is f16 in k-panels (rows_to_f16.comp): panel q holds columns 32q .. 32q + 31 of every row, 64 bytes a row, so
// the A tile of a K step is one contiguous piece of memory; each row is scaled by a power of two, s_m its inverse
// (without scales, s_m = 1). W is read in 32-weight units that the format decodes to f16 (wunit.glsl); nothing
// else here knows the format. Rows of W past the product (NN: k >= K) and columns past N count as zeros.
// The design and its measurements: docs/mixed-precision.md.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
// COOP: the products on cooperative matrices (VK_NV_cooperative_matrix, 16x16x16, subgroups of 32). Without it,
// the same tiles feed FP32 FMAs (each invocation a few rows and columns): the portable twin, so that every
// device computes the same function, and lavapipe tests the staging and decoding that the tensor cores read.
// COOP_KHR (with COOP): the same products on VK_KHR_cooperative_matrix, through the rewrite of the SPIR-V.
#ifdef COOP
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

// Workgroups of WARPS_M x WARPS_N groups of 32 invocations, each group owning FRAGS_M x FRAGS_N 16 x 16 tiles of
// C; the workgroup tile is BM x BN, K steps of BK = 32 through two shared stages. The loads of step s + 2 are
// issued while step s multiplies, into one of two register sets, and decoded into the free stage a step later, so
// a load has a whole step to arrive; one barrier per step. Workgroup x walks M, y walks N, so the workgroups that
// run together share W's tile (each W byte comes from memory about once) and re-read A, which is small, from
// cache.
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#ifndef FRAGS_M
#define FRAGS_M 4
#endif
#ifndef FRAGS_N
#define FRAGS_N 2
#endif
#ifndef BK_STEP
#define BK_STEP 32
#endif
const uint NT = 32u * WARPS_M * WARPS_N;
const uint BM = 16u * FRAGS_M * WARPS_M, BN = 16u * FRAGS_N * WARPS_N, BK = uint(BK_STEP);
layout(local_size_x = NT) in;

layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A4 { uvec4 a4[]; };
layout(std430, binding = 1) readonly buffer AF { float af[]; };
layout(std430, binding = 2) readonly buffer W1 { uint wq1[]; };
layout(std430, binding = 2) readonly buffer W4 { uvec4 wq4[]; };

layout(push_constant) uniform Push {
  uint M, N, K;
  uint a_rows;    // the rows of A's panels (at least M): panel q starts at uvec4 a_base + 4·q·a_rows
  uint a_base;    // A's first uvec4 in binding 1
  uint s_base;    // the row factors s_m: floats s_base .. s_base + M of binding 1; kNoScales: none
  uint ldc;       // C's row stride in floats
  uint accumulate;
  uint k_slice;   // 0, or split K: workgroup z sums [z·k_slice, +k_slice) into C + z·M·ldc, without accumulating
  uint w_row0;    // W's row for n = 0 (forward) or k = 0 (NN)
  uint w_cols;    // W's row length n_in
  uint w_base;    // W_PANELS: W's first uvec4 in binding 2
} p;
const uint kNoScales = 0xFFFFFFFFu;
// W_PANELS (F16 only): W in k-panels as decode_f16.comp writes them, rows = the product's N (forward) or K (NN).
#define W_BASE p.w_base
#ifdef NN
#define W_PANEL_ROWS p.K
#else
#define W_PANEL_ROWS p.N
#endif

#include "wunit.glsl"

// Shared stages: A [BM][BK] and W's tile, [BN][BK] (forward) or [BK][BN] (NN), f16 in uvec4s of 8, each row one
// uvec4 longer than it needs (rows of 80 bytes or BN·2 + 16: conflict-free stores and matrix loads).
const uint AS = BK / 8u + 1u, A_STAGE = BM * AS;
#ifdef NN
const uint BS = BN / 8u + 1u, B_STAGE = BK * BS;
#else
const uint BS = BK / 8u + 1u, B_STAGE = BN * BS;
#endif
const uint B_AT = 2u * A_STAGE;
shared uvec4 sm[2u * (A_STAGE + B_STAGE)];
shared float row_factor[BM];

// The loads of one step in registers: A as uvec4s (BK / 8 per row of the tile), W as pieces: PIECE_ROWS rows of W
// with ROW_PIECES unit parts each (neighbouring invocations take neighbouring parts). Forward: the row's
// BK / 32 units, or the parts of one unit that a K step of 16 covers; NN: the row's BN / 32 units.
const uint A_ROW = BK / 8u, A_VECS = BM * A_ROW, A_PER = (A_VECS + NT - 1u) / NT;
#ifdef NN
const uint PIECE_ROWS = BK, ROW_PIECES = BN / 32u * UNIT_PARTS;
#else
const uint PIECE_ROWS = BN, ROW_PIECES = BK * UNIT_PARTS / 32u;
#endif
const uint PIECES = PIECE_ROWS * ROW_PIECES, W_PER = (PIECES + NT - 1u) / NT;
#if BK_STEP % 32 != 0 && !defined(NN) && UNIT_PARTS < 4
#error "a forward K step of 16 needs a format read in parts of 8 weights (F16)"
#endif

// Two register sets (0 and 1) of one step's loads; `valid` bit i: piece i holds weights of the product (else it
// decodes to zeros).
uvec4 ra0[A_PER], ra1[A_PER];
WUnit rw0[W_PER], rw1[W_PER];
uint valid0, valid1;

// FETCH(ra, rw, valid, m0, n0, k0): issue the loads of the step at k0 into a register set.
// Piece c of a row (0 .. ROW_PIECES): its unit and part, for the step at k0 and the tile at n0.
#ifdef NN
#define PIECE_ROW(k0, n0, r) ((k0) + (r))
#define PIECE_UNIT(k0, n0, c) ((n0) / 32u + (c) / UNIT_PARTS)
#define PIECE_PART(k0, c) ((c) % UNIT_PARTS)
#define PIECE_OK(row, unit) ((row) < p.K && 32u * (unit) < p.N)
#else
#define PIECE_ROW(k0, n0, r) ((n0) + (r))
#define PIECE_UNIT(k0, n0, c) ((k0) / 32u + (c) / UNIT_PARTS)
#define PIECE_PART(k0, c) (((k0) % 32u) * UNIT_PARTS / 32u + (c) % UNIT_PARTS)
#define PIECE_OK(row, unit) ((row) < p.N)
#endif
#define FETCH(ra, rw, valid, m0, n0, k0)                                                                        \
  {                                                                                                             \
    const uint t_ = gl_LocalInvocationID.x, panel_ = p.a_base + 4u * ((k0) / 32u) * p.a_rows + ((k0) % 32u) / 8u;\
    [[unroll]] for (uint i = 0u; i < A_PER; ++i) {                                                              \
      const uint idx = t_ + NT * i, m = idx / A_ROW;                                                            \
      const bool ok = idx < A_VECS && (m0) + m < p.M;                                                           \
      ra[i] = ok ? a4[panel_ + 4u * ((m0) + m) + idx % A_ROW] : uvec4(0u);                                      \
    }                                                                                                           \
    valid = 0u;                                                                                                 \
    [[unroll]] for (uint i = 0u; i < W_PER; ++i) {                                                              \
      const uint idx = t_ + NT * i, r = idx / ROW_PIECES, c = idx % ROW_PIECES;                                 \
      const uint row = PIECE_ROW(k0, n0, r), unit = PIECE_UNIT(k0, n0, c);                                      \
      const bool ok = idx < PIECES && PIECE_OK(row, unit);                                                      \
      /* Pieces outside the product read unit 0 of W's first row (always there) and are zeroed in STASH. */    \
      rw[i] = unit_fetch(ok ? p.w_row0 + row : p.w_row0, ok ? unit : 0u, PIECE_PART(k0, c), p.w_cols);          \
      if (ok) valid |= 1u << i;                                                                                 \
    }                                                                                                           \
  }

// STASH(ra, rw, valid, stage): decode a register set into a shared stage.
#define STASH(ra, rw, valid, stage)                                                                             \
  {                                                                                                             \
    const uint t_ = gl_LocalInvocationID.x;                                                                     \
    [[unroll]] for (uint i = 0u; i < A_PER; ++i) {                                                              \
      const uint idx = t_ + NT * i;                                                                             \
      if (idx < A_VECS) sm[(stage) * A_STAGE + (idx / A_ROW) * AS + idx % A_ROW] = ra[i];                       \
    }                                                                                                           \
    [[unroll]] for (uint i = 0u; i < W_PER; ++i) {                                                              \
      const uint idx = t_ + NT * i, r = idx / ROW_PIECES, c = idx % ROW_PIECES;                                 \
      if (idx >= PIECES) break;                                                                                 \
      uvec4 h[UNIT_VECS];                                                                                       \
      unit_decode(rw[i], h);                                                                                    \
      const bool ok = (((valid) >> i) & 1u) != 0u;                                                              \
      const uint at = B_AT + (stage) * B_STAGE + r * BS + UNIT_VECS * c;                                        \
      [[unroll]] for (uint e = 0u; e < UNIT_VECS; ++e) sm[at + e] = ok ? h[e] : uvec4(0u);                      \
    }                                                                                                           \
  }

#ifdef COOP
#define F32_MAT fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16_MAT fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#ifdef COOP_KHR
// Run on VK_KHR_cooperative_matrix, whose types carry their use: B's rows as a specialization constant (16, never
// set) give B a type of its own, which the rewrite of this SPIR-V needs (kernels/spirv/coop_khr.h).
layout(constant_id = 0) const uint B_ROWS = 16;
#define F16_B_MAT fcoopmatNV<16, gl_ScopeSubgroup, B_ROWS, 16>
#else
#define F16_B_MAT F16_MAT
#endif
F32_MAT acc[FRAGS_M][FRAGS_N];

void multiply(uint stage, uint wm, uint wn) {
  [[unroll]] for (uint kk = 0u; kk < BK / 16u; ++kk) {
    F16_MAT a[FRAGS_M];
    F16_B_MAT b[FRAGS_N];
    [[unroll]] for (uint i = 0u; i < FRAGS_M; ++i)
      coopMatLoadNV(a[i], sm, stage * A_STAGE + (wm * 16u * FRAGS_M + 16u * i) * AS + 2u * kk, AS, false);
    [[unroll]] for (uint j = 0u; j < FRAGS_N; ++j)
#ifdef NN
      coopMatLoadNV(b[j], sm, B_AT + stage * B_STAGE + 16u * kk * BS + 2u * (wn * FRAGS_N + j), BS, false);
#else
      coopMatLoadNV(b[j], sm, B_AT + stage * B_STAGE + (wn * 16u * FRAGS_N + 16u * j) * BS + 2u * kk, BS, true);
#endif
    [[unroll]] for (uint i = 0u; i < FRAGS_M; ++i)
      [[unroll]] for (uint j = 0u; j < FRAGS_N; ++j) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
  }
}
#else
// Portable: invocation t owns rows tm + PM·i and columns tn + PN·j of the tile, RM x RN outputs.
const uint PN = BN / 8u, PM = NT / PN, RM = BM / PM, RN = 8u;
float acc[RM][RN];

float16_t sm_half(uint at, uint h) { return unpackFloat2x16(sm[at + h / 8u][(h % 8u) / 2u])[h % 2u]; }

void multiply(uint stage, uint wm, uint wn) {
  const uint t = gl_LocalInvocationID.x, tm = t / PN, tn = t % PN;
  for (uint k = 0u; k < BK; ++k) {
    float b[RN];
    [[unroll]] for (uint j = 0u; j < RN; ++j) {
      const uint n = tn + PN * j;
#ifdef NN
      b[j] = float(sm_half(B_AT + stage * B_STAGE + k * BS, n));
#else
      b[j] = float(sm_half(B_AT + stage * B_STAGE + n * BS, k));
#endif
    }
    [[unroll]] for (uint i = 0u; i < RM; ++i) {
      const float a = float(sm_half(stage * A_STAGE + (tm + PM * i) * AS, k));
      [[unroll]] for (uint j = 0u; j < RN; ++j) acc[i][j] = fma(a, b[j], acc[i][j]);
    }
  }
}
#endif

void main() {
  const uint t = gl_LocalInvocationID.x;
  const uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN;
  const uint kp = (p.K + BK - 1u) / BK * BK;  // A's padded K
  uint k_first = 0u, k_last = kp, c0 = 0u;
  bool add_to_c = p.accumulate != 0u;
  if (p.k_slice != 0u) {
    k_first = gl_WorkGroupID.z * p.k_slice;
    k_last = min(kp, k_first + p.k_slice);
    c0 = gl_WorkGroupID.z * p.M * p.ldc;
    add_to_c = false;
  }
  for (uint m = t; m < BM; m += NT)
    row_factor[m] = p.s_base == kNoScales ? 1.0 : af[p.s_base + min(m0 + m, p.M - 1u)];

#ifdef COOP
  const uint warp = gl_SubgroupID, wm = warp / WARPS_N, wn = warp % WARPS_N;
  [[unroll]] for (uint i = 0u; i < FRAGS_M; ++i)
    [[unroll]] for (uint j = 0u; j < FRAGS_N; ++j) acc[i][j] = F32_MAT(0.0);
#else
  const uint wm = 0u, wn = 0u;
  [[unroll]] for (uint i = 0u; i < RM; ++i)
    [[unroll]] for (uint j = 0u; j < RN; ++j) acc[i][j] = 0.0;
#endif

  // Steps come in pairs, so that each register set has a name of its own (an array indexed at run time would
  // live in local memory): even steps read stage 0 and refill set 0, odd steps stage 1 and set 1.
  const uint steps = k_first < k_last ? (k_last - k_first) / BK : 0u;
  if (steps > 0u) FETCH(ra0, rw0, valid0, m0, n0, k_first);
  if (steps > 1u) FETCH(ra1, rw1, valid1, m0, n0, k_first + BK);
  if (steps > 0u) STASH(ra0, rw0, valid0, 0u);
  barrier();
  for (uint s = 0u; s < steps; s += 2u) {
    const uint k0 = k_first + s * BK;
    if (s + 2u < steps) FETCH(ra0, rw0, valid0, m0, n0, k0 + 2u * BK);
    multiply(0u, wm, wn);
    if (s + 1u < steps) STASH(ra1, rw1, valid1, 1u);
    barrier();
    if (s + 1u >= steps) break;
    if (s + 3u < steps) FETCH(ra1, rw1, valid1, m0, n0, k0 + 3u * BK);
    multiply(1u, wm, wn);
    if (s + 2u < steps) STASH(ra0, rw0, valid0, 0u);
    barrier();
  }

#ifdef COOP
  // C (+)= s_m · acc. The factors enter as a matrix loaded column-major with stride 0 (row m: s_m).
  [[unroll]] for (uint i = 0u; i < FRAGS_M; ++i) {
    F32_MAT s;
    coopMatLoadNV(s, row_factor, wm * 16u * FRAGS_M + 16u * i, 0u, true);
    [[unroll]] for (uint j = 0u; j < FRAGS_N; ++j)
      [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e) acc[i][j][e] *= s[e];
  }
  const uint mw = m0 + wm * 16u * FRAGS_M, nw = n0 + wn * 16u * FRAGS_N;
  // A subgroup's tiles inside C go straight to memory (rows on 16 bytes: ldc a multiple of 4); the others
  // through its own 16 x 16 staging tile in the (now free) stages.
  if (mw + 16u * FRAGS_M <= p.M && nw + 16u * FRAGS_N <= p.N && p.ldc % 4u == 0u) {
    [[unroll]] for (uint i = 0u; i < FRAGS_M; ++i)
      [[unroll]] for (uint j = 0u; j < FRAGS_N; ++j) {
        const uint idx = c0 + (mw + 16u * i) * p.ldc + nw + 16u * j;
        if (add_to_c) {
          F32_MAT old;
          coopMatLoadNV(old, c, idx, p.ldc, false);
          [[unroll]] for (int e = 0; e < old.length(); ++e) acc[i][j][e] += old[e];
        }
        coopMatStoreNV(acc[i][j], c, idx, p.ldc, false);
      }
    return;
  }
  const uint lane = gl_SubgroupInvocationID, at = warp * 64u;
  [[unroll]] for (uint i = 0u; i < FRAGS_M; ++i)
    [[unroll]] for (uint j = 0u; j < FRAGS_N; ++j) {
      coopMatStoreNV(acc[i][j], sm, at, 4u, false);  // 16 rows of 4 uvec4s
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
        const uint e = e0 + lane, m = mw + 16u * i + e / 16u, n = nw + 16u * j + e % 16u;
        const float v = uintBitsToFloat(sm[at + e / 4u][e % 4u]);
        const uint idx = c0 + m * p.ldc + n;
        if (m < p.M && n < p.N) c[idx] = (add_to_c ? c[idx] : 0.0) + v;
      }
      subgroupBarrier();
    }
#else
  const uint tm = t / PN, tn = t % PN;
  [[unroll]] for (uint i = 0u; i < RM; ++i) {
    const uint m = m0 + tm + PM * i;
    if (m >= p.M) continue;
    [[unroll]] for (uint j = 0u; j < RN; ++j) {
      const uint n = n0 + tn + PN * j, idx = c0 + m * p.ldc + n;
      if (n < p.N) c[idx] = (add_to_c ? c[idx] : 0.0) + row_factor[tm + PM * i] * acc[i][j];
    }
  }
#endif
}
