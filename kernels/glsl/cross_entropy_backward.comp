#version 450
// dlogits for one vocabulary tile [T, n] (columns j0 .. j0+n-1):
//   d[t, j] = seed / n_counted · (exp(l[t, j] - lse[t]) - [labels[t] == j0 + j])  for counted rows, else 0
// (0 everywhere when no token is counted). in_place = 1 overwrites g, which holds the logits on entry (the
// vocab-tiled loss reuses its one tile); in_place = 0 adds d into g, reading the logits from `logits`.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer Logits { float logits[]; };
layout(std430, binding = 2) readonly buffer Labels { int labels[]; };
layout(std430, binding = 3) readonly buffer Stats { float st[]; };  // [3T + 1]: lse | s | z | n
layout(std430, binding = 4) readonly buffer Seed { float seed[]; };
layout(push_constant) uniform Push { uint T; uint n; uint j0; uint V; uint in_place; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.T * p.n) return;
  const uint t = i / p.n, j = i % p.n;
  const int label = labels[t];
  const float n_counted = st[3u * p.T];
  const bool counted = label >= 0 && label < int(p.V) && n_counted > 0.0;
  const float l = p.in_place != 0u ? g[i] : logits[i];
  const float onehot = label == int(p.j0 + j) ? 1.0 : 0.0;
  const float d = counted ? seed[0] / n_counted * (exp(l - st[t]) - onehot) : 0.0;
  if (p.in_place != 0u)
    g[i] = d;
  else
    g[i] += d;
}
