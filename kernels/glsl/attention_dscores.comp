#version 450
// Softmax backward into dS [H, T, T] (the gradient of the scaled scores), for j ≤ i:
//   dS[h, i, j] = P[h, i, j] · (dP[h, i, j] - Σ_j' P[h, i, j'] dP[h, i, j']),   dP[h, i, j] = dO_i · v_j,
// and since Σ_j' P dO_i·v_j' = dO_i · O_i (O = P·v is the forward output), this is P · (dO_i · (v_j - O_i)):
// one dot product per entry, no row reduction. Vectors are head slices: dO_i, O_i of head h, v_j of kv head hk.
// P [H, T, T], dO and O [T, H*D], v [T, Hkv*D]. One invocation per (h, i, j); j > i is never read, nor (segmented,
// u.segmented != 0) j with seg[j] != seg[i].
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer DS { float ds[]; };
layout(std430, binding = 1) readonly buffer P { float p[]; };
layout(std430, binding = 2) readonly buffer DO { float dout[]; };
layout(std430, binding = 3) readonly buffer V { float v[]; };
layout(std430, binding = 4) readonly buffer O { float o[]; };
layout(std430, binding = 5) readonly buffer Seg { int seg[]; };
layout(push_constant) uniform Push { uint T; uint H; uint Hkv; uint D; float s; uint accumulate; uint segmented; } u;

void main() {
  const uint n = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
  if (n >= u.H * u.T * u.T) return;
  const uint j = n % u.T, i = (n / u.T) % u.T, h = n / (u.T * u.T);
  if (j > i || (u.segmented != 0u && seg[j] != seg[i])) return;
  const uint hk = h / (u.H / u.Hkv);
  const uint qo = i * u.H * u.D + h * u.D, vo = j * u.Hkv * u.D + hk * u.D;
  float acc = 0.0;
  for (uint d = 0u; d < u.D; ++d) acc += dout[qo + d] * (v[vo + d] - o[qo + d]);
  ds[n] = p[n] * acc;
}
