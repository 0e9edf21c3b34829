#version 450
// The rank side of a LoRA adapter: C[M, R] (+)= α·X[M, K]·B, with B stored [R, K] (hs = s·xa·Aᵀ) or, B_KR, [K, R]
// (dh = s·dy·B). Bound by reading X once: each workgroup takes RB rows through K steps of KC, the rows' step and
// B's step staged in shared memory (B is read once per workgroup, from cache), the next step's loads in flight
// while a step is summed; each invocation owns a row and 4 neighbouring columns of C, and reads 4 steps of its
// row and of B as vec4s (16 FMAs per 5 loads). Workgroup y sums [y·k_slice, +k_slice) of K only: with several,
// each writes its slice c + y·M·R (without accumulating) for a second pass to add in order (q4_0_dx_reduce.comp).
// Sums run in a fixed order: results do not depend on timing.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint R = 16u;       // the rank, at most 64
layout(constant_id = 1) const bool B_KR = false;  // B is [K, R]
layout(std430, binding = 0) buffer CB { float c[]; };
layout(std430, binding = 1) readonly buffer XB { float x[]; };
layout(std430, binding = 2) readonly buffer BB { float b[]; };
layout(push_constant) uniform Push {
  uint M, K;
  uint ldx;      // X's row stride
  uint k_slice;  // K per workgroup along y
  uint sliced;   // 1: workgroup y writes slice y; 0: C (+)= α·sum
  uint accumulate;
  float alpha;
} p;

const uint RP = (R + 3u) / 4u * 4u, LANES = RP / 4u;  // columns padded to whole vec4s; invocations per row
// Rows per workgroup, K step (16 where the rows are many, so that the staged rows fit 32 KiB), a staged row's stride.
const uint RB = 256u / LANES, KC = RB >= 128u ? 16u : 32u, XS = KC + 4u;
shared vec4 xs[RB * XS / 4u];
shared vec4 bs[KC * LANES];
const uint XL = (RB * KC + 255u) / 256u, BL = (KC * RP + 255u) / 256u;

// The loads of the step at k0 into xr and br (zeros outside X's rows, the slice, and B's R columns); neighbours
// read neighbouring values.
#define FETCH(k0)                                                                                               \
  {                                                                                                             \
    [[unroll]] for (uint i = 0u; i < XL; ++i) {                                                                 \
      const uint e = t + 256u * i, r = e / KC, kk = e % KC;                                                     \
      xr[i] = e < RB * KC && m0 + r < p.M && (k0) + kk < k_end ? x[(m0 + r) * p.ldx + (k0) + kk] : 0.0;         \
    }                                                                                                           \
    [[unroll]] for (uint i = 0u; i < BL; ++i) {                                                                 \
      const uint e = t + 256u * i, kk = B_KR ? e / RP : e % KC, j = B_KR ? e % RP : e / KC;                     \
      br[i] = e < KC * RP && (k0) + kk < k_end && j < R ? (B_KR ? b[((k0) + kk) * R + j] : b[j * p.K + (k0) + kk]) \
                                                        : 0.0;                                                  \
    }                                                                                                           \
  }

void main() {
  const uint t = gl_LocalInvocationID.x, row = t / LANES, lane = t % LANES;
  const uint m0 = gl_WorkGroupID.x * RB;
  const uint k_begin = gl_WorkGroupID.y * p.k_slice, k_end = min(p.K, k_begin + p.k_slice);
  vec4 acc = vec4(0.0);
  // The step's values in registers, loaded while the step before is summed: invocation t holds elements t + 256·i
  // of the step's rows (RB x KC) and of B's step (KC x RP).
  float xr[XL], br[BL];
  FETCH(k_begin);
  for (uint k0 = k_begin; k0 < k_end; k0 += KC) {
    barrier();  // the last step's reads are done
    [[unroll]] for (uint i = 0u; i < XL; ++i) {
      const uint e = t + 256u * i, r = e / KC, kk = e % KC;
      if (e < RB * KC) xs[(r * XS + kk) / 4u][kk % 4u] = xr[i];
    }
    [[unroll]] for (uint i = 0u; i < BL; ++i) {
      const uint e = t + 256u * i, kk = B_KR ? e / RP : e % KC, j = B_KR ? e % RP : e / KC;
      if (e < KC * RP) bs[kk * LANES + j / 4u][j % 4u] = br[i];
    }
    barrier();
    if (k0 + KC < k_end) FETCH(k0 + KC);
    [[unroll]] for (uint q = 0u; q < KC / 4u; ++q) {
      const vec4 xv = xs[(row * XS) / 4u + q];
      [[unroll]] for (uint i = 0u; i < 4u; ++i) acc = fma(vec4(xv[i]), bs[(4u * q + i) * LANES + lane], acc);
    }
  }
  const uint m = m0 + row;
  if (m >= p.M) return;
  const uint base = p.sliced != 0u ? gl_WorkGroupID.y * p.M * R : 0u;
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const uint j = 4u * lane + e;
    if (j >= R) continue;
    const uint i = base + m * R + j;
    c[i] = p.sliced != 0u ? p.alpha * acc[e] : (p.accumulate != 0u ? c[i] : 0.0) + p.alpha * acc[e];
  }
}
