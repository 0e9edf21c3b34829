#version 450
// Rows w_row0 .. w_row0 + rows of a frozen W [.., n_in] decoded to f16 (n_in a multiple of 32) in k-panels: panel
// u holds columns 32u .. 32u + 31 of every row, 64 bytes a row, as the mixed-precision GEMM reads W with W_PANELS
// (a product that decodes W once instead of each tile in its main loop). One invocation per 32-weight unit
// (wunit.glsl); a workgroup takes a tile of TILE_ROWS rows by 128 / TILE_ROWS units, rows fastest. With STAGED the
// tile passes through shared memory, where it already lies as in the panels, and each store instruction of a
// subgroup writes 512 contiguous bytes (docs/mixed-precision.md, "The decode").
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 128) in;
layout(constant_id = 0) const uint TILE_ROWS = 8u;  // a power of two, 1 .. 128 (mixed_kernels.cpp sets it)
layout(constant_id = 1) const bool STAGED = true;
layout(std430, binding = 0) writeonly buffer O4 { uvec4 o4[]; };
layout(std430, binding = 1) readonly buffer W1 { uint wq1[]; };
layout(std430, binding = 1) readonly buffer W4 { uvec4 wq4[]; };
layout(push_constant) uniform Push {
  uint rows, n_in, w_row0;
  uint out_base;  // the output's first uvec4
} p;
#include "wunit.glsl"

shared uvec4 tile[128u * 4u];  // unit i of the tile at 4i .. 4i + 3 (i = TILE_ROWS·u + r)

void main() {
  const uint wg = gl_WorkGroupID.x + 65535u * gl_WorkGroupID.y, i = gl_LocalInvocationIndex, units = p.n_in / 32u;
  const uint row_tiles = (p.rows + TILE_ROWS - 1u) / TILE_ROWS;
  const uint r0 = (wg % row_tiles) * TILE_ROWS, u0 = (wg / row_tiles) * (128u / TILE_ROWS);
  const uint r = r0 + i % TILE_ROWS, u = u0 + i / TILE_ROWS;
  if (u0 >= units) return;  // the whole workgroup: the y-spread's last row of groups
  if (r < p.rows && u < units)
    [[unroll]] for (uint part = 0u; part < UNIT_PARTS; ++part) {
      uvec4 h[UNIT_VECS];
      unit_decode(unit_fetch(p.w_row0 + r, u, part, p.n_in), h);
      [[unroll]] for (uint e = 0u; e < UNIT_VECS; ++e) {
        const uint v = part * UNIT_VECS + e;
        if (STAGED) tile[4u * i + v] = h[e];
        else o4[p.out_base + 4u * (u * p.rows + r) + v] = h[e];
      }
    }
  if (!STAGED) return;
  barrier();
  // Panel u0 + j of the tile is tile[4·TILE_ROWS·j ..], its rows r0 .. r0 + TILE_ROWS - 1 contiguous in the output.
  const uint live = 4u * min(TILE_ROWS, p.rows - r0);
  [[unroll]] for (uint k = 0u; k < 4u; ++k) {
    const uint v = 128u * k + i, j = v / (4u * TILE_ROWS), within = v % (4u * TILE_ROWS);
    if (u0 + j < units && within < live) o4[p.out_base + 4u * ((u0 + j) * p.rows + r0) + within] = tile[v];
  }
}
