#version 450
// The activations f of autograd/ops/norm_rope_act.cpp and their gated forms f(gate) * up over n values, forward
// and backward. act: 0 silu(x) = x sigmoid(x); 1 gelu, tanh form: x (1 + tanh(k (x + 0.044715 x³))) / 2 with
// k = sqrt(2/π); 2 softcap(x) = cap tanh(x / cap). a = x or gate, b = up, dy = the output gradient.
// step: 0 o = f(a), 1 o = f(a) * b, 2 o += dy * f'(a), 3 o += dy * f'(a) * b, 4 o += dy * f(a).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(std430, binding = 3) readonly buffer DY { float dy[]; };
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

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  float f, df;
  value_and_grad(a[i], f, df);
  switch (p.step) {
    case 0u: o[i] = f; break;
    case 1u: o[i] = f * b[i]; break;
    case 2u: o[i] += dy[i] * df; break;
    case 3u: o[i] += dy[i] * df * b[i]; break;
    case 4u: o[i] += dy[i] * f; break;
  }
}
