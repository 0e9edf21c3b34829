#version 450
// Inverted dropout over n values: out = in * keep(i) * scale, or out += it (the backward, with in = dy).
// keep(i) = (hash(i) >> 8) >= threshold with hash(i) = pcg(pcg(i + k1) ^ k2); the keys and the threshold
// ceil(p * 2^24) come from the host, which draws the same mask on the CPU with the same integer arithmetic.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer In { float x[]; };
layout(std430, binding = 2) readonly buffer Salt { int salt[]; };
layout(push_constant) uniform Push { uint n; uint threshold; uint k1; uint k2; float scale; uint accumulate; uint salted; } p;

// PCG output permutation of a 32-bit value (Jarzynski & Olano 2020), as pcg_hash in norm_rope_act.cpp.
uint pcg_hash(uint v) {
  const uint state = v * 747796405u + 2891336453u;
  const uint word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  uint k1 = p.k1, k2 = p.k2;
  if (p.salted != 0u) {
    k1 = pcg_hash(k1 ^ uint(salt[0]));
    k2 = pcg_hash(k2 ^ uint(salt[1]));
  }
  const bool keep = (pcg_hash(pcg_hash(i + k1) ^ k2) >> 8u) >= p.threshold;
  const float v = keep ? x[i] * p.scale : 0.0;
  if (p.accumulate != 0u) o[i] += v;
  else o[i] = v;
}
