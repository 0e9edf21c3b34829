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
// The global loads of step s + 1 are issued into registers (fetch) before the matrix products of step s and
// written to the tiles after them (stash), so their latency hides behind the products: 17.8 -> 32.8 TFLOPS at
// 16384 x 16384 x 512 and 19-22 -> 30-37 at tinyllama's shapes (H100). Shared memory stays under the 48 KiB
// a workgroup gets on NVIDIA: the tiles are single-buffered, and the scale tile doubles as the output staging.
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer C { float c[]; };
layout(std430, binding = 1) readonly buffer A { vec4 a4[]; };
layout(std430, binding = 2) readonly buffer W { uint w[]; };
#include "gemm_push.glsl"
#define Q4_0_WORDS w
#include "q4_0.glsl"

const uint BM = 64u, BN = 128u, BK = 32u;
const uint SG_N = 4u, FN = 2u;
const uint AS = BK + 8u;   // A tiles [m][k], halfs
const uint BS = BK + 8u;   // codes tile [n][k], halfs
const uint DS = BN + 4u;   // scale tile [16][n], floats (padded: the 4 quarters' stores hit different banks)
#define F32_MAT fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define F16_MAT fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

shared float16_t Ah[BM * AS], Al[BM * AS];
shared float16_t Bq[BN * BS];
shared float Fs[16u * DS];  // the scale tile in the loop, then each subgroup's 16 x 16 output staging
shared float row_scale[BM], row_unscale[BM];

// Prefetch registers: 2 vec4 of X; 2 quarters of W as the raw words loaded (two quant words, the scale word)
// and the parity of each quarter's block (bit i of pp). The shifts that need loaded values wait until stash(),
// so fetch() issues its loads and moves on to the matrix products.
vec4 px[2];
uint pw0[2], pw1[2], pd[2];
uint pp;

void fetch(uint m0, uint n0, uint k0, uint n_blocks) {
  const uint t = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    const uint idx = t + 256u * i, m = idx / 8u, kv = idx % 8u;
    px[i] = m0 + m < p.M ? a4[((m0 + m) * p.lda + k0) / 4u + kv] : vec4(0.0);
  }
  pp = 0u;
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    const uint idx = t + 256u * i, r = idx / 4u, q = idx % 4u;
    const uint B = (n0 + r) * n_blocks + k0 / 32u;
    const uint bb = B * Q4_0_BLOCK_BYTES;
    const uint par = B & 1u;  // odd block: scale in the high half of its word, quants word-aligned
    const uint wa = (bb + 2u + 4u * q) >> 2u;
    if (n0 + r < p.N) {
      pw0[i] = w[wa];
      pw1[i] = w[wa + 1u - par];
      pd[i] = w[bb >> 2u];
    } else {
      pw0[i] = 0x88888888u;  // codes 0, scale 0
      pw1[i] = 0x88888888u;
      pd[i] = 0u;
    }
    pp |= par << i;
  }
}

void stash() {
  const uint t = gl_LocalInvocationID.x;
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    const uint idx = t + 256u * i, m = idx / 8u, kv = idx % 8u;
    const vec4 v = px[i] * row_scale[m];
    // hi: v cut to f16's 11 significant bits with an integer mask; lo = v - hi is exact in f32.
    const vec4 hi = uintBitsToFloat(floatBitsToUint(v) & 0xFFFFE000u);
    const uint o = m * AS + 4u * kv;
    const f16vec4 h = f16vec4(hi), l = f16vec4(v - hi);
    Ah[o] = h.x; Ah[o + 1u] = h.y; Ah[o + 2u] = h.z; Ah[o + 3u] = h.w;
    Al[o] = l.x; Al[o + 1u] = l.y; Al[o + 2u] = l.z; Al[o + 3u] = l.w;
  }
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    const uint idx = t + 256u * i, r = idx / 4u, q = idx % 4u;
    const bool par = ((pp >> i) & 1u) != 0u;
    const uint qs = par ? pw0[i] : (pw0[i] >> 16u) | (pw1[i] << 16u);
    const float d = unpackHalf2x16(par ? pd[i] >> 16u : pd[i]).x;
    const uint o = r * BS + 4u * q;
    const vec4 lo = q4_0_low(qs), hi = q4_0_high(qs);
    Bq[o] = float16_t(lo.x); Bq[o + 1u] = float16_t(lo.y); Bq[o + 2u] = float16_t(lo.z); Bq[o + 3u] = float16_t(lo.w);
    Bq[o + 16u] = float16_t(hi.x); Bq[o + 17u] = float16_t(hi.y); Bq[o + 18u] = float16_t(hi.z); Bq[o + 19u] = float16_t(hi.w);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) Fs[(4u * q + e) * DS + r] = d;
  }
}

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint sm = sg / SG_N, sn = sg % SG_N;  // this subgroup's corner: rows sm*32.., columns sn*32..
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  const uint n_blocks = p.k_end / 32u;

  // s_m: each subgroup finds the largest |x| of 8 rows over the K range, the 8 rows side by side so that each
  // lane has 8 loads in flight (against one row after another: about 3% of the GEMM's time on an H100).
  {
    vec4 amax[8];
    [[unroll]] for (uint r = 0u; r < 8u; ++r) amax[r] = vec4(0.0);
    for (uint k = p.k_begin / 4u + lane; k < p.k_end / 4u; k += 32u)
      [[unroll]] for (uint r = 0u; r < 8u; ++r) {
        const uint row = min(m0 + sg * 8u + r, p.M - 1u);  // rows past M: any row; their X is never used
        amax[r] = max(amax[r], abs(a4[(row * p.lda) / 4u + k]));
      }
    [[unroll]] for (uint r = 0u; r < 8u; ++r) {
      const float v = subgroupMax(max(max(amax[r].x, amax[r].y), max(amax[r].z, amax[r].w)));
      if (lane == 0u) {
        int e = 0;
        frexp(v, e);  // v = f · 2^e, f in [0.5, 1)
        e = v > 0.0 ? clamp(13 - e, -120, 120) : 0;
        row_scale[sg * 8u + r] = ldexp(1.0, e);
        row_unscale[sg * 8u + r] = ldexp(1.0, -e);
      }
    }
  }

  F32_MAT acc[2][FN];
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) acc[i][j] = F32_MAT(0.0);

  fetch(m0, n0, p.k_begin, n_blocks);
  barrier();  // row_scale
  stash();
  barrier();
  for (uint k0 = p.k_begin; k0 < p.k_end; k0 += BK) {
    const bool more = k0 + BK < p.k_end;
    if (more) fetch(m0, n0, k0 + BK, n_blocks);
    F32_MAT part[2][FN];
    [[unroll]] for (uint i = 0u; i < 2u; ++i)
      [[unroll]] for (uint j = 0u; j < FN; ++j) part[i][j] = F32_MAT(0.0);
    [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
      F16_MAT xh[2], xl[2], b[FN];
      [[unroll]] for (uint i = 0u; i < 2u; ++i) {
        coopMatLoadNV(xh[i], Ah, (sm * 32u + 16u * i) * AS + kk, AS, false);
        coopMatLoadNV(xl[i], Al, (sm * 32u + 16u * i) * AS + kk, AS, false);
      }
      [[unroll]] for (uint j = 0u; j < FN; ++j)
        coopMatLoadNV(b[j], Bq, (sn * 32u + 16u * j) * BS + kk, BS, true);
      [[unroll]] for (uint i = 0u; i < 2u; ++i)
        [[unroll]] for (uint j = 0u; j < FN; ++j) {
          part[i][j] = coopMatMulAddNV(xh[i], b[j], part[i][j]);
          part[i][j] = coopMatMulAddNV(xl[i], b[j], part[i][j]);
        }
    }
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      F32_MAT d;
      coopMatLoadNV(d, Fs, sn * 32u + 16u * j, DS, false);
      [[unroll]] for (uint i = 0u; i < 2u; ++i)
        [[unroll]] for (int e = 0; e < acc[i][j].length(); ++e) acc[i][j][e] += part[i][j][e] * d[e];
    }
    barrier();  // every subgroup is done with the tiles
    if (more) {
      stash();
      barrier();
    }
  }

  // Out through the subgroup's staging tile (in Fs, free after the loop's last barrier): C (+)= acc / s_m.
  [[unroll]] for (uint i = 0u; i < 2u; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      coopMatStoreNV(acc[i][j], Fs, sg * 256u, 16u, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      for (uint e = lane; e < 256u; e += 32u) {
        const uint ml = sm * 32u + 16u * i + e / 16u, n = n0 + sn * 32u + 16u * j + e % 16u;
        if (m0 + ml >= p.M || n >= p.N) continue;
        const uint idx = (m0 + ml) * p.N + n;
        c[idx] = (p.accumulate != 0u ? c[idx] : 0.0) + Fs[sg * 256u + e] * row_unscale[ml];
      }
      subgroupBarrier();
    }
}
