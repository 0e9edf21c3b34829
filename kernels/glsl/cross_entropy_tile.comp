#version 450
// One vocabulary tile of the online log-sum-exp: logits [T, n] hold the vocabulary columns j0 .. j0+n-1.
// stats [3T + 1] (see autograd/ops/embedding_loss.cpp): m[t] running max, s[t] running Σ exp(l - m),
// z[t] the logit of the label (when the label falls in this tile). first = 1 starts the rows afresh.
// One workgroup per row; max and sum are tree reductions in shared memory (fixed order, deterministic).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Stats { float st[]; };
layout(std430, binding = 1) readonly buffer Logits { float logits[]; };
layout(std430, binding = 2) readonly buffer Labels { int labels[]; };
layout(push_constant) uniform Push { uint T; uint n; uint j0; uint first; } p;

shared float red[64];

void reduce(bool take_max) {
  const uint i = gl_LocalInvocationID.x;
  for (uint w = 32u; w > 0u; w >>= 1u) {
    barrier();
    if (i < w) red[i] = take_max ? max(red[i], red[i + w]) : red[i] + red[i + w];
  }
  barrier();
}

void main() {
  const uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  if (t >= p.T) return;  // whole workgroups only: t is uniform
  const uint i = gl_LocalInvocationID.x, row = t * p.n;

  float m = -3.402823e38;
  for (uint j = i; j < p.n; j += 64u) m = max(m, logits[row + j]);
  red[i] = m;
  reduce(true);
  const float tile_max = red[0];
  const float m_old = p.first != 0u ? tile_max : st[t];
  const float m_new = max(m_old, tile_max);

  float s = 0.0;
  for (uint j = i; j < p.n; j += 64u) s += exp(logits[row + j] - m_new);
  barrier();  // everyone has read red[0] before it is overwritten
  red[i] = s;
  reduce(false);
  if (i != 0u) return;

  const float s_old = p.first != 0u ? 0.0 : st[p.T + t] * exp(m_old - m_new);
  st[t] = m_new;
  st[p.T + t] = s_old + red[0];
  const int label = labels[t];
  if (p.first != 0u) st[2u * p.T + t] = 0.0;
  if (label >= int(p.j0) && label < int(p.j0 + p.n)) st[2u * p.T + t] = logits[row + uint(label) - p.j0];
}
