#version 450
// First pass of dx[n_in] = dy[j_start:j_end] · W[j_start:j_end, :] for one token, W in halves (n_in even), laid
// out as q4_0_dx_split.comp: the row range is cut into chunks of rows_per_chunk rows (gl_WorkGroupID.y); a
// workgroup is 64 column groups (gl_LocalInvocationID.x; two words = 4 columns of dx each) times ROW_SLOTS row
// slots (.y), slot s walking rows s, s + ROW_SLOTS, ... of the chunk. The slots are summed through shared memory
// and chunk c writes its sums to partial[c, cols]; q4_0_dx_reduce.comp adds the chunks in order (deterministic,
// no float atomics).
layout(local_size_x = 64, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;

layout(std430, binding = 0) writeonly buffer Partial { float partial[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

shared vec4 red[ROW_SLOTS * 64];

// Columns 4u .. 4u+3 of row j; a word past the row's end is read from its last word (and never written out).
vec4 row_cols(uint j, uint n_words, uint w0, uint w1) {
  return vec4(unpackHalf2x16(w[j * n_words + w0]), unpackHalf2x16(w[j * n_words + w1]));
}

void main() {
  const uint n_words = p.n_in / 2u;
  const uint lx = gl_LocalInvocationID.x, slot = gl_LocalInvocationID.y;
  const uint u = gl_WorkGroupID.x * 64u + lx;
  const uint w0 = min(2u * u, n_words - 1u), w1 = min(2u * u + 1u, n_words - 1u);
  const uint c = gl_WorkGroupID.y;
  const uint j0 = p.j_start + c * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);
  const uint S = ROW_SLOTS;

  vec4 acc = vec4(0.0);
  uint j = j0 + slot;
  for (; j + 3u * S < j1; j += 4u * S) {
    vec4 v[4];
    for (uint i = 0u; i < 4u; ++i) v[i] = row_cols(j + i * S, n_words, w0, w1);
    for (uint i = 0u; i < 4u; ++i) acc += dy[j + i * S] * v[i];
  }
  for (; j < j1; j += S) acc += dy[j] * row_cols(j, n_words, w0, w1);

  red[slot * 64u + lx] = acc;
  barrier();
  if (slot != 0u) return;
  for (uint s = 1u; s < S; ++s) acc += red[s * 64u + lx];
  for (uint i = 0u; i < 4u; ++i)
    if (4u * u + i < p.n_in) partial[c * p.n_in + 4u * u + i] = acc[i];
}
