#version 450
// Y[T, n_out] = X[T, n_in] · Wᵀ on cooperative matrices (tensor cores): the fused-dequant Q4_0 GEMM of
// q4_0_gemm.comp, for devices with VK_NV_cooperative_matrix (16x16x16, f16 inputs, f32 accumulators).
// M = T, N = n_out, K = n_in; one K step of BK = 32 is one Q4_0 block of every row of W.
//
// Numerics stay at f32 level although the matrix inputs are f16:
//  - W enters as its codes q - 8 (integers in [-8, 7], exact in f16); the block scales d are applied per block
//    to the f32 partial product: acc += (X·codes) ⊙ D with D[m][n] = d of column n's block.
//  - X row m is scaled by a power of two s_m (its largest |value| over K brought near 2^13: no f16 overflow or
//    underflow, whatever the magnitudes) and split into f16 hi + lo, X·s = hi + lo to about 22 bits; both
//    halves are multiplied (2 products per step), and the output is scaled back by 1/s_m (exact).
// 256 invocations = 8 subgroups of 32 (the device checks the subgroup size); the workgroup tile is BM x BN =
// 64 x 128, each subgroup owning a 32 x 32 corner as 2 x 2 accumulator matrices. Every loop over matrices is
// unrolled: indexing a matrix array or a matrix's elements at run time cost 40% of the speed (H100, 16384 x
// 16384 x 512: 10.3 against 17.8 TFLOPS).
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#define Q4_0_WORDS w
#include "q4_0.glsl"

// BM = 128 (4 x 2 subgroups of 32 x 64) measured slower on an H100 at 2048-wide shapes (13-17 against 19-22
// TFLOPS) and faster only at 16384 x 16384 (21 against 18).
const uint BM = 64u, BN = 128u, BK = 32u;
const uint SG_M = BM / 32u, SG_N = 8u / SG_M, FN = BN / SG_N / 16u;  // subgroup grid; column matrices each
const uint AS = BK + 8u, BS = BN + 8u;  // padded row strides of the f16 tiles (16-byte multiples)
#define F32_MAT fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16_MAT fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

shared float16_t Ah[BM * AS], Al[BM * AS];  // X tile [m][k], scaled and split
shared float16_t Bq[BK * BS];               // codes tile [k][n]
shared float Ds[16u * BN];                  // block scales [16 equal rows][n]
shared float Cs[8u * 256u];                 // per-subgroup staging of one 16 x 16 result
shared float row_scale[BM], row_unscale[BM];

void main() {
  const uint t = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint sm = sg / SG_N, sn = sg % SG_N;  // this subgroup's corner: rows sm*32.., columns sn*16*FN..
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;

  // s_m: each subgroup finds the largest |x| of 8 rows over the K range.
  for (uint r = 0u; r < BM / 8u; ++r) {
    const uint m = sg * (BM / 8u) + r;
    float amax = 0.0;
    if (m0 + m < p.M)
      for (uint k = p.k_begin + lane; k < p.k_end; k += 32u) amax = max(amax, abs(a[(m0 + m) * p.lda + k]));
    amax = subgroupMax(amax);
    if (lane == 0u) {
      int e = 0;
      frexp(amax, e);  // amax = f · 2^e, f in [0.5, 1)
      e = amax > 0.0 ? clamp(13 - e, -120, 120) : 0;
      row_scale[m] = ldexp(1.0, e);
      row_unscale[m] = ldexp(1.0, -e);
    }
  }

  F32_MAT acc[2][4];
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) acc[i][j] = F32_MAT(0.0);
  const uint n_blocks = p.k_end / 32u;
  for (uint k0 = p.k_begin; k0 < p.k_end; k0 += BK) {
    barrier();  // the previous step's tiles are read (and, the first time, row_scale written)
    // X: 8 values per invocation, coalesced along k.
    [[unroll]] for (uint i = 0u; i < BM * BK / 256u; ++i) {
      const uint k = t % BK, m = t / BK + (256u / BK) * i;
      const float v = m0 + m < p.M ? a[(m0 + m) * p.lda + k0 + k] * row_scale[m] : 0.0;
      // hi: v cut to f16's 11 significant bits with an integer mask (a compiler may fold float(float16_t(v))
      // back to v, which would leave lo zero); lo = v - hi is exact in f32.
      const float hi = uintBitsToFloat(floatBitsToUint(v) & 0xFFFFE000u);
      Ah[m * AS + k] = float16_t(hi);
      Al[m * AS + k] = float16_t(v - hi);
    }
    // W: BN rows x one block = 4 BN quarters; each quarter also writes 4 rows of the scale tile.
    for (uint u = t; u < 4u * BN; u += 256u) {
      const uint r = u / 4u, q = u % 4u;
      vec4 lo = vec4(0.0), hi = vec4(0.0);
      float d = 0.0;
      if (n0 + r < p.N) {
        const uint bb = ((n0 + r) * n_blocks + k0 / 32u) * Q4_0_BLOCK_BYTES;
        d = q4_0_scale(bb);
        const uint qs = q4_0_quarter(bb, q);
        lo = q4_0_low(qs);
        hi = q4_0_high(qs);
      }
      for (uint i = 0u; i < 4u; ++i) {
        Bq[(4u * q + i) * BS + r] = float16_t(lo[i]);
        Bq[(16u + 4u * q + i) * BS + r] = float16_t(hi[i]);
        Ds[(4u * q + i) * BN + r] = d;
      }
    }
    barrier();

    F32_MAT part[2][4];
    [[unroll]] for (uint i = 0u; i < 2u; ++i)
      [[unroll]] for (uint j = 0u; j < FN; ++j) part[i][j] = F32_MAT(0.0);
    [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
      F16_MAT xh[2], xl[2], b[4];
      [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        coopMatLoadNV(xh[i], Ah, (sm * 32u + 16u * i) * AS + kk, AS, false);
        coopMatLoadNV(xl[i], Al, (sm * 32u + 16u * i) * AS + kk, AS, false);
      }
      [[unroll]] for (uint j = 0u; j < FN; ++j) coopMatLoadNV(b[j], Bq, kk * BS + sn * 16u * FN + 16u * j, BS, false);
      [[unroll]] for (uint i = 0u; i < 2u; ++i)
        [[unroll]] for (uint j = 0u; j < FN; ++j) {
          part[i][j] = coopMatMulAddNV(xh[i], b[j], part[i][j]);
          part[i][j] = coopMatMulAddNV(xl[i], b[j], part[i][j]);
        }
    }
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      F32_MAT d;
      coopMatLoadNV(d, Ds, sn * 16u * FN + 16u * j, BN, false);
      [[unroll]] for (uint i = 0u; i < 2u; ++i)
        [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e) acc[i][j][e] += part[i][j][e] * d[e];
    }
  }

  // Out through the subgroup's staging tile: C (+)= acc / s_m, inside the matrix only.
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      coopMatStoreNV(acc[i][j], Cs, sg * 256u, 16u, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      for (uint e = lane; e < 256u; e += 32u) {
        const uint ml = sm * 32u + 16u * i + e / 16u, n = n0 + sn * 16u * FN + 16u * j + e % 16u;
        if (m0 + ml >= p.M || n >= p.N) continue;
        const uint idx = (m0 + ml) * p.N + n;
        c[idx] = (p.accumulate != 0u ? c[idx] : 0.0) + Cs[sg * 256u + e] * row_unscale[ml];
      }
      subgroupBarrier();
    }
}
