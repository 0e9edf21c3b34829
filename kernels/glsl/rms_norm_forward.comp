#version 450
// rms_norm forward over x [rows, cols], w [cols]: one workgroup per row (rows spread over x and y of the grid).
// rstd[row] = 1 / sqrt(mean(x[row]²) + eps) is kept for the backward; y[row, c] = x[row, c] * rstd[row] * w[c].
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

#define RMS_WG 256u
layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) writeonly buffer Rstd { float rstd[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer W { float w[]; };
layout(push_constant) uniform Push { uint rows; uint cols; float eps; } p;

#include "rms_norm_row_sum.glsl"

void main() {
  const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  if (row >= p.rows) return;  // the whole workgroup leaves together, before any barrier
  const uint base = row * p.cols;
  float ss = 0.0;
  for (uint c = gl_LocalInvocationIndex; c < p.cols; c += RMS_WG) ss += x[base + c] * x[base + c];
  const float r = inversesqrt(row_sum(ss) / float(p.cols) + p.eps);
  if (gl_LocalInvocationIndex == 0u) rstd[row] = r;
  for (uint c = gl_LocalInvocationIndex; c < p.cols; c += RMS_WG) y[base + c] = x[base + c] * r * w[c];
}
