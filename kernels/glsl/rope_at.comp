#version 450
// rope_rotate.comp with the positions read from a buffer: token t of x [T, H*D] sits at pos = start[0] + t, so
// one recorded decode step serves every position. One invocation per rotated pair; pair i of each head turns by
// theta = pos * base^(-2i/D), mode 0 ("norm") pairs (2i, 2i+1), mode 1 ("neox") pairs (i, i + D/2).
// Forward: sin_sign = 1, out = R(theta) in. Backward: sin_sign = -1, accumulate = 1, out += R(-theta) dy.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer In { float x[]; };
layout(std430, binding = 2) readonly buffer Start { int start[]; };
layout(push_constant) uniform Push {
  uint n_pairs; uint n_head; uint head_dim; uint mode;
  float log2_base; float sin_sign; uint accumulate;
} p;

// 2π in two parts, as in rope_rotate.comp: theta keeps its f32 accuracy when reduced to [-π, π].
const float TWO_PI_HI = 6.28125;
const float TWO_PI_LO = 1.9353071795864769e-3;

void main() {
  const uint g = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (g >= p.n_pairs) return;
  const uint half_d = p.head_dim / 2u, per_token = p.n_head * half_d;
  const uint t = g / per_token, h = (g % per_token) / half_d, i = g % half_d;

  const uint pos = uint(max(start[0], 0)) + t;
  const float theta = float(pos) * exp2(-float(2u * i) / float(p.head_dim) * p.log2_base);
  const float k = round(theta * 0.15915494309189535);
  precise const float r = (theta - k * TWO_PI_HI) - k * TWO_PI_LO;
  const float c = cos(r), s = p.sin_sign * sin(r);

  const uint head = (t * p.n_head + h) * p.head_dim;
  const uint ia = head + (p.mode == 0u ? 2u * i : i);
  const uint ib = ia + (p.mode == 0u ? 1u : half_d);
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
