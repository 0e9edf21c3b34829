#version 450
// Ends the online log-sum-exp: lse[t] = m[t] + log(s[t]) (written over m), n = the number of counted tokens
// (labels in [0, V); -100 and, on the GPU, any other out-of-range label are not counted) and
// loss[0] = Σ_counted (lse[t] - z[t]) / n, or 0 when n = 0. One workgroup; each invocation sums a strided set
// of rows in order, then a tree reduction in shared memory (deterministic).
layout(local_size_x = 256) in;
layout(std430, binding = 0) writeonly buffer Loss { float loss[]; };
layout(std430, binding = 1) buffer Stats { float st[]; };  // [3T + 1]: m | s | z | n
layout(std430, binding = 2) readonly buffer Labels { int labels[]; };
layout(push_constant) uniform Push { uint T; uint V; } p;

shared float red_loss[256];
shared float red_n[256];

void main() {
  const uint i = gl_LocalInvocationID.x;
  float sum = 0.0, n = 0.0;
  for (uint t = i; t < p.T; t += 256u) {
    const float lse = st[t] + log(st[p.T + t]);
    st[t] = lse;
    const int label = labels[t];
    if (label >= 0 && label < int(p.V)) {
      sum += lse - st[2u * p.T + t];
      n += 1.0;
    }
  }
  red_loss[i] = sum;
  red_n[i] = n;
  for (uint w = 128u; w > 0u; w >>= 1u) {
    barrier();
    if (i < w) {
      red_loss[i] += red_loss[i + w];
      red_n[i] += red_n[i + w];
    }
  }
  barrier();
  if (i != 0u) return;
  st[3u * p.T] = red_n[0];
  loss[0] = red_n[0] > 0.0 ? red_loss[0] / red_n[0] : 0.0;
}
