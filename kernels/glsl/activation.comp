#version 450
// The activations f of autograd/ops/norm_rope_act.cpp and their gated forms f(gate) * up over n values, forward
// and backward. act: 0 silu(x) = x sigmoid(x); 1 gelu, tanh form: x (1 + tanh(k (x + 0.044715 x³))) / 2 with
// k = sqrt(2/π); 2 softcap(x) = cap tanh(x / cap). a = x or gate, b = up, dy = the output gradient.
// step: 0 o = f(a), 1 o = f(a) * b, 2 o += dy * f'(a), 3 o += dy * f'(a) * b, 4 o += dy * f(a).
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(std430, binding = 3) readonly buffer DY { float dy[]; };
layout(std430, binding = 0) buffer Out4 { vec4 o4[]; };
layout(std430, binding = 1) readonly buffer A4 { vec4 a4[]; };
layout(std430, binding = 2) readonly buffer B4 { vec4 b4[]; };
layout(std430, binding = 3) readonly buffer DY4 { vec4 dy4[]; };
layout(constant_id = 0) const bool VEC4 = false;  // n a multiple of 4, counted in vec4s: 4 values per invocation
layout(push_constant) uniform Push { uint n; uint step; uint act; float cap; } p;

const float GELU_K = 0.7978845608028654, GELU_C = 0.044715;

// tanh without the overflow of (e^2x − 1) / (e^2x + 1) at large |x|.
float tanh_safe(float x) {
  const float e = exp(-2.0 * abs(x));
  return sign(x) * (1.0 - e) / (1.0 + e);
}

void value_and_grad(float x, out float f, out float df) {
  if (p.act == 0u) {
    const float s = 1.0 / (1.0 + exp(-x));  // exp(-x) = inf for x < -88 gives s = 0, not NaN
    f = x * s;
    df = s * (1.0 + x * (1.0 - s));
  } else if (p.act == 1u) {
    const float t = tanh_safe(GELU_K * (x + GELU_C * x * x * x));
    f = 0.5 * x * (1.0 + t);
    df = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
  } else {
    const float t = tanh_safe(x / p.cap);
    f = p.cap * t;
    df = 1.0 - t * t;
  }
}

// Step p.step of one value: its a, b, dy and o.
float step_at(float ai, float bi, float dyi, float oi) {
  float f, df;
  value_and_grad(ai, f, df);
  switch (p.step) {
    case 0u: return f;
    case 1u: return f * bi;
    case 2u: return oi + dyi * df;
    case 3u: return oi + dyi * df * bi;
    default: return oi + dyi * f;
  }
}

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  const bool reads_b = p.step == 1u || p.step == 3u, reads_o = p.step >= 2u;
  if (VEC4) {
    const vec4 av = a4[i], bv = reads_b ? b4[i] : vec4(0.0), dv = reads_o ? dy4[i] : vec4(0.0);
    const vec4 ov = reads_o ? o4[i] : vec4(0.0);
    vec4 r;
    [[unroll]] for (uint e = 0u; e < 4u; ++e) r[e] = step_at(av[e], bv[e], dv[e], ov[e]);
    o4[i] = r;
    return;
  }
  o[i] = step_at(a[i], reads_b ? b[i] : 0.0, reads_o ? dy[i] : 0.0, reads_o ? o[i] : 0.0);
}
