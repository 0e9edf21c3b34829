#version 450
// First pass of dx[n_in] = dy[j_start:j_end] · W[j_start:j_end, :] for one token, W in Q6_K super-blocks in the
// grouped layout of q6_k.glsl (the transposed GEMV), laid out as q4_k_dx_split.glsl: the row range is cut into
// chunks (gl_WorkGroupID.y); a workgroup covers UNITS units (a unit as in q6_k_gemv.comp: 8 bytes of ql at l, 8 at
// l + 32 and 8 of qh, 32 columns of dx) and SLOTS = SUB·ROW_SLOTS row slots, slot s walking rows s, s + SLOTS, ...
// of the chunk, software-pipelined in groups of ROWS_IN_FLIGHT rows (the next group's loads go out before the
// current group is added). The slots are summed through shared memory and chunk c writes its sums to
// partial[c, cols]; q4_0_dx_reduce.comp adds the chunks in order (deterministic, no float atomics).
// Measurements, and why the grouped layout: docs/kernels.md, "One-token dx".
#extension GL_GOOGLE_include_directive : require

// 8 units: a workgroup reads whole blocks of each row (256 columns, formats.cpp: dx_cols). With half blocks,
// neighbouring workgroups would both read the blocks' scales and d, and each read piece of a row is shorter.
const uint UNITS = 8;
const uint SUB = 2;  // row slots per unit along x
layout(local_size_x = UNITS * SUB, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;
layout(constant_id = 1) const uint ROWS_IN_FLIGHT = 4;  // rows whose loads an invocation issues together
const uint SLOTS = SUB * ROW_SLOTS;  // a multiple of 8
const uint NV = UNITS * 8u;          // vec4 columns of the workgroup

layout(std430, binding = 0) writeonly buffer Partial { vec4 partial4[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer W2 { uvec2 w2[]; };  // the same words in pairs
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

#define Q6_K_WORDS w
#define Q6_K_PAIRS w2
#include "q6_k.glsl"

shared vec4 red[SLOTS * NV];

// acc[2·k4 + e]: columns 128h + 32·k4 + 8g + 4e + [0, 4) of the block.
vec4 acc[8];

// One row's unit: ql at l and l + 32, qh, the half's scales 2·k4 + g/2 (in bytes 0 and 2 of .x and .y), d.
struct Unit {
  uvec2 ql0, ql1, qh, sw;
  float d;
};

Unit load_unit(uint blk, uint h, uint g) {
  const uint base = q6_k_base(blk);
  Unit un;
  un.ql0 = q6_k_pair(base + 16u * h + 2u * g);
  un.ql1 = q6_k_pair(base + 16u * h + 8u + 2u * g);
  un.qh = q6_k_pair(base + Q6_K_QH + 8u * h + 2u * g);
  un.sw = q6_k_pair(base + Q6_K_SCALES + 2u * h) >> (8u * (g >> 1u));
  un.d = q6_k_d(blk);
  return un;
}

// Column sums times Q6_K_SCALE⁻¹ (q6_k_unpack_scaled); main scales them back once.
void add_row(Unit un, float g) {
  const float gd = g * un.d;
  for (uint k4 = 0u; k4 < 4u; ++k4) {
    const uvec2 ql = (k4 & 1u) != 0u ? un.ql1 : un.ql0;
    const float gs = gd * q6_k_i8(un.sw[k4 >> 1u], 2u * (k4 & 1u));
    acc[2u * k4] += gs * q6_k_unpack_scaled(q6_k_quants(ql.x, un.qh.x, k4));
    acc[2u * k4 + 1u] += gs * q6_k_unpack_scaled(q6_k_quants(ql.y, un.qh.y, k4));
  }
}

// A group of ROWS_IN_FLIGHT rows: the loads in flight (next) and the rows being added (cur).
Unit un_next[ROWS_IN_FLIGHT], un_cur[ROWS_IN_FLIGHT];
float g_next[ROWS_IN_FLIGHT], g_cur[ROWS_IN_FLIGHT];

void load_rows(uint j, uint n_blocks, uint b, uint h, uint g) {
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
    un_next[i] = load_unit((j + i * SLOTS) * n_blocks + b, h, g);
    g_next[i] = dy[j + i * SLOTS];
  }
}

void take_rows() {
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
    un_cur[i] = un_next[i];
    g_cur[i] = g_next[i];
  }
}

void add_rows() {
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) add_row(un_cur[i], g_cur[i]);
}

void main() {
  const uint n_blocks = p.n_in / 256u;
  const uint ul = gl_LocalInvocationID.x % UNITS;
  const uint slot = gl_LocalInvocationID.x / UNITS + SUB * gl_LocalInvocationID.y;
  const uint u = gl_WorkGroupID.x * UNITS + ul;
  const uint b = u < n_blocks * 8u ? u >> 3u : 0u, h = (u >> 2u) & 1u, g = u & 3u;
  const uint chunk = gl_WorkGroupID.y;
  const uint j0 = p.j_start + chunk * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);

  for (uint k = 0u; k < 8u; ++k) acc[k] = vec4(0.0);
  uint j = j0 + slot;
  if (j + (ROWS_IN_FLIGHT - 1u) * SLOTS < j1) {
    load_rows(j, n_blocks, b, h, g);
    take_rows();
    for (j += ROWS_IN_FLIGHT * SLOTS; j + (ROWS_IN_FLIGHT - 1u) * SLOTS < j1; j += ROWS_IN_FLIGHT * SLOTS) {
      load_rows(j, n_blocks, b, h, g);
      add_rows();
      take_rows();
    }
    add_rows();
  }
  for (; j < j1; j += SLOTS) add_row(load_unit(j * n_blocks + b, h, g), dy[j]);

  for (uint k = 0u; k < 8u; ++k) red[slot * NV + ul * 8u + k] = acc[k] * Q6_K_SCALE;
  barrier();
  // Groups of 8 slots, then the groups; slots and groups are added in a fixed order.
  const uint tid = gl_LocalInvocationIndex, v = tid % NV, grp = tid / NV;  // SLOTS / 8 groups
  vec4 sum = red[grp * 8u * NV + v];
  for (uint i = 1u; i < 8u; ++i) sum += red[(grp * 8u + i) * NV + v];
  red[grp * 8u * NV + v] = sum;  // only this invocation reads that group's column v
  barrier();
  if (tid >= NV) return;
  for (uint gr = 1u; gr < SLOTS / 8u; ++gr) sum += red[gr * 8u * NV + v];
  const uint uo = gl_WorkGroupID.x * UNITS + v / 8u, k = v % 8u;
  if (uo >= n_blocks * 8u) return;
  // Vec4 k = 2·k4 + e holds columns 128h + 32·k4 + 8g + 4e ..
  partial4[(chunk * p.n_in) / 4u + 64u * (uo >> 3u) + 32u * ((uo >> 2u) & 1u) + 8u * (k >> 1u) + 2u * (uo & 3u) +
           (k & 1u)] = sum;
}
