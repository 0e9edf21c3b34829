#version 450
// Rotary position embedding of x [T, H*D], one invocation per rotated pair (T*H*D/2 of them). Token t sits at
// pos = pos_offset + t, or start[0] + t when has_start (a decode step's position, rewritten by the host before
// each run). Pair i < R/2 of each head turns by theta = pos * freq[i]; mode 0 ("norm") pairs (2i, 2i+1), mode 1
// ("neox") pairs (i, i + R/2): (a, b) -> mscale (a cos - b sin, a sin + b cos). R = n_rot rotated dims (R < D:
// partial rotary); the invocations of pairs i >= R/2 pass dims R + 2(i − R/2) and the next one through.
// Forward: sin_sign = 1, out = mscale R(theta) in. Backward: sin_sign = -1, accumulate = 1,
// out += mscale R(-theta) dy (the transpose of a scaled rotation).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer In { float x[]; };
layout(std430, binding = 2) readonly buffer Freqs { float freq[]; };
layout(std430, binding = 3) readonly buffer Start { int start[]; };
layout(push_constant) uniform Push {
  uint n_pairs; uint n_head; uint head_dim; uint mode; uint pos_offset; uint has_start; uint n_rot;
  float mscale; float sin_sign; uint accumulate;
} p;

// 2π in two parts: TWO_PI_HI has 8 significant bits, so k * TWO_PI_HI is exact for |k| < 2^16 and theta keeps
// its f32 accuracy when reduced to [-π, π] (GPU sin/cos are only guaranteed accurate there).
const float TWO_PI_HI = 6.28125;
const float TWO_PI_LO = 1.9353071795864769e-3;

void main() {
  const uint g = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (g >= p.n_pairs) return;
  const uint half_d = p.head_dim / 2u, per_token = p.n_head * half_d;
  const uint t = g / per_token, h = (g % per_token) / half_d, i = g % half_d;

  const uint head = (t * p.n_head + h) * p.head_dim;
  if (2u * i >= p.n_rot) {  // past the rotated dims: through
    const uint d = head + p.n_rot + 2u * (i - p.n_rot / 2u);
    if (p.accumulate != 0u) {
      o[d] += x[d];
      o[d + 1u] += x[d + 1u];
    } else {
      o[d] = x[d];
      o[d + 1u] = x[d + 1u];
    }
    return;
  }
  const uint first = p.has_start != 0u ? uint(max(start[0], 0)) : p.pos_offset;
  const float theta = float(first + t) * freq[i];
  const float k = round(theta * 0.15915494309189535);
  precise const float r = (theta - k * TWO_PI_HI) - k * TWO_PI_LO;
  const float c = p.mscale * cos(r), s = p.mscale * p.sin_sign * sin(r);

  const uint ia = head + (p.mode == 0u ? 2u * i : i);
  const uint ib = ia + (p.mode == 0u ? 1u : p.n_rot / 2u);
  const float a = x[ia], b = x[ib];
  const float ya = a * c - b * s, yb = a * s + b * c;
  if (p.accumulate != 0u) {
    o[ia] += ya;
    o[ib] += yb;
  } else {
    o[ia] = ya;
    o[ib] = yb;
  }
}
