#version 450
// Attention of T new queries over the KV cache, in one pass with an online softmax (no scores buffer):
//   out[t, h*D : h*D+D] = Σ_{j ≤ last} P_j v[j, hk*D : hk*D+D],  P = softmax_j(s · q[t, h*D : h*D+D] · k[j, hk*D : hk*D+D]),
// last = min(start + t, S - 1), hk = h / (H / Hkv), s = 1/sqrt(D). q, out [T, H*D]; k, v [S, Hkv*D]; D ≤ 256.
// One workgroup of 64 per row (h, t). Keys go in blocks of 64, one per invocation: its score, the block's max and
// sum (fixed-tree reductions in shared memory, so the result does not depend on scheduling), then every
// invocation adds the block's P_j v_j to its dims d = lane, lane + 64, ... after rescaling what it had by
// exp(m_old - m_new). Every loop is uniform over the workgroup (last depends on the row only).
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer K { float k[]; };
layout(std430, binding = 3) readonly buffer V { float v[]; };
layout(std430, binding = 4) readonly buffer Start { int start[]; };
// window: a query at position pos sees keys pos − window + 1 .. pos (0xFFFFFFFF: all); softcap > 0: scores
// become softcap·tanh(score / softcap).
layout(push_constant) uniform Push { uint T; uint S; uint H; uint Hkv; uint D; float s; uint window; float softcap; } u;

const uint MAX_D = 256u, DIMS_PER_LANE = MAX_D / 64u;
const float LOWEST = -3.402823466e38;

shared float qrow[MAX_D];
shared float prob[64];  // the current block's exp(score - m_new)
shared float red[64];

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
  const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;  // h * T + t
  if (row >= u.H * u.T) return;  // whole workgroup: the barriers below stay uniform
  const uint h = row / u.T, t = row % u.T, lane = gl_LocalInvocationID.x;
  const uint pos = uint(max(start[0], 0)) + t, last = min(pos, u.S - 1u);
  const uint first = u.window != 0xFFFFFFFFu && pos >= u.window ? pos - u.window + 1u : 0u;
  const uint qo = t * u.H * u.D + h * u.D, kvo = (h / (u.H / u.Hkv)) * u.D, ks = u.Hkv * u.D;

  for (uint d = lane; d < u.D; d += 64u) qrow[d] = q[qo + d];
  barrier();

  float m = LOWEST, l = 0.0;
  float acc[DIMS_PER_LANE];
  for (uint i = 0u; i < DIMS_PER_LANE; ++i) acc[i] = 0.0;
  for (uint j0 = first / 64u * 64u; j0 <= last; j0 += 64u) {
    const uint j = j0 + lane;
    const bool seen = j >= first && j <= last;
    float score = LOWEST;
    if (seen) {
      float dot = 0.0;
      for (uint d = 0u; d < u.D; ++d) dot += qrow[d] * k[j * ks + kvo + d];
      score = u.s * dot;
      if (u.softcap > 0.0) {  // cap·tanh(score / cap), tanh without overflow at large |x|
        const float x = score / u.softcap, e = exp(-2.0 * abs(x));
        score = u.softcap * sign(x) * (1.0 - e) / (1.0 + e);
      }
    }
    const float m_new = max(m, workgroup_reduce(score, true));
    const float p = seen ? exp(score - m_new) : 0.0;
    prob[lane] = p;
    const float block_sum = workgroup_reduce(p, false);  // its barriers also publish prob[]
    const float rescale = exp(m - m_new);
    l = l * rescale + block_sum;
    const uint n = min(64u, last - j0 + 1u);
    for (uint i = 0u; i < DIMS_PER_LANE; ++i) {
      const uint d = lane + 64u * i;
      if (d >= u.D) break;
      float a = acc[i] * rescale;  // prob[] is 0 for the keys before the window
      for (uint jj = 0u; jj < n; ++jj) a += prob[jj] * v[(j0 + jj) * ks + kvo + d];
      acc[i] = a;
    }
    m = m_new;
    barrier();  // prob[] is rewritten by the next block
  }
  for (uint i = 0u; i < DIMS_PER_LANE; ++i) {
    const uint d = lane + 64u * i;
    if (d < u.D) o[qo + d] = acc[i] / l;
  }
}
