#version 450
// The activations of the tensor-core Q4_0 GEMMs, scaled and split once per product instead of once per workgroup
// along N: row m of A [M, lda] over columns [k_begin, k_begin + K) is scaled by s_m, its largest |value| there
// brought near 2^13, and split into f16 hi + lo. Out, from uvec4 `base` on: run g of 8 values of row m as the
// uvec4 pair (hi, lo) at 2·(m·R + g) with R = ceil(K / 8) runs per row, then the M floats 1 / s_m. One
// workgroup per row.
// - DY = false (X of q4_0_gemm_coop.comp with A_SPLIT): k_begin 0, K and lda multiples of 8, runs in the order
//   0 2 1 3 4 6 5 7 of the forward GEMM's code tiles (split8);
// - DY = true (dY of q4_0_dx_coop.comp with A_SPLIT): any k_begin, K and lda; runs in order, the last one padded
//   with zeros.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "f16_split.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const bool DY = false;
layout(std430, binding = 0) writeonly buffer Out { uvec4 o4[]; };
layout(std430, binding = 0) writeonly buffer OutF { float of[]; };
layout(std430, binding = 1) readonly buffer A { vec4 a4[]; };
layout(std430, binding = 1) readonly buffer AF { float af[]; };
layout(push_constant) uniform Push {
  uint M;
  uint K;
  uint lda;
  uint base;  // first uvec4 of the output
  uint k_begin;
} p;

const uint MAX_SUBGROUPS = 64;
shared float part[MAX_SUBGROUPS];
shared float scale;

// Run g of row m (8 values from column k_begin + 8g on), scaled by s.
void load_run(uint m, uint g, float s, out vec4 a, out vec4 b) {
  if (!DY) {
    a = a4[(m * p.lda) / 4u + 2u * g] * s;
    b = a4[(m * p.lda) / 4u + 2u * g + 1u] * s;
    return;
  }
  float v[8];
  for (uint e = 0u; e < 8u; ++e) {
    const uint k = 8u * g + e;
    v[e] = k < p.K ? af[m * p.lda + p.k_begin + k] * s : 0.0;
  }
  a = vec4(v[0], v[1], v[2], v[3]);
  b = vec4(v[4], v[5], v[6], v[7]);
}

void main() {
  const uint m = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  if (m >= p.M) return;  // the whole workgroup: its barriers stay uniform
  const uint runs = (p.K + 7u) / 8u;
  float amax = 0.0;
  if (DY) {
    for (uint k = t; k < p.K; k += gl_WorkGroupSize.x) amax = max(amax, abs(af[m * p.lda + p.k_begin + k]));
  } else {
    for (uint k = t; k < p.K / 4u; k += gl_WorkGroupSize.x) {
      const vec4 v = abs(a4[(m * p.lda) / 4u + k]);
      amax = max(amax, max(max(v.x, v.y), max(v.z, v.w)));
    }
  }
  amax = subgroupMax(amax);
  if (subgroupElect()) part[gl_SubgroupID] = amax;
  barrier();
  if (t == 0u) {
    float v = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) v = max(v, part[g]);
    const int e = split_scale_exponent(v);
    scale = ldexp(1.0, e);
    of[4u * (p.base + 2u * p.M * runs) + m] = ldexp(1.0, -e);
  }
  barrier();
  const float s = scale;
  for (uint g = t; g < runs; g += gl_WorkGroupSize.x) {
    vec4 a, b;
    load_run(m, g, s, a, b);
    uvec4 hi, lo;
    if (DY)
      split8_in_order(a, b, hi, lo);
    else
      split8(a, b, hi, lo);
    const uint o = p.base + 2u * (m * runs + g);
    o4[o] = hi;
    o4[o + 1u] = lo;
  }
}
