// Q6_K units (wunit.glsl) in the GPU's grouped layout (q6_k.glsl): unit s (0..7) of a super-block is half
// h = s / 4, quadrant k4 = s % 4: weight l (0..31) has the low (k4 < 2) or high nibble of ql[64h + 32·(k4 & 1) + l],
// bits 2·k4 .. 2·k4 + 1 of qh[32h + l] above it, and scale scales[8h + 2·k4 + l / 16]; value d·scale·(q − 32).
// A block's body starts on 16 bytes, so its 32 ql bytes and 32 qh bytes are two uvec4s each; then one word for
// the two scales and one for d. f32: (d·scale)·(q − 32).
#define Q6_K_WORDS wq1
#include "q6_k.glsl"

#define UNIT_WORDS 19
#define UNIT_CODE_BITS 6
struct WUnit {
  uvec4 ql[2], qh[2];
  uint scales;  // the unit's two scale bytes in bits 0-15
  float d;
  uint k4;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) {
  const uint b = row * (n_in >> 8u) + (u >> 3u), s = u & 7u, h = s >> 2u, k4 = s & 3u;
  const uint base = q6_k_base(b);
  WUnit r;
  const uint l4 = (base + 16u * h + 8u * (k4 & 1u)) >> 2u, h4 = (base + Q6_K_QH + 8u * h) >> 2u;
  r.ql[0] = wq4[l4];
  r.ql[1] = wq4[l4 + 1u];
  r.qh[0] = wq4[h4];
  r.qh[1] = wq4[h4 + 1u];
  r.scales = wq1[base + Q6_K_SCALES + 2u * h + (k4 >> 1u)] >> (16u * (k4 & 1u));
  r.d = q6_k_d(b);
  r.k4 = k4;
  return r;
}

// The 6-bit codes of weights 4e .. 4e + 3 (e = 0..7) as bytes.
uint q6_k_codes(WUnit r, uint e) {
  const uint l = r.ql[e >> 2u][e & 3u], q = r.qh[e >> 2u][e & 3u];
  return ((l >> (4u * (r.k4 >> 1u))) & 0x0F0F0F0Fu) | (((q >> (2u * r.k4)) & 0x03030303u) << 4u);
}

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) {
  const uint shl = 4u * (r.k4 >> 1u), shh = 2u * r.k4;
  const float16_t bias = float16_t(32.0);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    const f16vec2 ds = f16vec2(float16_t(r.d * float(bitfieldExtract(int(r.scales), int(8u * (e >> 1u)), 8))));
    const uvec4 l = r.ql[e >> 1u], q = r.qh[e >> 1u];
    const uint la = (e & 1u) == 0u ? l.x : l.z, lb = (e & 1u) == 0u ? l.y : l.w;
    const uint qa = (e & 1u) == 0u ? q.x : q.z, qb = (e & 1u) == 0u ? q.y : q.w;
    const uint a = ((la >> shl) & 0x0F0F0F0Fu) | (((qa >> shh) & 0x03030303u) << 4u);
    const uint b = ((lb >> shl) & 0x0F0F0F0Fu) | (((qb >> shh) & 0x03030303u) << 4u);
    h[e] = uvec4(packFloat2x16(codes_minus(bytes01(a), bias) * ds), packFloat2x16(codes_minus(bytes23(a), bias) * ds),
                 packFloat2x16(codes_minus(bytes01(b), bias) * ds), packFloat2x16(codes_minus(bytes23(b), bias) * ds));
  }
}
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  [[unroll]] for (uint t = 0u; t < 2u; ++t) {
    const float ds = r.d * float(bitfieldExtract(int(r.scales), int(8u * t), 8));
    [[unroll]] for (uint e = 4u * t; e < 4u * t + 4u; ++e) f[e] = ds * bytes_minus(q6_k_codes(r, e), 32.0);
  }
}

// The 6-bit codes of weights 4e .. 4e + 3 (q6_k_codes), and (ds, ds', −32ds, −32ds') with ds = d·scale.
uint unit_codes(WUnit r, uint e) { return q6_k_codes(r, e); }
vec4 unit_affine(WUnit r) {
  const float d0 = r.d * float(bitfieldExtract(int(r.scales), 0, 8));
  const float d1 = r.d * float(bitfieldExtract(int(r.scales), 8, 8));
  return vec4(d0, d1, -32.0 * d0, -32.0 * d1);
}
