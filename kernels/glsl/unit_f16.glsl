// F16 units (wunit.glsl): 32 halves, 64 bytes on a 16-byte boundary (n_in a multiple of 32), taken as they are.
struct WUnit {
  uvec4 v[4];
};

WUnit unit_fetch(uint row, uint u, uint n_in) {
  const uint i = (row * n_in + 32u * u) >> 3u;
  WUnit r;
  [[unroll]] for (uint e = 0u; e < 4u; ++e) r.v[e] = wq4[i + e];
  return r;
}

void unit_decode(WUnit r, out uvec4 h[4]) {
  [[unroll]] for (uint e = 0u; e < 4u; ++e) h[e] = r.v[e];
}
