#version 450
// The first pass of the one-token dx for Q2_K (84-byte super-blocks { u8 scales[16]; u8 qs[64]; f16 d, dmin },
// 21 words), laid out as q4_0_dx_split.comp: chunk c (gl_WorkGroupID.y) of rows_per_chunk rows writes its sums to
// partial[c, cols]; q4_0_dx_reduce.comp adds the chunks in order. A unit is UW words of qs, inside qs[32n + 16h ..]
// (n, h in 0..1), whose bytes l hold the weights 128n + 32j + l (j = 0..3: bits 2j, 2j + 1) of the sub-blocks
// 8n + 2j + h; a workgroup is 1024 columns of units times ROW_SLOTS row slots, slot s walking rows s, s + ROW_SLOTS,
// ... in groups of ROWS_IN_FLIGHT. Per row an invocation adds dy·d·sc·q to its columns and dy·dmin·m to one
// correction per sub-block, subtracted once at the end. The codes (and the scale nibbles) are decoded through f16
// pairs: a 2-bit field masked in place gives 1024 + q·4^j, exact, and the 4^j goes into the sub-block's factor.
// Q3_K (FORMAT) adds each code's third bit from hmask. Devices with f16 arithmetic; the others run unit_dx_split.
// Measurements: docs/kernels.md, "One-token dx".
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "formats.glsl"

const uint UW = 2u;               // words of qs per unit: 4·UW columns for each of the 4 shifts
const uint UNITS = 64u / UW;     // 1024 columns per workgroup (formats.cpp: dx_cols)
layout(local_size_x = UNITS, local_size_y_id = 0) in;
layout(constant_id = 0) const uint ROW_SLOTS = 8;
layout(constant_id = 1) const uint ROWS_IN_FLIGHT = 3;  // rows whose loads an invocation issues together
const uint NV = UNITS * 4u * UW;                        // vec4 columns of the workgroup

layout(std430, binding = 0) writeonly buffer Partial { vec4 partial4[]; };  // [n_chunks, n_in]
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(push_constant) uniform Push {
  uint n_in;
  uint j_start;
  uint j_end;
  uint rows_per_chunk;
} p;

shared vec4 red[ROW_SLOTS * NV];

// acc[UW·j + k]: columns 128n + 32j + 16h + 4(UW·part + k) + [0, 4), part the unit's place in its 16 bytes;
// corr[j]: what sub-block 8n + 2j + h takes from every column (Q2_K Σ dy·dmin·m, Q3_K Σ 4·dy·d·sc).
vec4 acc[4u * UW];
vec4 corr = vec4(0.0);
// Set by main: the unit's word of qs and of hmask inside its block, and its sub-block bits n and h.
uint q_word, h_word, n, h;

// A 2-bit code field masked in place at bits 2j of bytes 0 and 2 of v (with Q3_K's third bit at 2j + 2), as the
// exact floats (code)·4^j.
vec2 field02(uint v, uint m) {
  const f16vec2 f = unpackFloat2x16((v & m) | 0x64006400u) - f16vec2(1024.0hf);
  return vec2(f);
}

#if FORMAT == FORMAT_Q3_K
// 110-byte blocks { u8 hmask[32]; u8 qs[64]; u8 scales[12] (6-bit, biased by 32); f16 d } start on a word (even
// block) or half-way into one (odd): a block's 4 bytes at offset o come from words at + o/4 and the next.
const uint BLOCK_BYTES = 110u;
struct Row {
  uint qs[UW];
  uint hm[UW];  // hmask bytes 16h + 8·part .., shifted right by 4n: the units' third bits at bit j of each byte
  uvec2 sc;     // the sub-blocks' scales: bytes 0 and 2 of .x for j = 0, 1, of .y for j = 2, 3
  uint d;
};
#include "words.glsl"
uint join(uint a, uint b, bool odd) { return odd ? mid_word(a, b) : a; }
Row load_row(uint B) {
  const uint at = (B * BLOCK_BYTES) >> 2u;
  const bool odd = (B & 1u) != 0u;
  Row r;
  for (uint k = 0u; k < UW; ++k) {
    r.qs[k] = join(w[at + q_word + k], w[at + q_word + k + 1u], odd);
    r.hm[k] = join(w[at + h_word + k], w[at + h_word + k + 1u], odd) >> (4u * n);
  }
  const uint a0 = join(w[at + 24u], w[at + 25u], odd), a1 = join(w[at + 25u], w[at + 26u], odd);
  const uint a2 = join(w[at + 26u], w[at + 27u], odd);
  const uint sa = ((a0 >> (4u * n)) & 0x0F0F0F0Fu) | (((a2 >> (4u * n)) & 0x03030303u) << 4u);
  const uint sb = ((a1 >> (4u * n)) & 0x0F0F0F0Fu) | (((a2 >> (4u * n + 2u)) & 0x03030303u) << 4u);
  r.sc = uvec2(sa, sb) >> (8u * h);
  r.d = join(w[at + 27u], w[at + 28u], odd);
  return r;
}

void add_row(Row r, float g) {
  const float gd = g * unpackHalf2x16(r.d).x;
  const f16vec2 s01 = unpackFloat2x16((r.sc.x & 0x003F003Fu) | 0x64006400u) - f16vec2(1056.0hf);
  const f16vec2 s23 = unpackFloat2x16((r.sc.y & 0x003F003Fu) | 0x64006400u) - f16vec2(1056.0hf);
  const vec4 sc = vec4(vec2(s01), vec2(s23));  // sc - 32
  const vec4 a = gd * sc * vec4(1.0, 0.25, 0.0625, 0.015625);
  corr += (4.0 * gd) * sc;
  for (uint k = 0u; k < UW; ++k) {
    const uint x = r.qs[k], xo = x >> 8u, hm = r.hm[k], hmo = hm >> 8u;
    for (uint j = 0u; j < 4u; ++j) {
      // Bits 2j .. 2j + 2 of each half: the code and, from hmask bit j, its third bit.
      const uint mq = 0x00030003u << (2u * j), mh = 0x00040004u << (2u * j);
      const vec2 q02 = field02((x & mq) | ((hm << (j + 2u)) & mh), mq | mh);
      const vec2 q13 = field02((xo & mq) | ((hmo << (j + 2u)) & mh), mq | mh);
      acc[UW * j + k] += a[j] * vec4(q02.x, q13.x, q02.y, q13.y);
    }
  }
}
#else
const uint BLOCK_WORDS = 21u;  // { u8 scales[16]; u8 qs[64]; f16 d, dmin }
// A row's words: qs (the unit's UW), sc (scale words 2n and 2n + 1, shifted to the unit's bytes) and d | dmin.
struct Row {
  uint qs[UW];
  uvec2 sc;
  uint dm;
};

// (low nibbles, high nibbles) of bytes 0 and 2 of s, exactly, the high ones times 16.
f16vec4 nibbles02(uint s) {
  const f16vec2 lo = unpackFloat2x16((s & 0x000F000Fu) | 0x64006400u) - f16vec2(1024.0hf);
  const f16vec2 hi = unpackFloat2x16((s & 0x00F000F0u) | 0x64006400u) - f16vec2(1024.0hf);
  return f16vec4(lo, hi);
}

Row load_row(uint B) {
  const uint blk = B * BLOCK_WORDS;
  Row r;
  for (uint k = 0u; k < UW; ++k) r.qs[k] = w[blk + q_word + k];
  r.sc = uvec2(w[blk + 2u * n], w[blk + 2u * n + 1u]) >> (8u * h);
  r.dm = w[blk + 20u];
  return r;
}

void add_row(Row r, float g) {
  const vec2 dm = unpackHalf2x16(r.dm);
  const f16vec4 s01 = nibbles02(r.sc.x), s23 = nibbles02(r.sc.y);  // (sc_j, sc_j+1, 16·m_j, 16·m_j+1)
  const vec4 a = (g * dm.x) * vec4(s01.x, s01.y * 0.25hf, s23.x * 0.0625hf, s23.y * 0.015625hf);
  corr += (g * dm.y * 0.0625) * vec4(s01.zw, s23.zw);
  for (uint k = 0u; k < UW; ++k) {
    const uint x = r.qs[k], odd = x >> 8u;
    for (uint j = 0u; j < 4u; ++j) {
      const uint m = 0x00030003u << (2u * j);
      const vec2 q02 = field02(x, m), q13 = field02(odd, m);
      acc[UW * j + k] += a[j] * vec4(q02.x, q13.x, q02.y, q13.y);
    }
  }
}
#endif

void main() {
  const uint n_blocks = p.n_in / 256u;
  const uint ul = gl_LocalInvocationID.x, slot = gl_LocalInvocationID.y;
  const uint u = gl_WorkGroupID.x * UNITS + ul;
  const uint UPB = UNITS / 4u;  // units per block
  const uint b = u < n_blocks * UPB ? u / UPB : 0u, ub = u % UPB;
  n = ub / (UPB / 2u);
  h = (ub / (UPB / 4u)) & 1u;
  h_word = 4u * h + UW * (ub % (UPB / 4u));  // hmask (Q3_K)
#if FORMAT == FORMAT_Q3_K
  q_word = 8u + 8u * n + h_word;
#else
  q_word = 4u + 8u * n + h_word;
#endif
  const uint chunk = gl_WorkGroupID.y;
  const uint j0 = p.j_start + chunk * p.rows_per_chunk;
  const uint j1 = min(p.j_end, j0 + p.rows_per_chunk);
  const uint S = ROW_SLOTS;

  for (uint i = 0u; i < 4u * UW; ++i) acc[i] = vec4(0.0);
  // Groups of ROWS_IN_FLIGHT rows: the next group's loads go out before the current group is added.
  Row next[ROWS_IN_FLIGHT], cur[ROWS_IN_FLIGHT];
  float g_next[ROWS_IN_FLIGHT], g_cur[ROWS_IN_FLIGHT];
  uint j = j0 + slot;
  if (j + (ROWS_IN_FLIGHT - 1u) * S < j1) {
    for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
      cur[i] = load_row((j + i * S) * n_blocks + b);
      g_cur[i] = dy[j + i * S];
    }
    for (j += ROWS_IN_FLIGHT * S; j + (ROWS_IN_FLIGHT - 1u) * S < j1; j += ROWS_IN_FLIGHT * S) {
      for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
        next[i] = load_row((j + i * S) * n_blocks + b);
        g_next[i] = dy[j + i * S];
      }
      for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) add_row(cur[i], g_cur[i]);
      for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) {
        cur[i] = next[i];
        g_cur[i] = g_next[i];
      }
    }
    for (uint i = 0u; i < ROWS_IN_FLIGHT; ++i) add_row(cur[i], g_cur[i]);
  }
  for (; j < j1; j += S) add_row(load_row(j * n_blocks + b), dy[j]);

  for (uint i = 0u; i < 4u * UW; ++i) red[slot * NV + ul * 4u * UW + i] = acc[i] - corr[i / UW];
  barrier();
  // Each invocation adds NV / (UNITS·ROW_SLOTS) vec4 columns over the slots, in slot order.
  const uint tid = gl_LocalInvocationIndex;
  for (uint v = tid; v < NV; v += UNITS * S) {
    vec4 sum = red[v];
    for (uint s = 1u; s < S; ++s) sum += red[s * NV + v];
    const uint uo = gl_WorkGroupID.x * UNITS + v / (4u * UW), i = v % (4u * UW);
    if (uo >= n_blocks * UPB) continue;
    const uint bo = uo / UPB, o = uo % UPB, no = o / (UPB / 2u), ho = (o / (UPB / 4u)) & 1u;
    const uint k = UW * (o % (UPB / 4u)) + i % UW;  // the vec4 inside the unit's 16 columns
    partial4[(chunk * p.n_in) / 4u + 64u * bo + 32u * no + 8u * (i / UW) + 4u * ho + k] = sum;
  }
}
