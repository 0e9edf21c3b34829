// A loaders for gemm_tiled.glsl. A_TRANSPOSED: A is stored [K, M] (row stride lda), else [M, K].
void load_tile_a(uint m0, uint k0) {
  const uint t = gl_LocalInvocationID.x;
#ifdef A_TRANSPOSED
  const uint m = t % BM;
  for (uint i = 0u; i < BK * BM / 256u; ++i) {
    const uint k = (t + 256u * i) / BM;
    const bool ok = m0 + m < p.M && k0 + k < p.k_end;
    As[k * BM + m] = ok ? a[(k0 + k) * p.lda + m0 + m] : 0.0;
  }
#else
  const uint k = t % BK;
  for (uint i = 0u; i < BK * BM / 256u; ++i) {
    const uint m = t / BK + (256u / BK) * i;
    const bool ok = m0 + m < p.M && k0 + k < p.k_end;
    As[k * BM + m] = ok ? a[(m0 + m) * p.lda + k0 + k] : 0.0;
  }
#endif
}
