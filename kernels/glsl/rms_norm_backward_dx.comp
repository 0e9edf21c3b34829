#version 450
// rms_norm backward into x [rows, cols]: one workgroup per row. With r = rstd[row] from the forward,
//   dx[c] += r w[c] dy[c] - x[c] r³/cols Σ_j dy[j] w[j] x[j]
// (the second term is the path through r, dr/dx[c] = -r³ x[c] / cols).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

#define RMS_WG 256u
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer DX { float dx[]; };
layout(std430, binding = 1) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer W { float w[]; };
layout(std430, binding = 4) readonly buffer Rstd { float rstd[]; };
layout(push_constant) uniform Push { uint rows; uint cols; float eps; } p;

#include "rms_norm_row_sum.glsl"

void main() {
  const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  if (row >= p.rows) return;  // the whole workgroup leaves together, before any barrier
  const uint base = row * p.cols;
  float d = 0.0;
  for (uint c = gl_LocalInvocationIndex; c < p.cols; c += RMS_WG) d += dy[base + c] * w[c] * x[base + c];
  const float r = rstd[row];
  const float k = r * r * r * row_sum(d) / float(p.cols);
  for (uint c = gl_LocalInvocationIndex; c < p.cols; c += RMS_WG)
    dx[base + c] += r * w[c] * dy[base + c] - k * x[base + c];
}
