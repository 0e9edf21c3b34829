#version 450
// rms_norm backward into w, second half: dw[c] += Σ_chunk partial[chunk, c], chunks (of chunk_rows rows,
// written by rms_norm_dw_partial.comp) added in order.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer DW { float dw[]; };
layout(std430, binding = 1) readonly buffer Partial { float partial[]; };
layout(push_constant) uniform Push { uint rows; uint cols; uint chunk_rows; } p;

void main() {
  const uint c = gl_GlobalInvocationID.x;
  if (c >= p.cols) return;
  const uint chunks = (p.rows + p.chunk_rows - 1u) / p.chunk_rows;
  float s = 0.0;
  for (uint k = 0u; k < chunks; ++k) s += partial[k * p.cols + c];
  dw[c] += s;
}
