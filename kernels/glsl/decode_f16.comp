#version 450
// Rows w_row0 .. w_row0 + rows of a frozen W [.., n_in] decoded to f16 (n_in a multiple of 32) in k-panels: panel
// u holds columns 32u .. 32u + 31 of every row, 64 bytes a row, as the mixed-precision GEMM reads W with W_PANELS
// (a product that decodes W once instead of each tile in its main loop). One invocation per 32-weight unit
// (wunit.glsl), the rows of a panel side by side, so that the writes are contiguous.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 128) in;
layout(std430, binding = 0) writeonly buffer O4 { uvec4 o4[]; };
layout(std430, binding = 1) readonly buffer W1 { uint wq1[]; };
layout(std430, binding = 1) readonly buffer W4 { uvec4 wq4[]; };
layout(push_constant) uniform Push {
  uint rows, n_in, w_row0;
  uint out_base;  // the output's first uvec4
} p;
#include "wunit.glsl"

void main() {
  const uint g = gl_GlobalInvocationID.x + 65535u * 128u * gl_WorkGroupID.y, units = p.n_in / 32u;
  if (g >= p.rows * units) return;
  const uint r = g % p.rows, u = g / p.rows;
  [[unroll]] for (uint part = 0u; part < UNIT_PARTS; ++part) {
    uvec4 h[UNIT_VECS];
    unit_decode(unit_fetch(p.w_row0 + r, u, part, p.n_in), h);
    [[unroll]] for (uint e = 0u; e < UNIT_VECS; ++e)
      o4[p.out_base + 4u * (u * p.rows + r) + part * UNIT_VECS + e] = h[e];
  }
}
