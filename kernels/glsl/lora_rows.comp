#version 450
// The rank side of a LoRA adapter: C[M, R] (+)= α·X[M, K]·B, with B stored [R, K] (hs = s·xa·Aᵀ) or, B_KR, [K, R]
// (dh = s·dy·B). Bound by reading X once: each subgroup takes a pair of rows, its invocations striding K
// (neighbours read neighbouring values) with R partial sums per row each, then adds them across the subgroup in a
// fixed order (results do not depend on timing); 2 rows per subgroup, so 2·(256 / subgroup size) per workgroup.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint R = 16u;       // the rank
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

void main() {
  const uint S = gl_SubgroupSize, lane = gl_SubgroupInvocationID;
  const uint pair = (gl_WorkGroupID.x + 65535u * gl_WorkGroupID.y) * gl_NumSubgroups + gl_SubgroupID;
  const uint m0 = 2u * pair;
  if (m0 >= p.M) return;  // the whole subgroup
  const bool ok1 = m0 + 1u < p.M;
  float acc0[R], acc1[R];
  [[unroll]] for (uint j = 0u; j < R; ++j) {
    acc0[j] = 0.0;
    acc1[j] = 0.0;
  }
  for (uint k = lane; k < p.K; k += S) {
    const float x0 = x[m0 * p.ldx + k], x1 = ok1 ? x[(m0 + 1u) * p.ldx + k] : 0.0;
    [[unroll]] for (uint j = 0u; j < R; ++j) {
      const float bj = B_KR ? b[k * R + j] : b[j * p.K + k];
      acc0[j] = fma(x0, bj, acc0[j]);
      acc1[j] = fma(x1, bj, acc1[j]);
    }
  }
  [[unroll]] for (uint j = 0u; j < R; ++j) {
    const float s0 = subgroupAdd(acc0[j]), s1 = subgroupAdd(acc1[j]);
    if (j % S == lane) {
      c[m0 * R + j] = (p.accumulate != 0u ? c[m0 * R + j] : 0.0) + p.alpha * s0;
      if (ok1) c[(m0 + 1u) * R + j] = (p.accumulate != 0u ? c[(m0 + 1u) * R + j] : 0.0) + p.alpha * s1;
    }
  }
}
