#version 450
// One AdamW step over a parameter of n values, in place (decoupled weight decay, bias-corrected moments):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;  p -= lr (m/bc1) / (sqrt(v/bc2) + eps)
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t. The step-dependent scalars (lr, 1 - lr*wd, bc1, bc2) come from a small
// buffer the host rewrites before each submit, so the sequence is recorded once; the fixed ones are push
// constants (1 - b1 and 1 - b2 computed on the host in double, not from the rounded betas).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer M { float m[]; };
layout(std430, binding = 3) buffer V { float v[]; };
layout(std430, binding = 4) readonly buffer Step { float lr; float decay; float bc1; float bc2; } s;
layout(push_constant) uniform Push { uint n; float b1; float one_minus_b1; float b2; float one_minus_b2; float eps; } c;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= c.n) return;
  const float gi = g[i];
  const float mi = c.b1 * m[i] + c.one_minus_b1 * gi;
  const float vi = c.b2 * v[i] + c.one_minus_b2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float pi = p[i] * s.decay;
  p[i] = pi - s.lr * (mi / s.bc1) / (sqrt(vi / s.bc2) + c.eps);
}
