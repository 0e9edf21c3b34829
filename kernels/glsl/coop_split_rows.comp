#version 450
// The activations of the tensor-core Q4_0 GEMM (q4_0_gemm_coop.comp with A_SPLIT), made once per product
// instead of once per workgroup along N: row m of A [M, K] (row stride lda floats; K and lda multiples of 8) is
// scaled by s_m, its largest |value| brought near 2^13, and split into f16 hi + lo (split8 in q4_0_coop.glsl).
// Out, from uvec4 `base` on: run g of 8 values of row m as the uvec4 pair (hi, lo) at 2·(m·K/8 + g), then the
// M floats 1 / s_m. One workgroup per row.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "f16_split.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer Out { uvec4 o4[]; };
layout(std430, binding = 0) writeonly buffer OutF { float of[]; };
layout(std430, binding = 1) readonly buffer A { vec4 a4[]; };
layout(push_constant) uniform Push {
  uint M;
  uint K;
  uint lda;
  uint base;  // first uvec4 of the output
} p;

const uint MAX_SUBGROUPS = 64;
shared float part[MAX_SUBGROUPS];
shared float scale;

void main() {
  const uint m = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  if (m >= p.M) return;  // the whole workgroup: its barriers stay uniform
  const uint row = m * p.lda / 4u, runs = p.K / 8u;
  float amax = 0.0;
  for (uint k = t; k < p.K / 4u; k += gl_WorkGroupSize.x) {
    const vec4 v = abs(a4[row + k]);
    amax = max(amax, max(max(v.x, v.y), max(v.z, v.w)));
  }
  amax = subgroupMax(amax);
  if (subgroupElect()) part[gl_SubgroupID] = amax;
  barrier();
  if (t == 0u) {
    float v = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) v = max(v, part[g]);
    int e = 0;
    frexp(v, e);  // v = f · 2^e, f in [0.5, 1)
    e = v > 0.0 ? clamp(13 - e, -120, 120) : 0;
    scale = ldexp(1.0, e);
    of[4u * p.base + p.M * p.K + m] = ldexp(1.0, -e);
  }
  barrier();
  const float s = scale;
  for (uint g = t; g < runs; g += gl_WorkGroupSize.x) {
    uvec4 hi, lo;
    split8(a4[row + 2u * g] * s, a4[row + 2u * g + 1u] * s, hi, lo);
    const uint o = p.base + 2u * (m * runs + g);
    o4[o] = hi;
    o4[o + 1u] = lo;
  }
}
