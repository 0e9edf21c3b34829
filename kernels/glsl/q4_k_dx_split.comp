#version 450
// The one-token Q4_K dx split pass of q4_k_dx_split.glsl with the codes decoded as f32: for devices without f16
// arithmetic (the others run q4_k_dx_split_f16.comp).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "q4_k_dx_split.glsl"
