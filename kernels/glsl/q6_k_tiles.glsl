// B-tile loaders of gemm_tiled.glsl for a Q6_K weight W [rows, n_in] (n_in a multiple of 256): one tile of W
// decoded straight into shared memory, four weights per task. Include after gemm_tiled.glsl and q6_k.glsl.
// `row0` offsets the rows (the vocab-tiled loss reads rows row0.. of the output matrix).

// B = Wᵀ (forward, K = n_in): Bs[k * BN + n] = W[row0 + n0 + n, k0 + k], 0 for n0 + n >= n_rows. BK = 32 is one
// quadrant run of each of BN rows: 8 BN tasks over the 256 invocations.
void q6_k_load_wt(uint n0, uint k0, uint row0, uint n_rows, uint n_in) {
  const uint n_blocks = n_in / 256u;
  for (uint t = gl_LocalInvocationID.x; t < 8u * BN; t += 256u) {
    const uint r = t / 8u, e = t % 8u;
    vec4 v = vec4(0.0);
    if (n0 + r < n_rows)
      v = q6_k_weights4((row0 + n0 + r) * n_blocks + k0 / 256u, k0 % 256u + 4u * e);
    for (uint i = 0u; i < 4u; ++i) Bs[(4u * e + i) * BN + r] = v[i];
  }
}

// B = W (dx, K = output rows): Bs[k * BN + n] = W[row0 + k0 + k, n0 + n], 0 for k0 + k >= k_end or n0 + n >= n_in.
// BK rows x BN/4 tasks over the 256 invocations.
void q6_k_load_w(uint n0, uint k0, uint k_end, uint row0, uint n_in) {
  const uint n_blocks = n_in / 256u;
  for (uint t = gl_LocalInvocationID.x; t < BK * (BN / 4u); t += 256u) {
    const uint kr = t / (BN / 4u), n = 4u * (t % (BN / 4u));
    vec4 v = vec4(0.0);
    if (k0 + kr < k_end && n0 + n < n_in)
      v = q6_k_weights4((row0 + k0 + kr) * n_blocks + (n0 + n) / 256u, (n0 + n) % 256u);
    for (uint i = 0u; i < 4u; ++i) Bs[kr * BN + n + i] = v[i];
  }
}
