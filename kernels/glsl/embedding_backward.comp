#version 450
// dtable[V, C] += scatter of dy[T, C] into rows ids[t]. One invocation per column c walks the tokens in order,
// so repeated ids add up in a fixed order (deterministic, no float atomics). Ids are clamped like the forward.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer DTable { float dtable[]; };
layout(std430, binding = 1) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Push { uint T; uint C; uint V; } p;

void main() {
  const uint c = gl_GlobalInvocationID.x;
  if (c >= p.C) return;
  for (uint t = 0u; t < p.T; ++t) {
    const uint id = uint(clamp(ids[t], 0, int(p.V) - 1));
    dtable[id * p.C + c] += dy[t * p.C + c];
  }
}
