// F16 units (wunit.glsl): 32 halves, 64 bytes on a 16-byte boundary (n_in a multiple of 32), taken as they are, in
// four parts of 16 bytes (UNIT_PARTS): neighbouring invocations read neighbouring parts.
struct WUnit {
  uvec4 v;
};

WUnit unit_fetch(uint row, uint u, uint part, uint n_in) { return WUnit(wq4[(row * n_in + 32u * u) / 8u + part]); }

void unit_decode(WUnit r, out uvec4 h[UNIT_VECS]) { h[0] = r.v; }
