// B loader for gemm_tiled.glsl when B is f32 stored [K, N] (row stride ldb).
void load_tile_b(uint n0, uint k0) {
  const uint t = gl_LocalInvocationID.x;
  const uint n = t % BN;
  for (uint i = 0u; i < BK * BN / 256u; ++i) {
    const uint k = (t + 256u * i) / BN;
    const bool ok = n0 + n < p.N && k0 + k < p.k_end;
    Bs[k * BN + n] = ok ? b[(k0 + k) * p.ldb + n0 + n] : 0.0;
  }
}
