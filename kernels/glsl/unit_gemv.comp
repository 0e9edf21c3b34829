#version 450
// y[n_out] = W[n_out, n_in] · x[n_in] for one token, W in any unit format (wunit.glsl; FORMAT set by the variant),
// in f32: the weights as GGML dequantises them times x, summed in f32 (unit_dot_f32, which factors the scales out
// of the sums, so the rounding is not that of summing unit_decode_f32's products one by one).
//
// A workgroup (number y·gridX + x, so more than 65535 row groups fit) owns NUM_ROWS consecutive rows. Its
// invocations walk the row's pieces (a unit, or a part of one for the formats read in parts) with a stride of the
// workgroup size, so that neighbouring invocations read neighbouring bytes. An invocation keeps the loads of two
// steps in flight: the units of its next piece in all NUM_ROWS rows are issued before the current ones are
// decoded. It reads its piece's activations once for all NUM_ROWS rows and adds each row's Σ w·x (unit_dot_f32:
// from the codes with the scales factored out where the format has them). Sums: subgroupAdd, then across
// subgroups through shared memory; nothing depends on the subgroup size. n_in is a multiple of 32 (256 for the
// K-quants and IQ4_XS).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#ifndef FORMAT
#error "unit_gemv.comp is built per format: FORMAT comes from its variant (kernels/CMakeLists.txt)"
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NUM_ROWS = 2;
const uint MAX_SUBGROUPS = 64;

layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W1 { uint wq1[]; };
layout(std430, binding = 1) readonly buffer W4 { uvec4 wq4[]; };
layout(std430, binding = 2) readonly buffer X { vec4 x4[]; };
layout(push_constant) uniform Push { uint n_out; uint n_in; } p;

#define UNIT_F32_ONLY
#define UNIT_SHARED_TABLE
#include "wunit.glsl"

const uint XV = 2u * UNIT_VECS;  // vec4s of activations per piece
const uint WG = gl_WorkGroupSize.x;
shared float partial[NUM_ROWS * MAX_SUBGROUPS];

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barriers below stay uniform
  unit_setup();
  barrier();  // unit_setup's table
  const uint t = gl_LocalInvocationID.x, pieces = p.n_in / 32u * UNIT_PARTS;

  float acc[NUM_ROWS];
  [[unroll]] for (uint r = 0u; r < NUM_ROWS; ++r) acc[r] = 0.0;
  WUnit next[NUM_ROWS];  // the units of the piece after this step's (clamped to the last piece)
  {
    const uint pn = min(t, pieces - 1u);
    [[unroll]] for (uint r = 0u; r < NUM_ROWS; ++r)
      next[r] = unit_fetch(min(row0 + r, p.n_out - 1u), pn / UNIT_PARTS, pn % UNIT_PARTS, p.n_in);
  }
  for (uint pc = t; pc < pieces; pc += WG) {
    WUnit w[NUM_ROWS];
    [[unroll]] for (uint r = 0u; r < NUM_ROWS; ++r) w[r] = next[r];
    const uint pn = min(pc + WG, pieces - 1u);
    [[unroll]] for (uint r = 0u; r < NUM_ROWS; ++r)
      next[r] = unit_fetch(min(row0 + r, p.n_out - 1u), pn / UNIT_PARTS, pn % UNIT_PARTS, p.n_in);
    vec4 xv[XV];
    [[unroll]] for (uint e = 0u; e < XV; ++e) xv[e] = x4[pc * XV + e];
    vec2 sx = vec2(0.0);  // Σ x over the piece's halves (unit_dot_f32 of the formats with codes)
    [[unroll]] for (uint e = 0u; e < XV; ++e) sx[2u * e / XV] += (xv[e].x + xv[e].y) + (xv[e].z + xv[e].w);
    [[unroll]] for (uint r = 0u; r < NUM_ROWS; ++r) acc[r] += unit_dot_f32(w[r], xv, sx);
  }

  [[unroll]] for (uint r = 0u; r < NUM_ROWS; ++r) {
    const float s = subgroupAdd(acc[r]);
    if (subgroupElect()) partial[r * MAX_SUBGROUPS + gl_SubgroupID] = s;
  }
  barrier();
  if (t < NUM_ROWS) {
    float s = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) s += partial[t * MAX_SUBGROUPS + g];
    if (row0 + t < p.n_out) y[row0 + t] = s;
  }
}
