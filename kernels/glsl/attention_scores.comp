#version 450
// Causal attention scores, written into P [H, T, T] (the softmax then runs in place):
//   P[h, i, j] = s · q[i, h*D : h*D+D] · k[j, hk*D : hk*D+D]   for j ≤ i, hk = h / (H / Hkv), s = 1/sqrt(D).
// q [T, H*D], k [T, Hkv*D]. One invocation per (h, i, j); entries j > i are left as they are (never read).
// Segmented (u.segmented != 0): seg [T] i32 ids packed examples, and only j ≤ i with seg[j] == seg[i] is scored;
// the other entries are likewise never written nor read by any attention kernel. Unsegmented, binding 3 is an
// unread stand-in (q's buffer).
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer K { float k[]; };
layout(std430, binding = 3) readonly buffer Seg { int seg[]; };
layout(push_constant) uniform Push { uint T; uint H; uint Hkv; uint D; float s; uint accumulate; uint segmented; } u;

void main() {
  const uint n = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
  if (n >= u.H * u.T * u.T) return;
  const uint j = n % u.T, i = (n / u.T) % u.T, h = n / (u.T * u.T);
  if (j > i || (u.segmented != 0u && seg[j] != seg[i])) return;
  const uint hk = h / (u.H / u.Hkv);
  const uint qo = i * u.H * u.D + h * u.D, ko = j * u.Hkv * u.D + hk * u.D;
  float acc = 0.0;
  for (uint d = 0u; d < u.D; ++d) acc += q[qo + d] * k[ko + d];
  p[n] = u.s * acc;
}
