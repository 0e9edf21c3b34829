#version 450
// y[i, h*D + d] (+)= s · Σ_{j ≤ i} W[h, i, j] · X[j, hk*D + d],   hk = h / (H / Hkv):
// the forward out = P·v (W = P, X = v, s = 1) and the backward dq += dS·k / sqrt(D) (W = dS, X = k).
// y [T, H*D], W [H, T, T], X [T, Hkv*D]. One invocation per element of y (d fastest, so reads of X coalesce);
// j is summed in order. Segmented (u.segmented != 0), only keys j with seg[j] == seg[i] count (seg [T] i32).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer Seg { int seg[]; };
layout(push_constant) uniform Push { uint T; uint H; uint Hkv; uint D; float s; uint accumulate; uint segmented; } u;

void main() {
  const uint n = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
  if (n >= u.T * u.H * u.D) return;
  const uint d = n % u.D, h = (n / u.D) % u.H, i = n / (u.H * u.D);
  const uint hk = h / (u.H / u.Hkv);
  const uint wo = (h * u.T + i) * u.T, xo = hk * u.D + d, xs = u.Hkv * u.D;
  float acc = 0.0;
  for (uint j = 0u; j <= i; ++j)
    if (u.segmented == 0u || seg[j] == seg[i]) acc += w[wo + j] * x[j * xs + xo];
  y[n] = u.accumulate != 0u ? y[n] + u.s * acc : u.s * acc;
}
