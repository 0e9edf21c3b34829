// Shared-memory tiled GEMM body: C[M, N] = (accumulate ? C : 0) + α·Σ_{k in [k_begin, k_end)} A[m, k] · B[k, n],
// α = GEMM_ALPHA (gemm_push.glsl defines it as p.alpha; 1 for the shaders with a push block of their own).
// The including .comp declares buffer C (float c[]) and a push block `p` with gemm_push.glsl's fields, then defines
//   void load_tile_a(uint m0, uint k0);  // fills As[k * BM + m] = A[m0 + m, k0 + k], zero outside
//   void load_tile_b(uint n0, uint k0);  // fills Bs[k * BN + n] = B[k0 + k, n0 + n], zero outside
// so one body serves the f32 GEMMs in every transposition and the fused-dequant GEMMs (B decoded from blocks
// straight into shared memory). 256 invocations (16 x 16), each a contiguous TM x TN micro-tile read from shared
// memory in 128-bit loads. BM and BN (64 or 128) are specialization constants; BK is GEMM_BK where the including
// shader defines it (16 for the dx and f32 GEMMs), else 32 (one block, or sub-block, of each row per step).
// How the tiles and K steps were chosen: docs/kernels.md, "Tiled GEMMs".
#extension GL_EXT_control_flow_attributes : require
layout(constant_id = 0) const uint BM = 64;
layout(constant_id = 1) const uint BN = 64;
#ifndef GEMM_BK
#define GEMM_BK 32u
#endif
const uint BK = GEMM_BK, TM = BM / 16u, TN = BN / 16u;
#ifndef GEMM_ALPHA
#define GEMM_ALPHA 1.0
#endif

shared float As[BK * BM];
shared float Bs[BK * BN];

// Column of the tile that element j of an invocation's TN columns covers: two runs of TN/2, BN/2 apart, so that
// neighbouring invocations' shared reads are contiguous (no bank conflicts with TN = 8).
uint col(uint tx, uint j) {
  if (TN < 2u) return tx;  // the 16-wide tiles of skinny products: one column each
  return (j / (TN / 2u)) * (BN / 2u) + tx * (TN / 2u) + j % (TN / 2u);
}

void load_tile_a(uint m0, uint k0);
void load_tile_b(uint n0, uint k0);

void main() {
  const uint tx = gl_LocalInvocationID.x % 16u, ty = gl_LocalInvocationID.x / 16u;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  float acc[TM][TN];
  [[unroll]] for (uint i = 0u; i < TM; ++i)
    [[unroll]] for (uint j = 0u; j < TN; ++j) acc[i][j] = 0.0;

  // Split K (p.k_slice != 0, a multiple of BK): workgroup z sums its slice of K only and writes the partial tile,
  // without accumulating, to slice z of C (then [slices, M, N]); q4_0_dx_reduce.comp adds the slices in order.
  // Skinny products (LoRA's rank-r sides) get enough workgroups this way.
  uint k_first = p.k_begin, k_last = p.k_end, c0 = 0u;
  bool add_to_c = p.accumulate != 0u;
  if (p.k_slice != 0u) {
    k_first = p.k_begin + gl_WorkGroupID.z * p.k_slice;
    k_last = min(p.k_end, k_first + p.k_slice);
    c0 = gl_WorkGroupID.z * p.M * p.N;
    add_to_c = false;
  }
  for (uint k0 = k_first; k0 < k_last; k0 += BK) {
    load_tile_a(m0, k0);
    load_tile_b(n0, k0);
    barrier();
    [[unroll]] for (uint kk = 0u; kk < BK; ++kk) {
      float a[TM], b[TN];
      [[unroll]] for (uint i = 0u; i < TM; ++i) a[i] = As[kk * BM + ty * TM + i];
      [[unroll]] for (uint j = 0u; j < TN; ++j) b[j] = Bs[kk * BN + col(tx, j)];
      [[unroll]] for (uint i = 0u; i < TM; ++i)
        [[unroll]] for (uint j = 0u; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
    barrier();
  }

  // Unrolled, and bounds tested without `continue`: otherwise NVIDIA's compiler keeps the 8 x 8 accumulators of
  // the 128 tile in local memory.
  [[unroll]] for (uint i = 0u; i < TM; ++i) {
    const uint m = m0 + ty * TM + i;
    [[unroll]] for (uint j = 0u; j < TN; ++j) {
      const uint n = n0 + col(tx, j);
      if (m < p.M && n < p.N) {
        const uint idx = c0 + m * p.N + n;
        c[idx] = (add_to_c ? c[idx] : 0.0) + GEMM_ALPHA * acc[i][j];
      }
    }
  }
}
