// B-tile loaders of gemm_tiled.glsl for an F16 weight W [rows, n_in] (n_in even, so every row starts on a word
// and a word's two halves are both inside the row or both past its end). Include after gemm_tiled.glsl, with
// F16_WORDS defined as the uint[] array holding the halves. `row0` offsets the rows (the vocab-tiled loss reads
// rows row0.. of the output matrix).
#ifndef F16_WORDS
#error "define F16_WORDS as the uint[] array holding the halves"
#endif

// B = Wᵀ (forward, K = n_in): Bs[k * BN + n] = W[row0 + n0 + n, k0 + k], 0 outside n0 + n < n_rows, k0 + k < n_in.
// A row's 32 halves are 16 words: 16 BN words over the 256 invocations.
void f16_load_wt(uint n0, uint k0, uint row0, uint n_rows, uint n_in) {
  for (uint t = gl_LocalInvocationID.x; t < 16u * BN; t += 256u) {
    const uint r = t / 16u, k = 2u * (t % 16u);
    vec2 v = vec2(0.0);
    if (n0 + r < n_rows && k0 + k < n_in) v = unpackHalf2x16(F16_WORDS[((row0 + n0 + r) * n_in + k0 + k) / 2u]);
    Bs[k * BN + r] = v.x;
    Bs[(k + 1u) * BN + r] = v.y;
  }
}

// B = W (dx, K = output rows): Bs[k * BN + n] = W[row0 + k0 + k, n0 + n], 0 outside k0 + k < k_end, n0 + n < n_in.
// BK rows of BN/2 words over the 256 invocations.
void f16_load_w(uint n0, uint k0, uint k_end, uint row0, uint n_in) {
  for (uint t = gl_LocalInvocationID.x; t < BK * BN / 2u; t += 256u) {
    const uint kr = t / (BN / 2u), n = 2u * (t % (BN / 2u));
    vec2 v = vec2(0.0);
    if (k0 + kr < k_end && n0 + n < n_in) v = unpackHalf2x16(F16_WORDS[((row0 + k0 + kr) * n_in + n0 + n) / 2u]);
    Bs[kr * BN + n] = v.x;
    Bs[kr * BN + n + 1u] = v.y;
  }
}
