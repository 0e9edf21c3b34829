// B-tile loaders of gemm_tiled.glsl for a Q8_0 weight W [rows, n_in]: one tile of W decoded straight into shared
// memory (no dequantised copy of W exists outside a BK x BN tile). Include after gemm_tiled.glsl and q8_0.glsl.
// `row0` offsets the rows (the vocab-tiled loss reads rows row0.. of the output matrix).

// B = Wᵀ (forward, K = n_in): Bs[k * BN + n] = W[row0 + n0 + n, k0 + k], 0 for n0 + n >= n_rows. BK = 32 is one
// block of each of BN rows: 8 BN eighths (one word of quants each) over the 256 invocations.
void q8_0_load_wt(uint n0, uint k0, uint row0, uint n_rows, uint n_in) {
  const uint row_bytes = (n_in / 32u) * Q8_0_BLOCK_BYTES;
  for (uint t = gl_LocalInvocationID.x; t < 8u * BN; t += 256u) {
    const uint r = t / 8u, e = t % 8u;
    vec4 v = vec4(0.0);
    if (n0 + r < n_rows) {
      const uint bb = (row0 + n0 + r) * row_bytes + (k0 / 32u) * Q8_0_BLOCK_BYTES;
      v = q8_0_scale(bb) * q8_0_unpack(q8_0_word(bb + 2u + 4u * e));
    }
    for (uint i = 0u; i < 4u; ++i) Bs[(4u * e + i) * BN + r] = v[i];
  }
}

// B = W (dx, K = output rows): Bs[k * BN + n] = W[row0 + k0 + k, n0 + n], 0 for k0 + k >= k_end or n0 + n >= n_in.
// BK rows x BN/32 blocks x 8 eighths over the 256 invocations.
void q8_0_load_w(uint n0, uint k0, uint k_end, uint row0, uint n_in) {
  const uint blocks_per_tile = BN / 32u, n_blocks = n_in / 32u;
  const uint row_bytes = n_blocks * Q8_0_BLOCK_BYTES;
  for (uint t = gl_LocalInvocationID.x; t < 8u * BK * blocks_per_tile; t += 256u) {
    const uint bi = t / 8u, e = t % 8u;
    const uint kr = bi / blocks_per_tile, bc = bi % blocks_per_tile;
    const uint blk = n0 / 32u + bc;
    vec4 v = vec4(0.0);
    if (k0 + kr < k_end && blk < n_blocks) {
      const uint bb = (row0 + k0 + kr) * row_bytes + blk * Q8_0_BLOCK_BYTES;
      v = q8_0_scale(bb) * q8_0_unpack(q8_0_word(bb + 2u + 4u * e));
    }
    for (uint i = 0u; i < 4u; ++i) Bs[kr * BN + bc * 32u + 4u * e + i] = v[i];
  }
}
