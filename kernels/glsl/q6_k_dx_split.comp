#version 450
// First pass of dx[n_in] = dy[j_start:j_end] · W[j_start:j_end, :] for one token, W in Q6_K super-blocks (the
// transposed GEMV), laid out as q4_k_dx_split.comp: the row range is cut into chunks (gl_WorkGroupID.y); a
// workgroup covers UNITS units (a unit as in q6_k_gemv.comp: 8 bytes of ql at l, 8 at l + 32 and 8 of qh, 32
// columns of dx) and SLOTS = SUB·ROW_SLOTS row slots, slot s walking rows s, s + SLOTS, ... of the chunk. The
// slots are summed through shared memory and chunk c writes its sums to partial[c, cols]; q4_0_dx_reduce.comp
// adds the chunks in order (deterministic, no float atomics).
//
// A block's alignment (q6_k.glsl) is the parity of its index j·n_blocks + b: one per workgroup when n_blocks is
// even, else one per row parity. Slots are numbered so that a 32-wide subgroup's slots (two y values of
// 16 invocations) share a parity, and the slot stride SLOTS is even: an invocation's rows all have one
// alignment, so it picks the aligned or the shifted loads once (walk) and a subgroup never diverges on it.
//
// H100, 16384x16384, split and reduce passes: 107.5-108.5 us (74.5-74.9% of copy). Variants timed in its place:
// - loads alone (the words xor-ed together): 95.0 us; with every block read as if aligned (wrong values) 89.2;
//   with an odd block's third word per piece taken from the neighbouring unit by subgroupShuffle (it is that
//   unit's first word, or the d word) 89.8, yet 108.6-108.9 with the arithmetic;
// - the arithmetic alone (two rows read again and again from cache): 75.6-76.4 us;
// - without the qh bits 103.3 us; without the masks and the subtraction of the decode (wrong values) 102.5;
//   scales and d constant 105.0: no single part of the arithmetic holds the missing 8 us;
// - software-pipelined as q4_k_dx_split.glsl (the next RU rows load while RU are added): 108.1-108.5 us with
//   RU 2 (110 registers), 111-113 with 3 or 4, 131 with the shuffles above; a ring of RU rows, each reloaded
//   right after it is added: 108.4-110.7 us with RU 3 or 4, 132-141 with 6 or 8;
// - codes as 2 + q/64 (the 6 bits under exponent 128, no subtraction; Σ a(q - 32) = 64 Σ a·f - 160 Σ a):
//   110.5 us; qh shifted once into place instead of right then left: 111.9;
// - 396 to 4096 target groups and 4 or 16 row slots: 107.9-152.9 us, none below 1024 groups and 8 slots.
#extension GL_GOOGLE_include_directive : require

// 8 units: a workgroup reads whole 210-byte blocks of each row (256 columns, linear_kernels.cpp: kDxQ6_KCols).
// With half blocks (4 units), neighbouring workgroups both read the blocks' scales and d, and each read piece
// of a row is shorter: 140 us against 126 at 16384x16384 on an H100.
const uint UNITS = 8;
const uint SUB = 2;  // row slots per unit along x
layout(local_size_x = UNITS * SUB, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;
layout(constant_id = 1) const uint RU = 4;  // rows whose loads an invocation issues together (the host sets it)
const uint SLOTS = SUB * ROW_SLOTS;  // a multiple of 8
const uint NV = UNITS * 8u;          // vec4 columns of the workgroup

layout(std430, binding = 0) writeonly buffer Partial { vec4 partial4[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

#define Q6_K_WORDS w
#include "q6_k.glsl"

shared vec4 red[SLOTS * NV];

// acc[2·k4 + e]: columns 128h + 32·k4 + 8g + 4e + [0, 4) of the block.
vec4 acc[8];

// One row's unit: ql at l and l + 32, qh, the half's scales 2·k4 + g/2 (in bytes 0 and 2 of .x and .y), d.
struct Unit {
  uvec2 ql0, ql1, qh, sw;
  float d;
};

Unit load_unit(uint bb, uint h, uint g, bool odd) {
  Unit un;
  un.ql0 = q6_k_words2_known(bb + 64u * h + 8u * g, odd);
  un.ql1 = q6_k_words2_known(bb + 64u * h + 32u + 8u * g, odd);
  un.qh = q6_k_words2_known(bb + Q6_K_QH + 32u * h + 8u * g, odd);
  un.sw = q6_k_words2_known(bb + Q6_K_SCALES + 8u * h, odd) >> (8u * (g >> 1u));
  un.d = q6_k_d_known(bb, odd);
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

// The rows j, j + SLOTS, ... up to j1, all of alignment `odd`.
void walk(uint j, uint j1, uint n_blocks, uint b, uint h, uint g, bool odd) {
  for (; j + (RU - 1u) * SLOTS < j1; j += RU * SLOTS) {
    Unit un[RU];
    float gy[RU];
    for (uint i = 0u; i < RU; ++i) {
      un[i] = load_unit(((j + i * SLOTS) * n_blocks + b) * Q6_K_BLOCK_BYTES, h, g, odd);
      gy[i] = dy[j + i * SLOTS];
    }
    for (uint i = 0u; i < RU; ++i) add_row(un[i], gy[i]);
  }
  for (; j < j1; j += SLOTS) add_row(load_unit((j * n_blocks + b) * Q6_K_BLOCK_BYTES, h, g, odd), dy[j]);
}

void main() {
  const uint n_blocks = p.n_in / 256u;
  const uint ul = gl_LocalInvocationID.x % UNITS;
  // slot = 2·pos + par: par = bit 1 of y, pos runs over x / UNITS, bit 0 of y and y / 4 (ROW_SLOTS a
  // multiple of 4).
  const uint ly = gl_LocalInvocationID.y;
  const uint slot = 2u * (gl_LocalInvocationID.x / UNITS + SUB * ((ly & 1u) + 2u * (ly >> 2u))) + ((ly >> 1u) & 1u);
  const uint u = gl_WorkGroupID.x * UNITS + ul;
  const uint b = u < n_blocks * 8u ? u >> 3u : 0u, h = (u >> 2u) & 1u, g = u & 3u;
  const uint chunk = gl_WorkGroupID.y;
  const uint j0 = p.j_start + chunk * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);

  for (uint k = 0u; k < 8u; ++k) acc[k] = vec4(0.0);
  const uint j = j0 + slot;
  if (((j * n_blocks + b) & 1u) != 0u)
    walk(j, j1, n_blocks, b, h, g, true);
  else
    walk(j, j1, n_blocks, b, h, g, false);

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
