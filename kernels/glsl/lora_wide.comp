#version 450
// The adapter's wide products: C[M, N] (+)= α·H[M, R]·B, with B stored [N, R] (y += hs·Bᵀ) or, B_RN, [R, N]
// (dxa += dh·A). Bound by reading and writing C once: each workgroup takes a tile of 32 rows and 128 columns, its
// rows of H and its columns of B staged in shared memory 16 ranks at a time (B is read once per workgroup, from
// cache), each invocation 4 rows of 4 neighbouring columns.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint R = 16u;       // the rank
layout(constant_id = 1) const bool B_RN = false;  // B is [R, N]
layout(std430, binding = 0) buffer CB { float c[]; };
layout(std430, binding = 0) buffer C4B { vec4 c4[]; };
layout(std430, binding = 1) readonly buffer HB { float h[]; };
layout(std430, binding = 2) readonly buffer BB { float b[]; };
layout(push_constant) uniform Push {
  uint M, N;
  uint accumulate;
  float alpha;
} p;

const uint TM = 32u, TN = 128u, JC = 16u;  // the tile, and the ranks staged per step
shared float hs[TM * JC];
shared float bs[JC * TN];

void main() {
  const uint t = gl_LocalInvocationID.x, cg = t % 32u, rg = t / 32u;  // columns 4·cg .., rows 4·rg ..
  const uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
  vec4 acc[4];
  [[unroll]] for (uint i = 0u; i < 4u; ++i) acc[i] = vec4(0.0);
  for (uint j0 = 0u; j0 < R; j0 += JC) {
    barrier();  // the last step's reads are done
    for (uint e = t; e < TM * JC; e += 256u) {
      const uint r = e / JC, j = e % JC;
      hs[e] = m0 + r < p.M && j0 + j < R ? h[(m0 + r) * R + j0 + j] : 0.0;
    }
    for (uint e = t; e < JC * TN; e += 256u) {
      const uint j = B_RN ? e / TN : e % JC, n = B_RN ? e % TN : e / JC;  // neighbours read neighbouring values
      bs[j * TN + n] = n0 + n < p.N && j0 + j < R ? (B_RN ? b[(j0 + j) * p.N + n0 + n] : b[(n0 + n) * R + j0 + j]) : 0.0;
    }
    barrier();
    [[unroll]] for (uint j = 0u; j < JC; ++j) {
      const vec4 bv = vec4(bs[j * TN + 4u * cg], bs[j * TN + 4u * cg + 1u], bs[j * TN + 4u * cg + 2u],
                           bs[j * TN + 4u * cg + 3u]);
      [[unroll]] for (uint i = 0u; i < 4u; ++i) acc[i] = fma(vec4(hs[(4u * rg + i) * JC + j]), bv, acc[i]);
    }
  }
  const uint n = n0 + 4u * cg;
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    const uint m = m0 + 4u * rg + i;
    if (m >= p.M || n >= p.N) continue;
    const vec4 v = p.alpha * acc[i];
    if (p.N % 4u == 0u) {  // rows on 16 bytes: whole vec4s
      const uint at = (m * p.N + n) / 4u;
      c4[at] = (p.accumulate != 0u ? c4[at] : vec4(0.0)) + v;
    } else {
      [[unroll]] for (uint e = 0u; e < 4u; ++e)
        if (n + e < p.N) c[m * p.N + n + e] = (p.accumulate != 0u ? c[m * p.N + n + e] : 0.0) + v[e];
    }
  }
}
