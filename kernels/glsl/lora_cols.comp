#version 450
// The adapter matrices' gradients, sums over the tokens: Σ_t X[t][n]·H[t][j] for n < N, j < R, into
// C[n][j] (dB = dyᵀ·hs) or, OUT_RN, C[j][n] (dA = dhᵀ·xa), times α. Bound by reading X once: each invocation a
// column n (neighbours read neighbouring values) with R sums, the R values of H of TC tokens staged in shared
// memory at a time. Workgroup y sums the tokens [y·t_chunk, +t_chunk) only: with several, each writes α·its slice
// at c + y·N·R (without accumulating) for a second pass to add in order (q4_0_dx_reduce.comp).
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint R = 16u;          // the rank
layout(constant_id = 1) const bool OUT_RN = false;   // C is [R][N]
layout(std430, binding = 0) buffer CB { float c[]; };
layout(std430, binding = 1) readonly buffer XB { float x[]; };
layout(std430, binding = 2) readonly buffer HB { float h[]; };
layout(push_constant) uniform Push {
  uint T, N;
  uint ldx;      // X's row stride
  uint t_chunk;  // tokens per workgroup along y
  uint sliced;   // 1: workgroup y writes slice y; 0: C (+)= α·sum
  uint accumulate;
  float alpha;
} p;

const uint TC = 32u;
shared float hs[TC * R];

void main() {
  const uint t = gl_LocalInvocationID.x, n = gl_WorkGroupID.x * 256u + t;
  const uint t_begin = gl_WorkGroupID.y * p.t_chunk, t_end = min(p.T, t_begin + p.t_chunk);
  float acc[R];
  [[unroll]] for (uint j = 0u; j < R; ++j) acc[j] = 0.0;
  for (uint t0 = t_begin; t0 < t_end; t0 += TC) {
    barrier();  // the previous step's reads of hs are done
    for (uint e = t; e < TC * R; e += 256u) hs[e] = t0 + e / R < t_end ? h[(t0 + e / R) * R + e % R] : 0.0;
    barrier();
    if (n < p.N)
      for (uint tt = 0u; tt < min(TC, t_end - t0); ++tt) {
        const float xv = x[(t0 + tt) * p.ldx + n];
        [[unroll]] for (uint j = 0u; j < R; ++j) acc[j] = fma(xv, hs[tt * R + j], acc[j]);
      }
  }
  if (n >= p.N) return;
  const uint base = p.sliced != 0u ? gl_WorkGroupID.y * p.N * R : 0u;
  [[unroll]] for (uint j = 0u; j < R; ++j) {
    const uint i = base + (OUT_RN ? j * p.N + n : n * R + j);
    c[i] = (p.sliced == 0u && p.accumulate != 0u ? c[i] : 0.0) + p.alpha * acc[j];
  }
}
