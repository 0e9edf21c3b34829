#version 450
// out[c] += Σ_r a[r, c] (op 0) or Σ_r a[r, c] * b[r, c] (op 1) over a [rows, cols]: the gradient of a row
// broadcast. One invocation per column, rows summed in order (deterministic). lavapipe caps a shader's loop
// iterations at 65535 per invocation, so there this is exact only up to 65535 rows (a batch of B x T tokens);
// past that it needs the two-pass chunked form rms_norm_dw_partial/reduce use.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(push_constant) uniform Push { uint rows; uint cols; uint op; } p;

void main() {
  const uint c = gl_GlobalInvocationID.x;
  if (c >= p.cols) return;
  float s = 0.0;
  for (uint r = 0u; r < p.rows; ++r) s += a[r * p.cols + c] * (p.op == 1u ? b[r * p.cols + c] : 1.0);
  o[c] += s;
}
