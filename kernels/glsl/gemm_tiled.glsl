// Shared-memory tiled GEMM body: C[M, N] = (accumulate ? C : 0) + α·Σ_{k in [k_begin, k_end)} A[m, k] · B[k, n],
// α = GEMM_ALPHA (gemm_push.glsl defines it as p.alpha; 1 for the shaders with a push block of their own).
//
// The including .comp declares buffer C (float c[]) and the push block `p` (see GemmPush below), then defines
//   void load_tile_a(uint m0, uint k0);  // fills As[k * BM + m] = A[m0 + m, k0 + k], zero outside
//   void load_tile_b(uint n0, uint k0);  // fills Bs[k * BN + n] = B[k0 + k, n0 + n], zero outside
// so one body serves the f32 GEMMs in every transposition and the fused-dequant Q4_0 GEMMs (B decoded from
// blocks straight into shared memory; no dequantised copy of W exists outside a BK x BN tile).
// Split K (p.k_slice != 0, a multiple of BK): workgroup z sums its slice of K only and writes the partial tile,
// without accumulating, to slice z of C (then [slices, M, N]); q4_0_dx_reduce.comp adds the slices in order.
// Skinny products (LoRA's rank-r sides) get enough workgroups this way.
// 256 invocations (16 x 16), each computing a contiguous TM x TN micro-tile, so its shared reads per k are TM
// and TN consecutive floats (128-bit loads), broadcast across the invocations of one row (As) or column (Bs). BM
// and BN (64 or 128) are specialization constants: large tiles for large products, small ones so that
// few-token calls do not waste most of a tile and enough workgroups fill the GPU. Every loop over the
// micro-tile is unrolled and the stores test their bounds without `continue`: otherwise NVIDIA's compiler
// keeps the 8x8 accumulators of the 128 tile in local memory (H100: 1.9 TFLOPS instead of 27).
// BK, the K step, is GEMM_BK (default 32) where the including shader defines it: the forward quantised GEMMs
// need 32 (one block, or sub-block, of each row per step); the dx and f32 GEMMs take 16, which measured faster
// (H100, Q4_0 dx 16384x16384 at T = 512: 27.2 TFLOPS with 128-tiles and BK 16 against 20.8 with BK 32; with
// 64-tiles 17.9 against 14.2). Fetching the next K step into registers before the FMAs and storing it to the
// tiles after them (as the tensor-core GEMM does) measured slower there: 25.5 against 27.3 TFLOPS, and 16.7
// against 20.3 at 2048 x 5632. Also measured for that dx: BK 8, within 3% of BK 16 at 16384 x 16384 and at
// tinyllama's shapes; 128 x 64, 64 x 128 and 256 x 64 tiles, 10-25% slower than 128 x 128.
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
