#version 450
// The f16 operand A of the mixed-precision GEMM (mixed_gemm.comp) from f32 rows: out[m, 0 : KP) = 2^e_m · in[m,
// col0 : col0 + K), zero from K on (KP = 32·panels), and s[m] = 2^-e_m, stored in k-panels: panel q holds columns
// 32q .. 32q + 31 of rows 0 .. M (64 bytes each), so that a GEMM's K step reads one contiguous piece. The
// power of two brings the row's largest |value| into [2^14, 2^15): no f16 overflow however large the row (a
// layer's activations) and no flush to zero however small (the gradients that enter a dx), since f16 keeps
// 11 significant bits from 2^-14 up. An all-zero row keeps e = 0, and so does a row holding Inf; Inf and NaN
// pass through the conversion, so the product carries them on to the loss's checks. The GEMM multiplies its f32
// sums by s[m], exactly.
// One workgroup per row (x, then y past 65535 rows); each invocation issues UNROLL loads before it waits for one
// (docs/mixed-precision.md, "The f16 rows").
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 128) in;
layout(constant_id = 0) const uint UNROLL = 4u;
layout(std430, binding = 0) writeonly buffer O4 { uvec4 o4[]; };
layout(std430, binding = 0) writeonly buffer OF { float of[]; };
layout(std430, binding = 1) readonly buffer I1 { float x[]; };
layout(std430, binding = 1) readonly buffer I4 { vec4 x4[]; };
layout(push_constant) uniform Push {
  uint M, K;
  uint lda;      // input row stride in floats
  uint col0;     // first input column
  uint out_base; // the panels' first uvec4
  uint panels;   // KP / 32
  uint s_base;   // the factors' first float
} p;

shared float part[128];

// Input values k .. k + 3 of the row at `base` (floats); past K, zeros. Rows and columns on 16 bytes read as vec4s.
vec4 load4(uint base, uint k, bool aligned) {
  if (aligned && k + 4u <= p.K) return x4[(base + k) >> 2u];
  vec4 v = vec4(0.0);
  [[unroll]] for (uint i = 0u; i < 4u; ++i)
    if (k + i < p.K) v[i] = x[base + k + i];
  return v;
}

void main() {
  const uint row = gl_WorkGroupID.x + 65535u * gl_WorkGroupID.y;
  if (row >= p.M) return;
  const uint t = gl_LocalInvocationID.x, base = row * p.lda + p.col0;
  const bool aligned = (base & 3u) == 0u;
  float amax = 0.0;
  for (uint k0 = 4u * t; k0 < p.K; k0 += 512u * UNROLL) {
    vec4 v[UNROLL];
    [[unroll]] for (uint i = 0u; i < UNROLL; ++i) v[i] = abs(load4(base, k0 + 512u * i, aligned));
    [[unroll]] for (uint i = 0u; i < UNROLL; ++i) amax = max(amax, max(max(v[i].x, v[i].y), max(v[i].z, v[i].w)));
  }
  part[t] = subgroupMax(amax);
  barrier();
  if (t == 0u) {
    float m = 0.0;
    for (uint i = 0u; i < 128u; i += gl_SubgroupSize) m = max(m, part[i]);
    part[0] = m;
  }
  barrier();
  const float rmax = part[0];
  int e = 0;
  if (rmax > 0.0 && !isinf(rmax)) {
    int x2;
    frexp(rmax, x2);  // rmax = f·2^x2, f in [0.5, 1)
    e = clamp(15 - x2, -126, 126);
  }
  const float sc = ldexp(1.0, e);
  for (uint g0 = t; g0 < 4u * p.panels; g0 += 128u * UNROLL) {
    vec4 a[UNROLL], b[UNROLL];
    [[unroll]] for (uint i = 0u; i < UNROLL; ++i) {
      a[i] = load4(base, 8u * (g0 + 128u * i), aligned);
      b[i] = load4(base, 8u * (g0 + 128u * i) + 4u, aligned);
    }
    [[unroll]] for (uint i = 0u; i < UNROLL; ++i) {
      const uint g = g0 + 128u * i;
      if (g >= 4u * p.panels) break;
      const vec4 as = a[i] * sc, bs = b[i] * sc;
      o4[p.out_base + 4u * (g / 4u) * p.M + 4u * row + g % 4u] =
          uvec4(packHalf2x16(as.xy), packHalf2x16(as.zw), packHalf2x16(bs.xy), packHalf2x16(bs.zw));
    }
  }
  if (t == 0u) of[p.s_base + row] = ldexp(1.0, -e);
}
