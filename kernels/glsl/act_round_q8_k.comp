#version 450
// y = x rounded through GGML's Q8_K activation format, per block of 256 values of a row: m = the value of largest
// magnitude (the first on ties), s = -127 / m, q = min(127, round-half-even(s * x)), y = (1 / s) * q, with the
// scale kept in f32. This is what llama.cpp's CPU matmuls do to the activations of a Q4_K or Q6_K weight; q4tune
// applies it only when asked to reproduce llama.cpp's numerics. One invocation per block.
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(push_constant) uniform Push { uint n_blocks; } p;

void main() {
  const uint b = gl_GlobalInvocationID.x;
  if (b >= p.n_blocks) return;
  float amax = 0.0, m = 0.0;
  for (uint i = 0u; i < 256u; ++i) {
    const float v = x[b * 256u + i];
    if (abs(v) > amax) {
      amax = abs(v);
      m = v;
    }
  }
  if (amax == 0.0) {
    for (uint i = 0u; i < 256u; ++i) y[b * 256u + i] = 0.0;
    return;
  }
  const float s = -127.0 / m, d = 1.0 / s;
  for (uint i = 0u; i < 256u; ++i) y[b * 256u + i] = d * min(127.0, roundEven(s * x[b * 256u + i]));
}
