// Pieces of the Q4_0 tensor-core GEMM (q4_0_gemm_coop.comp): tiles are uvec4 arrays, 8 halves per element,
// written a whole uvec4 at a time.
// Activations enter scaled by one power of two per row (find_row_scales: the row's largest |value| over the K
// range brought near 2^13, so no f16 overflow or underflow whatever the magnitudes) and split into f16 hi + lo
// (split8), together about 22 significant bits; the output is scaled back exactly. Quants enter as codes q - 8,
// integers in [-8, 7] that f16 holds exactly (codes2).
// The including shader defines BM (rows of the workgroup tile, 8 per subgroup for find_row_scales) and binds
// `a4` (vec4[] activations).
#include "f16_split.glsl"

shared float row_scale[BM], row_unscale[BM];

// s_m for rows m0 .. m0 + BM of A (row stride lda, K range [k_begin, k_end), both multiples of 4): each
// subgroup takes 8 rows at a time side by side, so that each lane has 8 loads in flight. Needs a barrier before
// row_scale is read.
void find_row_scales(uint m0, uint M, uint lda, uint k_begin, uint k_end) {
  const uint lane = gl_SubgroupInvocationID;
  for (uint r0 = gl_SubgroupID * 8u; r0 < BM; r0 += 8u * gl_NumSubgroups) {
    vec4 amax[8];
    [[unroll]] for (uint r = 0u; r < 8u; ++r) amax[r] = vec4(0.0);
    for (uint k = k_begin / 4u + lane; k < k_end / 4u; k += gl_SubgroupSize)
      [[unroll]] for (uint r = 0u; r < 8u; ++r) {
        const uint row = min(m0 + r0 + r, M - 1u);  // rows past M: any row; their A is never used
        amax[r] = max(amax[r], abs(a4[(row * lda) / 4u + k]));
      }
    [[unroll]] for (uint r = 0u; r < 8u; ++r) {
      const float v = subgroupMax(max(max(amax[r].x, amax[r].y), max(amax[r].z, amax[r].w)));
      if (subgroupElect()) {
        const int e = split_scale_exponent(v);
        row_scale[r0 + r] = ldexp(1.0, e);
        row_unscale[r0 + r] = ldexp(1.0, -e);
      }
    }
  }
}

// Two f16 codes q - 8 from the nibbles at bits s..s+3 and s+16..s+19 of v, with one mask: the f16 pair 1024 + q,
// minus 1032. The pair taken from a word is bytes (0, 2) or (1, 3), so within each run of 8 the tiles hold their K
// positions in the order 0 2 1 3 4 6 5 7; the activations are stored in the same order, and a product over K does
// not depend on the order of its terms.
uint codes2(uint v, uint s) {
  const uint biased = ((v >> s) & 0x000F000Fu) | 0x64006400u;  // f16 pair 1024 + q
  return packFloat2x16(unpackFloat2x16(biased) - f16vec2(1032.0hf));
}
