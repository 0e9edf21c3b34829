#version 450
// y[T, C] = table[ids[t], :], the table [V, C] stored as FORMAT (built per format by its variant: FORMAT_F32, or a
// unit format of wunit.glsl, each weight in f32 as GGML dequantises it; Q6_K in the grouped layout of q6_k.glsl).
// F32, F16 and BF16 take one weight per invocation (any C); the other formats one unit of 32 weights (C a multiple
// of 32, of 256 for the K-quants and IQ4_XS), so only the first T·C / 32 invocations of the dispatch (one per
// weight, as for F32) work. An id outside [0, V) is clamped to the nearest row: a shader cannot throw, and the CPU
// backend reports such ids as an error instead. The push block is the host's EmbeddingPush as ever; its `format`
// is no longer read (the variant fixes the format) but keeps its place.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifndef FORMAT
#error "embedding_forward.comp is built per format: FORMAT comes from its variant (kernels/CMakeLists.txt)"
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 0) writeonly buffer Y4 { vec4 y4[]; };
layout(std430, binding = 1) readonly buffer W1 { uint wq1[]; };  // f32 bits, raw blocks or halves
layout(std430, binding = 1) readonly buffer W4 { uvec4 wq4[]; };
layout(std430, binding = 2) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Push { uint T; uint C; uint V; uint format; } p;

#include "formats.glsl"
#if FORMAT != FORMAT_F32
#define UNIT_F32_ONLY
#define UNIT_SHARED_TABLE
#include "wunit.glsl"
#endif

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
#if FORMAT == FORMAT_F32 || FORMAT == FORMAT_F16 || FORMAT == FORMAT_BF16
  if (i >= p.T * p.C) return;
  const uint t = i / p.C, c = i % p.C;
  const uint e = uint(clamp(ids[t], 0, int(p.V) - 1)) * p.C + c;  // element index in the table
#if FORMAT == FORMAT_F32
  y[i] = uintBitsToFloat(wq1[e]);
#elif FORMAT == FORMAT_F16
  y[i] = unpackHalf2x16(wq1[e >> 1u])[e & 1u];
#else
  y[i] = bf16_pair(wq1[e >> 1u])[e & 1u];
#endif
#else
  unit_setup();
  barrier();  // unit_setup's table (the whole workgroup gets here)
  const uint units = p.C / 32u;
  if (i >= p.T * units) return;
  const uint t = i / units, u = i % units;
  vec4 f[8];
  unit_decode_f32(unit_fetch(uint(clamp(ids[t], 0, int(p.V) - 1)), u, 0u, p.C), f);
  [[unroll]] for (uint e = 0u; e < 8u; ++e) y4[8u * i + e] = f[e];
#endif
}
