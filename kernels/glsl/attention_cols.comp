#version 450
// y[j, hk*D + d] += s · Σ_{h of kv head hk} Σ_{i ≥ j} W[h, i, j] · X[i, h*D + d]:
// the backward dk += dSᵀ·q / sqrt(D) (W = dS, X = q) and dv += Pᵀ·dO (W = P, X = dO, s = 1), where the
// G = H / Hkv query heads h = hk*G .. hk*G + G-1 that share kv head hk add up.
// y [T, Hkv*D], W [H, T, T], X [T, H*D]. One invocation per element of y, heads then i summed in order, so the
// sum over query heads needs no atomics. Segmented (u.segmented != 0), only queries i with seg[i] == seg[j] count.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer Seg { int seg[]; };
layout(push_constant) uniform Push { uint T; uint H; uint Hkv; uint D; float s; uint accumulate; uint segmented; } u;

void main() {
  const uint n = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
  if (n >= u.T * u.Hkv * u.D) return;
  const uint d = n % u.D, hk = (n / u.D) % u.Hkv, j = n / (u.Hkv * u.D);
  const uint G = u.H / u.Hkv, xs = u.H * u.D;
  float acc = 0.0;
  for (uint h = hk * G; h < hk * G + G; ++h)
    for (uint i = j; i < u.T; ++i)
      if (u.segmented == 0u || seg[i] == seg[j]) acc += w[(h * u.T + i) * u.T + j] * x[i * xs + h * u.D + d];
  y[n] += u.s * acc;
}
