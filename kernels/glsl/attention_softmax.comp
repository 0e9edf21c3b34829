#version 450
// In-place causal softmax of the scores in P [H, T, T]: row (h, i) covers j ≤ i (segmented: and seg[j] == seg[i],
// see attention_scores.comp; the diagonal always counts, so the sum is never empty) and becomes
//   P[h, i, j] = exp(S[h, i, j] - m) / Σ_{j' ≤ i} exp(S[h, i, j'] - m),   m = max_{j ≤ i} S[h, i, j].
// One workgroup of 64 per row: each invocation strides over j and only touches its own entries; the row max and
// sum are reduced in shared memory by a fixed tree, so the result does not depend on scheduling.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer Seg { int seg[]; };
layout(push_constant) uniform Push { uint T; uint H; uint Hkv; uint D; float s; uint accumulate; uint segmented; } u;

shared float red[64];

// max (take_max) or sum of x over the workgroup; called in uniform control flow.
bool attends(uint i, uint j) { return u.segmented == 0u || seg[j] == seg[i]; }

float workgroup_reduce(float x, bool take_max) {
  const uint t = gl_LocalInvocationID.x;
  red[t] = x;
  barrier();
  for (uint w = 32u; w > 0u; w >>= 1) {
    if (t < w) red[t] = take_max ? max(red[t], red[t + w]) : red[t] + red[t + w];
    barrier();
  }
  const float r = red[0];
  barrier();  // red is reused by the next reduction
  return r;
}

void main() {
  const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;  // h * T + i
  if (row >= u.H * u.T) return;  // whole workgroup: the barriers below stay uniform
  const uint i = row % u.T, base = row * u.T, t = gl_LocalInvocationID.x;

  float m = -3.402823466e38;
  for (uint j = t; j <= i; j += 64u)
    if (attends(i, j)) m = max(m, p[base + j]);
  m = workgroup_reduce(m, true);

  float sum = 0.0;
  for (uint j = t; j <= i; j += 64u) {
    if (!attends(i, j)) continue;
    const float e = exp(p[base + j] - m);
    p[base + j] = e;
    sum += e;
  }
  sum = workgroup_reduce(sum, false);

  for (uint j = t; j <= i; j += 64u)
    if (attends(i, j)) p[base + j] /= sum;
}
