#version 450
// First pass of the one-token dx, as q4_0_dx_split.comp (chunks of rows, ROW_SLOTS row slots, partial[c, cols]
// added in order by q4_0_dx_reduce.comp), for rows of an even number of blocks on devices with f16 arithmetic.
// Slot s takes R = ROWS_IN_FLIGHT rows in a row at a time: rows s·R .. s·R + R - 1 of each run of ROW_SLOTS·R rows.
// Two blocks are 36 bytes, 9 words: every pair starts on a word, so an invocation reads its quants as one aligned
// word per row. Words of pair p (d0, d1 the blocks' f16 scales, qa and qb their 16 quant bytes):
//   0: d0 qa0 qa1 | 1: qa2..qa5 | 2: qa6..qa9 | 3: qa10..qa13 | 4: qa14 qa15 d1 | 5..8: qb0..qb15
// Invocation k (0..7) of the pair's eight takes word k + (k >= 4) and its block's scale from word 0 or 4; invocation
// 0 joins qa0 qa1 (word 0) with qa14 qa15 (word 4). Quant byte i holds weights i (low nibble) and 16 + i (high).
// Q4_0's codes are decoded through f16 pairs (nibbles_f16.glsl), one integer operation per two weights; IQ4_NL
// (FORMAT, the same blocks) looks its levels up in a 16-entry shared table. Measurements: docs/kernels.md.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "formats.glsl"
#if FORMAT == FORMAT_IQ4_NL
const uint LANES = 128u;  // 1024 columns per workgroup (formats.cpp: dx_cols)
#else
const uint LANES = 64u;  // 512 columns
#endif

layout(local_size_x = LANES, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;
layout(constant_id = 1) const uint ROWS_IN_FLIGHT = 4;  // rows whose loads an invocation issues together; 4·n

layout(std430, binding = 0) writeonly buffer Partial { float partial[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) readonly buffer DY4 { vec4 dy4[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

shared vec4 red[ROW_SLOTS * LANES * 2];

// Set by main: the invocation's word offsets (x: its quant word; y: the word with its block's scale, and for
// k = 0 quant bytes 0 and 1), whether it joins two half-words (k = 0), and its scale's half.
uint xo, yo, d_shift;
bool joined;
uint row_words;
vec4 lo = vec4(0.0), hi = vec4(0.0);

#if FORMAT == FORMAT_IQ4_NL
#include "iq4_levels.glsl"
const float HIGH_SCALE = 1.0;
shared float levels[16];
// The column sums: lo += g·level of the low nibbles of quant bytes 0..3 of qs, hi += g·level of the high ones.
void add_word(uint qs, float g) {
  lo += g * vec4(levels[qs & 15u], levels[(qs >> 8u) & 15u], levels[(qs >> 16u) & 15u], levels[(qs >> 24u) & 15u]);
  hi += g * vec4(levels[(qs >> 4u) & 15u], levels[(qs >> 12u) & 15u], levels[(qs >> 20u) & 15u], levels[qs >> 28u]);
}
#else
#include "nibbles_f16.glsl"
const float HIGH_SCALE = 0.0625;
// The column sums: lo += g·(n - 8) of quant bytes 0..3 of qs (low nibbles), hi += g·16(n - 8) (high nibbles).
void add_word(uint qs, float g) {
  vec4 l, h;
  nibbles_f16(qs, 8.0hf, 128.0hf, l, h);
  lo += g * l;
  hi += g * h;
}
#endif

// The invocation's 4 quant bytes of a row, from the words at xo (x) and yo (y).
uint quants(uint x, uint y) { return joined ? (y >> 16u) | (x << 16u) : x; }
float block_scale(uint y) { return unpackHalf2x16(y >> d_shift).x; }

// Rows jb .. jb + ROWS_IN_FLIGHT - 1: their loads issued together, then added in order. dy_vec4: dy read as
// vec4s (jb a multiple of 4).
void add_rows(uint jb, const bool dy_vec4) {
  uint x[ROWS_IN_FLIGHT], y[ROWS_IN_FLIGHT];
  float g[ROWS_IN_FLIGHT];
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
    const uint r = (jb + i) * row_words;
    x[i] = w[r + xo];
    y[i] = w[r + yo];
  }
  if (dy_vec4) {
    for (uint m = 0u; m < ROWS_IN_FLIGHT / 4u; ++m) {
      const vec4 v = dy4[jb / 4u + m];
      for (uint e = 0u; e < 4u; ++e) g[4u * m + e] = v[e];
    }
  } else {
    for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) g[i] = dy[jb + i];
  }
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) add_word(quants(x[i], y[i]), g[i] * block_scale(y[i]));
}

void main() {
  const uint n_blocks = p.n_in / 32u;  // even (the host checks)
  const uint lx = gl_LocalInvocationID.x, slot = gl_LocalInvocationID.y;
  const uint u = gl_WorkGroupID.x * LANES + lx;
  const bool in_range = u < n_blocks * 4u;
  const uint pair = in_range ? u >> 3u : 0u, k = u & 7u;
  row_words = n_blocks / 2u * 9u;
  xo = pair * 9u + (k == 0u ? 4u : (k < 4u ? k : k + 1u));
  yo = pair * 9u + (k < 4u ? 0u : 4u);
  d_shift = k < 4u ? 0u : 16u;
  joined = k == 0u;
  const uint c = gl_WorkGroupID.y;
  const uint j0 = p.j_start + c * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);
  const uint S = ROW_SLOTS;
#if FORMAT == FORMAT_IQ4_NL
  if (slot == 0u && lx < 16u) levels[lx] = float(int(iq4_level(lx)) - 128);
  barrier();  // the whole workgroup gets here
#endif

  uint jb = j0 + slot * ROWS_IN_FLIGHT;
  if ((p.j_start & 3u) == 0u && (p.rows_per_chunk & 3u) == 0u) {
    for (; jb + ROWS_IN_FLIGHT <= j1; jb += S * ROWS_IN_FLIGHT) add_rows(jb, true);
  } else {
    for (; jb + ROWS_IN_FLIGHT <= j1; jb += S * ROWS_IN_FLIGHT) add_rows(jb, false);
  }
  for (uint j = jb; j < min(j1, jb + ROWS_IN_FLIGHT); ++j) {
    const uint r = j * row_words, x = w[r + xo], y = w[r + yo];
    add_word(quants(x, y), dy[j] * block_scale(y));
  }
  hi *= HIGH_SCALE;

  red[(slot * LANES + lx) * 2u] = lo;
  red[(slot * LANES + lx) * 2u + 1u] = hi;
  barrier();
  if (slot != 0u || !in_range) return;
  for (uint s = 1u; s < S; ++s) {
    lo += red[(s * LANES + lx) * 2u];
    hi += red[(s * LANES + lx) * 2u + 1u];
  }
  // The invocation's columns in its block: quant bytes (0, 1, 14, 15) for k = 0, else 4 in a row.
  const uint base = c * p.n_in + (2u * pair + (k < 4u ? 0u : 1u)) * 32u;
  const uvec4 col =
      k == 0u ? uvec4(0u, 1u, 14u, 15u) : uvec4(k < 4u ? 4u * k - 2u : 4u * k - 16u) + uvec4(0u, 1u, 2u, 3u);
  for (uint e = 0u; e < 4u; ++e) {
    partial[base + col[e]] = lo[e];
    partial[base + 16u + col[e]] = hi[e];
  }
}
