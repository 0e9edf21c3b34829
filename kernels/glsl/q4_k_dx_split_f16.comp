#version 450
// The one-token Q4_K dx split pass of q4_k_dx_split.glsl with the codes decoded through f16 pairs, on devices
// with f16 arithmetic.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define Q4_K_DX_F16
#include "q4_k_dx_split.glsl"
