#version 450
// Second pass of attention_flash_dkv.comp split over the G query heads of a kv head: dK[i] += Σ_g part[g, i] and
// dV[i] += Σ_g part[G + g, i], heads added in order (deterministic). flags: bit 0 dK, bit 1 dV.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer DK { float dk[]; };
layout(std430, binding = 1) buffer DV { float dv[]; };
layout(std430, binding = 2) readonly buffer Part { float part[]; };  // [2G, n]
layout(push_constant) uniform Push { uint n; uint G; uint flags; } p;

void main() {
  const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  if ((p.flags & 1u) != 0u) {
    float s = dk[i];
    for (uint g = 0u; g < p.G; ++g) s += part[g * p.n + i];
    dk[i] = s;
  }
  if ((p.flags & 2u) != 0u) {
    float s = dv[i];
    for (uint g = 0u; g < p.G; ++g) s += part[(p.G + g) * p.n + i];
    dv[i] = s;
  }
}
