#version 450
// rms_norm backward into w, first half: partial[chunk, c] = Σ_{row in chunk} dy[row, c] x[row, c] rstd[row]
// over chunks of chunk_rows rows. One invocation per (column, chunk): neighbouring invocations read neighbouring
// columns, and chunks run in parallel. rms_norm_dw_reduce.comp then sums the chunks in order, so dw is
// deterministic without float atomics, and no loop runs more than 65535 times (lavapipe stops longer loops).
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer Partial { float partial[]; };
layout(std430, binding = 1) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer Rstd { float rstd[]; };
layout(push_constant) uniform Push { uint rows; uint cols; uint chunk_rows; } p;

void main() {
  const uint c = gl_GlobalInvocationID.x, chunk = gl_WorkGroupID.y;
  if (c >= p.cols) return;
  const uint r0 = chunk * p.chunk_rows, r1 = min(r0 + p.chunk_rows, p.rows);
  float s = 0.0;
  for (uint r = r0; r < r1; ++r) s += dy[r * p.cols + c] * x[r * p.cols + c] * rstd[r];
  partial[chunk * p.cols + c] = s;
}
