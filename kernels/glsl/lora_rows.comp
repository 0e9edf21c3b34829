#version 450
// The rank side of a LoRA adapter: C[M, R] (+)= α·X[M, K]·B, with B stored [R, K] (hs = s·xa·Aᵀ) or, B_KR, [K, R]
// (dh = s·dy·B). Bound by reading X once: each workgroup takes RB rows through K steps of KC, the rows' step and B's
// step staged in shared memory (B is read once per workgroup, from cache), each invocation a row and every 16th
// column of C. Sums run in a fixed order: results do not depend on timing.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint R = 16u;       // the rank, at most 64
layout(constant_id = 1) const bool B_KR = false;  // B is [K, R]
layout(std430, binding = 0) buffer CB { float c[]; };
layout(std430, binding = 1) readonly buffer XB { float x[]; };
layout(std430, binding = 2) readonly buffer BB { float b[]; };
layout(push_constant) uniform Push {
  uint M, K;
  uint ldx;  // X's row stride
  uint accumulate;
  float alpha;
} p;

const uint RB = 16u, KC = 64u, NJ = (R + 15u) / 16u;  // rows per workgroup, K step, columns per invocation
shared float xs[RB * (KC + 1u)];
shared float bs[KC * (R + 1u)];

void main() {
  const uint t = gl_LocalInvocationID.x, row = t / 16u, col = t % 16u;
  const uint m0 = (gl_WorkGroupID.x + 65535u * gl_WorkGroupID.y) * RB;
  float acc[NJ];
  [[unroll]] for (uint q = 0u; q < NJ; ++q) acc[q] = 0.0;
  for (uint k0 = 0u; k0 < p.K; k0 += KC) {
    barrier();  // the last step's reads are done
    for (uint e = t; e < RB * KC; e += 256u) {
      const uint r = e / KC, kk = e % KC;
      xs[r * (KC + 1u) + kk] = m0 + r < p.M && k0 + kk < p.K ? x[(m0 + r) * p.ldx + k0 + kk] : 0.0;
    }
    for (uint e = t; e < KC * R; e += 256u) {
      const uint kk = B_KR ? e / R : e % KC, j = B_KR ? e % R : e / KC;  // neighbours read neighbouring values
      bs[kk * (R + 1u) + j] = k0 + kk < p.K ? (B_KR ? b[(k0 + kk) * R + j] : b[j * p.K + k0 + kk]) : 0.0;
    }
    barrier();
    for (uint kk = 0u; kk < KC; ++kk) {
      const float xv = xs[row * (KC + 1u) + kk];
      [[unroll]] for (uint q = 0u; q < NJ; ++q)
        if (col + 16u * q < R) acc[q] = fma(xv, bs[kk * (R + 1u) + col + 16u * q], acc[q]);
    }
  }
  const uint m = m0 + row;
  if (m >= p.M) return;
  [[unroll]] for (uint q = 0u; q < NJ; ++q) {
    const uint j = col + 16u * q;
    if (j < R) c[m * R + j] = (p.accumulate != 0u ? c[m * R + j] : 0.0) + p.alpha * acc[q];
  }
}
