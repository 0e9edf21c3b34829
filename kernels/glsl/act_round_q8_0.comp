#version 450
// y = x rounded through GGML's Q8_0 activation format, per block of 32 values of a row: d = amax / 127,
// q = round-half-even(x / d), y = f16(d) * q. This is what llama.cpp's CPU matmuls do to the activations of a
// Q4_0 or Q8_0 weight; q4tune applies it only when asked to reproduce llama.cpp's numerics.
// One invocation per block. d is rounded to f16 with integer arithmetic (exactly round-to-nearest-even),
// since packHalf2x16's rounding is implementation-defined.
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(push_constant) uniform Push { uint n_blocks; } p;

float round_to_f16(float v) {
  const uint u = floatBitsToUint(v);
  const uint e = (u >> 23) & 255u;
  if (e < 103u || e > 142u) return v;  // zero, f16-subnormal range or beyond f16: not reached for |d| in range
  const uint drop = 13u;                // f32 has 23 mantissa bits, f16 has 10
  const uint half_ulp = 1u << (drop - 1u), mask = (1u << drop) - 1u, rest = u & mask;
  uint r = u & ~mask;
  if (rest > half_ulp || (rest == half_ulp && ((u >> drop) & 1u) != 0u)) r += 1u << drop;
  return uintBitsToFloat(r);
}

void main() {
  const uint b = gl_GlobalInvocationID.x;
  if (b >= p.n_blocks) return;
  float amax = 0.0;
  for (uint i = 0u; i < 32u; ++i) amax = max(amax, abs(x[b * 32u + i]));
  const float d = amax / 127.0;
  const float id = d != 0.0 ? 1.0 / d : 0.0;
  const float dh = round_to_f16(d);
  for (uint i = 0u; i < 32u; ++i) y[b * 32u + i] = dh * roundEven(x[b * 32u + i] * id);
}
