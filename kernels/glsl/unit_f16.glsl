// F16 units (wunit.glsl): 32 halves, 64 bytes on a 16-byte boundary (n_in a multiple of 32), taken as they are, in
// four parts of 16 bytes (UNIT_PARTS): neighbouring invocations read neighbouring parts. f32: each half widened
// (exact).
#define UNIT_WORDS 4
struct WUnit {
  uvec4 v;
};

#ifdef W_PANELS
// W as decode_f16.comp writes it with PANELS: k-panels of 32 columns, panel u holding columns 32u .. 32u + 31 of
// all W_PANEL_ROWS rows (64 bytes a row), from uvec4 W_BASE on.
WUnit unit_fetch(uint row, uint u, uint part, uint n_in) { return WUnit(wq4[W_BASE + 4u * (u * W_PANEL_ROWS + row) + part]); }
#else
WUnit unit_fetch(uint row, uint u, uint part, uint n_in) { return WUnit(wq4[(row * n_in + 32u * u) / 8u + part]); }
#endif

#ifndef UNIT_F32_ONLY
void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) { h[0] = r.v; }
#endif

void unit_decode_f32(WUnit r, out vec4 f[2u * UNIT_VECS]) {
  f[0] = vec4(unpackHalf2x16(r.v.x), unpackHalf2x16(r.v.y));
  f[1] = vec4(unpackHalf2x16(r.v.z), unpackHalf2x16(r.v.w));
}
