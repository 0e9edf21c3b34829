#version 450
// The adapter's wide products: C[M, N] (+)= α·H[M, R]·B, with B stored [N, R] (y += hs·Bᵀ) or, B_RN, [R, N]
// (dxa += dh·A). Bound by reading and writing C once: each invocation 4 neighbouring columns of one row (vec4
// where rows allow), H's row and B's values from cache.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint R = 16u;       // the rank
layout(constant_id = 1) const bool B_RN = false;  // B is [R, N]
layout(std430, binding = 0) buffer CB { float c[]; };
layout(std430, binding = 0) buffer C4B { vec4 c4[]; };
layout(std430, binding = 1) readonly buffer HB { float h[]; };
layout(std430, binding = 2) readonly buffer BB { float b[]; };
layout(std430, binding = 2) readonly buffer B4B { vec4 b4[]; };
layout(push_constant) uniform Push {
  uint M, N;
  uint accumulate;
  float alpha;
} p;

void main() {
  const uint m = gl_WorkGroupID.y + 65535u * gl_WorkGroupID.z, n = 4u * (gl_WorkGroupID.x * 256u + gl_LocalInvocationID.x);
  if (m >= p.M || n >= p.N) return;
  const bool vec = p.N % 4u == 0u;  // rows and B's rows on 16 bytes: whole vec4s
  vec4 acc = vec4(0.0);
  [[unroll]] for (uint j = 0u; j < R; ++j) {
    const float hj = h[m * R + j];
    vec4 bv;
    if (B_RN && vec) {
      bv = b4[(j * p.N + n) / 4u];
    } else {
      [[unroll]] for (uint e = 0u; e < 4u; ++e) {
        const uint nn = min(n + e, p.N - 1u);
        bv[e] = B_RN ? b[j * p.N + nn] : b[nn * R + j];
      }
    }
    acc = fma(vec4(hj), bv, acc);
  }
  acc *= p.alpha;
  if (vec) {
    const uint i = (m * p.N + n) / 4u;
    c4[i] = (p.accumulate != 0u ? c4[i] : vec4(0.0)) + acc;
    return;
  }
  [[unroll]] for (uint e = 0u; e < 4u; ++e)
    if (n + e < p.N) c[m * p.N + n + e] = (p.accumulate != 0u ? c[m * p.N + n + e] : 0.0) + acc[e];
}
