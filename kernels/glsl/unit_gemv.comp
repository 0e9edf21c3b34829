#version 450
// y[n_out] = W[n_out, n_in] · x[n_in] for one token, W in any unit format (wunit.glsl; FORMAT set by the variant),
// in f32: each weight as GGML dequantises it (unit_decode_f32), multiplied by x and summed in f32.
//
// A workgroup (number y·gridX + x, so more than 65535 row groups fit) owns NUM_ROWS consecutive rows. Its
// invocations walk the row's pieces (a unit, or a part of one for the formats read in parts) with a stride of the
// workgroup size, so that neighbouring invocations read neighbouring bytes. Each step an invocation issues the loads
// of its piece in all NUM_ROWS rows first; meanwhile the workgroup stages the step's activations through shared
// memory (read contiguously, then each invocation takes its piece's, swizzled so that neither side conflicts),
// which it then uses for all NUM_ROWS rows. Sums: subgroupAdd, then across subgroups through shared memory;
// nothing depends on the subgroup size. n_in is a multiple of 32 (256 for the K-quants and IQ4_XS).
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

const uint XV = 2u * UNIT_VECS;  // vec4s of activations (and of weights) per piece
const uint WG = gl_WorkGroupSize.x;
shared vec4 xs[XV * WG];  // vec4 e of the step's piece i at XV·i + (e ^ (i % XV))
shared float partial[NUM_ROWS * MAX_SUBGROUPS];

void main() {
  const uint row0 = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
  if (row0 >= p.n_out) return;  // whole workgroup: the barriers below stay uniform
  unit_setup();
  const uint t = gl_LocalInvocationID.x, pieces = p.n_in / 32u * UNIT_PARTS;

  vec4 acc[NUM_ROWS];
  for (uint r = 0u; r < NUM_ROWS; ++r) acc[r] = vec4(0.0);

  for (uint base = 0u; base < pieces; base += WG) {
    const uint pc = base + t;
    const bool ok = pc < pieces;
    const uint u = ok ? pc / UNIT_PARTS : 0u, part = pc % UNIT_PARTS;
    WUnit w[NUM_ROWS];
    for (uint r = 0u; r < NUM_ROWS; ++r) w[r] = unit_fetch(min(row0 + r, p.n_out - 1u), u, part, p.n_in);

    barrier();  // the last step's reads of xs are done
    [[unroll]] for (uint k = 0u; k < XV; ++k) {
      const uint idx = k * WG + t, i = idx / XV, e = idx % XV, g = base * XV + idx;
      xs[XV * i + (e ^ (i % XV))] = g < pieces * XV ? x4[g] : vec4(0.0);
    }
    barrier();
    if (!ok) continue;
    vec4 xv[XV];
    [[unroll]] for (uint e = 0u; e < XV; ++e) xv[e] = xs[XV * t + (e ^ (t % XV))];
    for (uint r = 0u; r < NUM_ROWS; ++r) {
      vec4 f[XV];
      unit_decode_f32(w[r], f);
      [[unroll]] for (uint e = 0u; e < XV; ++e) acc[r] = fma(f[e], xv[e], acc[r]);
    }
  }

  for (uint r = 0u; r < NUM_ROWS; ++r) {
    const float s = subgroupAdd((acc[r].x + acc[r].y) + (acc[r].z + acc[r].w));
    if (subgroupElect()) partial[r * MAX_SUBGROUPS + gl_SubgroupID] = s;
  }
  barrier();
  if (t < NUM_ROWS) {
    float s = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) s += partial[t * MAX_SUBGROUPS + g];
    if (row0 + t < p.n_out) y[row0 + t] = s;
  }
}
