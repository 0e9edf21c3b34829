// The first pass of dx[n_in] = dy[j_start:j_end] · W[j_start:j_end, :] for one token, W in Q4_K super-blocks (the
// transposed GEMV), laid out as q4_0_dx_split.comp: the row range is cut into chunks of rows_per_chunk rows
// (gl_WorkGroupID.y) and chunk c writes its sums to partial[c, cols]; q4_0_dx_reduce.comp adds the chunks in order.
// A workgroup covers UNITS units (16 bytes of quants, one uvec4, as in q4_k_gemv.comp: 32 columns of dx) and
// SLOTS = SUB·ROW_SLOTS row slots, slot s walking rows s, s + SLOTS, ... of the chunk in groups of ROWS_IN_FLIGHT.
// Per row an invocation adds dy·d·sc·q to its columns and dy·dmin·m to one correction per sub-block, subtracted
// once at the end; the slots are summed through shared memory. Few columns and many slots per workgroup keep the
// chunks few (the host sizes them from the columns per workgroup), so the reduce pass stays short.
// Q5_K (FORMAT_Q5_K) adds each code's fifth bit from qh. Included by q4_k_dx_split_f16.comp (Q4_K_DX_F16: codes
// through f16 pairs, devices with f16 arithmetic) and q4_k_dx_split.comp (f32), built per format
// (kernels/CMakeLists.txt). Measurements: docs/kernels.md, "One-token dx".
#include "formats.glsl"
#if FORMAT == FORMAT_Q5_K
const uint BLOCK_U4 = 11u, QS_U4 = 3u;  // d, dmin, scales; qh[32]; qs[128]
#else
const uint BLOCK_U4 = 9u, QS_U4 = 1u;  // d, dmin, scales; qs[128]
#endif

const uint UNITS = 8;  // 256 columns per workgroup (formats.cpp: dx_cols)
const uint SUB = 2;    // row slots per unit along x
layout(local_size_x = UNITS * SUB, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;
layout(constant_id = 1) const uint ROWS_IN_FLIGHT = 4;  // rows whose loads an invocation issues together
const uint SLOTS = SUB * ROW_SLOTS;  // a multiple of 8
const uint NV = UNITS * 8u;          // vec4 columns of the workgroup

layout(std430, binding = 0) writeonly buffer Partial { vec4 partial4[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uvec4 w4[]; };            // BLOCK_U4 per block
layout(std430, binding = 1) readonly buffer W2 { uvec2 w2[]; };  // the same words, 2·BLOCK_U4 per block
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

#include "q4_k.glsl"

shared vec4 red[SLOTS * NV];

// Columns 64c + 16h + [0, 16) of the block (al, low nibbles) and 64c + 32 + 16h + [0, 16) (ah, high nibbles).
vec4 al[4], ah[4];
float corr_l = 0.0, corr_h = 0.0;

#ifdef Q4_K_DX_F16
#include "nibbles_f16.glsl"
// Codes through f16 pairs (nibbles_f16.glsl) as q and 16q; the high nibbles' 16 comes out once at the end
// (HIGH_SCALE), and the corrections hold the mins alone. Q5_K's codes come as q for both.
#if FORMAT == FORMAT_Q5_K
const float HIGH_SCALE = 1.0;
#else
const float HIGH_SCALE = 0.0625;
#endif
void add_word(uint x, uint hb, float a_l, float a_h, inout vec4 l, inout vec4 h) {
  vec4 lo, hi;
#if FORMAT == FORMAT_Q5_K
  // Bits 0 and 1 of each byte of hb are the fifth bits of its low and high code, joined into bytes first.
  const uint x5l = (x & 0x0F0F0F0Fu) | ((hb & 0x01010101u) << 4u);
  const uint x5h = ((x >> 4u) & 0x0F0F0F0Fu) | ((hb & 0x02020202u) << 3u);
  bytes_f16(x5l, x5h, 0.0hf, lo, hi);
#else
  nibbles_f16(x, 0.0hf, 0.0hf, lo, hi);
#endif
  l += a_l * lo;
  h += a_h * hi;
}

// qh: the unit's 16 bytes of qh (Q5_K; unused otherwise), whose bits 2c and 2c + 1 belong to its columns.
void add_row(uvec4 hd, uvec4 qs, uvec4 qh, float g, uint c) {
  const vec2 dm = unpackHalf2x16(hd.x);
  const vec4 s = q4_k_chunk_scales(hd.yzw, c);
  const float gd = g * dm.x, gm = g * dm.y;
  corr_l += gm * s.z;
  corr_h += gm * s.w;
  for (uint k = 0u; k < 4u; ++k) add_word(qs[k], qh[k] >> (2u * c), gd * s.x, gd * s.y, al[k], ah[k]);
}
#else
// Codes as f32 1 + q/16 (q4_k.glsl): per row, (16·dy·d·sc)·(1 + q/16) to the columns and
// 16·dy·d·sc + dy·dmin·m to the sub-block's correction.
// Q5_K adds 16·dy·d·sc times each fifth bit.
const float HIGH_SCALE = 1.0;
void add_row(uvec4 hd, uvec4 qs, uvec4 qh, float g, uint c) {
  const vec2 dm = unpackHalf2x16(hd.x);
  const vec4 s = q4_k_chunk_scales(hd.yzw, c);
  const float gd = 16.0 * g * dm.x, gm = g * dm.y;
  const float a_l = gd * s.x, a_h = gd * s.y;
  corr_l += a_l + gm * s.z;
  corr_h += a_h + gm * s.w;
  for (uint k = 0u; k < 4u; ++k) {
    al[k] += a_l * q4_k_low_1p(qs[k]);
    ah[k] += a_h * q4_k_high_1p(qs[k]);
#if FORMAT == FORMAT_Q5_K
    const uint hb = qh[k] >> (2u * c);
    al[k] += a_l * vec4(uvec4(hb, hb >> 8u, hb >> 16u, hb >> 24u) & 1u);
    ah[k] += a_h * vec4(uvec4(hb >> 1u, hb >> 9u, hb >> 17u, hb >> 25u) & 1u);
#endif
  }
}
#endif

// A group of ROWS_IN_FLIGHT rows: the loads in flight (next) and the rows being added (cur). The header (d, dmin,
// scales) is shared by the two units of one chunk, invocations u and u ^ 1 (neighbours in the subgroup): each
// loads one half and they swap halves, so only 8 of its bytes per row wait in registers.
uvec2 hh_next[ROWS_IN_FLIGHT], hh_cur[ROWS_IN_FLIGHT];
uvec4 qs_next[ROWS_IN_FLIGHT], qs_cur[ROWS_IN_FLIGHT];
#if FORMAT == FORMAT_Q5_K
uvec4 qh_next[ROWS_IN_FLIGHT], qh_cur[ROWS_IN_FLIGHT];
#define QH_CUR(i) qh_cur[i]
#else
#define QH_CUR(i) uvec4(0u)
#endif
float g_next[ROWS_IN_FLIGHT], g_cur[ROWS_IN_FLIGHT];

void load_rows(uint j, uint n_blocks, uint b, uint h, uint q_off) {
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
    const uint blk = ((j + i * SLOTS) * n_blocks + b) * BLOCK_U4;
    hh_next[i] = w2[2u * blk + h];
    qs_next[i] = w4[blk + q_off];
#if FORMAT == FORMAT_Q5_K
    qh_next[i] = w4[blk + 1u + h];
#endif
    g_next[i] = dy[j + i * SLOTS];
  }
}

void take_rows() {
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
    hh_cur[i] = hh_next[i];
    qs_cur[i] = qs_next[i];
#if FORMAT == FORMAT_Q5_K
    qh_cur[i] = qh_next[i];
#endif
    g_cur[i] = g_next[i];
  }
}

void add_rows(uint h, uint c) {
  for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
    const uvec2 other = subgroupShuffleXor(hh_cur[i], 1u);
    add_row(h == 0u ? uvec4(hh_cur[i], other) : uvec4(other, hh_cur[i]), qs_cur[i], QH_CUR(i), g_cur[i], c);
  }
}

void main() {
  const uint n_blocks = p.n_in / 256u;
  const uint ul = gl_LocalInvocationID.x % UNITS;
  const uint slot = gl_LocalInvocationID.x / UNITS + SUB * gl_LocalInvocationID.y;
  const uint u = gl_WorkGroupID.x * UNITS + ul;
  const uint b = u < n_blocks * 8u ? u >> 3u : 0u, c = (u >> 1u) & 3u, h = u & 1u;
  const uint q_off = QS_U4 + 2u * c + h;  // the unit's uvec4 inside a block
  const uint chunk = gl_WorkGroupID.y;
  const uint j0 = p.j_start + chunk * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);

  for (uint k = 0u; k < 4u; ++k) {
    al[k] = vec4(0.0);
    ah[k] = vec4(0.0);
  }
  // Software-pipelined in groups of ROWS_IN_FLIGHT rows: the loads of the next group go out before the current
  // group is added, so an invocation has loads in flight while it computes.
  uint j = j0 + slot;
  if (j + (ROWS_IN_FLIGHT - 1u) * SLOTS < j1) {
    load_rows(j, n_blocks, b, h, q_off);
    take_rows();
    for (j += ROWS_IN_FLIGHT * SLOTS; j + (ROWS_IN_FLIGHT - 1u) * SLOTS < j1; j += ROWS_IN_FLIGHT * SLOTS) {
      load_rows(j, n_blocks, b, h, q_off);
      add_rows(h, c);
      take_rows();
    }
    add_rows(h, c);
  }
  for (; j < j1; j += SLOTS) {
    const uint blk = (j * n_blocks + b) * BLOCK_U4;
    add_row(w4[blk], w4[blk + q_off], w4[blk + 1u + h], dy[j], c);
  }

  for (uint k = 0u; k < 4u; ++k) {
    red[slot * NV + ul * 8u + k] = al[k] - corr_l;
    red[slot * NV + ul * 8u + 4u + k] = ah[k] * HIGH_SCALE - corr_h;
  }
  barrier();
  // Groups of 8 slots, then the groups; slots and groups are added in a fixed order.
  const uint tid = gl_LocalInvocationIndex, v = tid % NV, grp = tid / NV;  // SLOTS / 8 groups
  vec4 sum = red[grp * 8u * NV + v];
  for (uint i = 1u; i < 8u; ++i) sum += red[(grp * 8u + i) * NV + v];
  red[grp * 8u * NV + v] = sum;  // only this invocation reads that group's column v
  barrier();
  if (tid >= NV) return;
  for (uint g = 1u; g < SLOTS / 8u; ++g) sum += red[g * 8u * NV + v];
  const uint uo = gl_WorkGroupID.x * UNITS + v / 8u, k = v % 8u;
  if (uo >= n_blocks * 8u) return;
  const uint bo = uo >> 3u, co = (uo >> 1u) & 3u, ho = uo & 1u;
  // Vec4 k < 4 holds columns 64c + 16h + 4k .., k >= 4 columns 64c + 32 + 16h + 4(k - 4) ..
  partial4[(chunk * p.n_in) / 4u + 64u * bo + 16u * co + 4u * ho + (k < 4u ? k : 4u + k)] = sum;
}
