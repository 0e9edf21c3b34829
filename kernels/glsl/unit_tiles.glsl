// B-tile loaders of gemm_tiled.glsl for a weight W [rows, n_in] in any unit format (wunit.glsl; FORMAT set by the
// variant): one tile of W decoded straight into shared memory, each weight in f32 as GGML dequantises it
// (unit_decode_f32). Include after gemm_tiled.glsl and wunit.glsl (with UNIT_F32_ONLY; with UNIT_SHARED_TABLE the
// first call sets the table up, behind a barrier: every invocation calls the loaders alike, as gemm_tiled.glsl
// does). `row0` offsets the rows (the vocab-tiled loss reads rows row0.. of the output matrix). n_in is a multiple
// of 32 (256 for the K-quants and IQ4_XS); F16 and BF16 are read a word (two weights) at a time instead, so any
// even n_in works for them.
//   unit_load_wt(n0, k0, row0, n_rows, n_in)  B = Wᵀ (forward, K = n_in): Bs[k·BN + n] = W[row0 + n0 + n, k0 + k],
//                                              0 for n0 + n >= n_rows (and F16/BF16: k0 + k >= n_in);
//   unit_load_w(n0, k0, k_end, row0, n_in)    B = W (dx, K = output rows): Bs[k·BN + n] = W[row0 + k0 + k, n0 + n],
//                                              0 for k0 + k >= k_end or n0 + n >= n_in.
// BK (GEMM_BK) is 32 or 16; a forward K step of 16 decodes the whole unit and keeps its half.

#if FORMAT == FORMAT_F16 || FORMAT == FORMAT_BF16
// Weights 2i and 2i + 1 of the matrix (word i), in f32.
vec2 unit_word_pair(uint i) {
#if FORMAT == FORMAT_F16
  return unpackHalf2x16(wq1[i]);
#else
  return bf16_pair(wq1[i]);
#endif
}

// A row's BK weights are BK / 2 words: BN·BK / 2 words over the 256 invocations.
void unit_load_wt(uint n0, uint k0, uint row0, uint n_rows, uint n_in) {
  for (uint t = gl_LocalInvocationID.x; t < BN * (BK / 2u); t += 256u) {
    const uint r = t / (BK / 2u), k = 2u * (t % (BK / 2u));
    vec2 v = vec2(0.0);
    if (n0 + r < n_rows && k0 + k < n_in) v = unit_word_pair(((row0 + n0 + r) * n_in + k0 + k) / 2u);
    Bs[k * BN + r] = v.x;
    Bs[(k + 1u) * BN + r] = v.y;
  }
}

// BK rows of BN / 2 words over the 256 invocations.
void unit_load_w(uint n0, uint k0, uint k_end, uint row0, uint n_in) {
  for (uint t = gl_LocalInvocationID.x; t < BK * (BN / 2u); t += 256u) {
    const uint kr = t / (BN / 2u), n = 2u * (t % (BN / 2u));
    vec2 v = vec2(0.0);
    if (k0 + kr < k_end && n0 + n < n_in) v = unit_word_pair(((row0 + k0 + kr) * n_in + n0 + n) / 2u);
    Bs[kr * BN + n] = v.x;
    Bs[kr * BN + n + 1u] = v.y;
  }
}

#else
#if UNIT_PARTS != 1
#error "unit_tiles.glsl reads whole units"
#endif

#ifdef UNIT_HAS_SETUP
bool unit_tiles_ready = false;
void unit_tiles_setup() {
  if (unit_tiles_ready) return;
  unit_setup();
  barrier();
  unit_tiles_ready = true;
}
#else
void unit_tiles_setup() {}
#endif

// One unit (32 weights) of each of BN rows: BN invocations, each decoding its unit; weight i goes to k = i - k0 % 32
// (every i for BK = 32; with BK = 16 the half at k0 % 32).
void unit_load_wt(uint n0, uint k0, uint row0, uint n_rows, uint n_in) {
  unit_tiles_setup();
  const uint kb = k0 % 32u;
  for (uint r = gl_LocalInvocationID.x; r < BN; r += 256u) {
    vec4 f[8];
    if (n0 + r < n_rows)
      unit_decode_f32(unit_fetch(row0 + n0 + r, k0 / 32u, 0u, n_in), f);
    else
      [[unroll]] for (uint e = 0u; e < 8u; ++e) f[e] = vec4(0.0);
    [[unroll]] for (uint i = 0u; i < 32u; ++i)
      if (i - kb < BK) Bs[(i - kb) * BN + r] = f[i / 4u][i % 4u];
  }
}

// The units covering columns n0 .. n0 + BN of each of BK rows (BN / 32 a row; one, partly kept, for BN = 16).
void unit_load_w(uint n0, uint k0, uint k_end, uint row0, uint n_in) {
  unit_tiles_setup();
  const uint per_row = max(1u, BN / 32u);
  for (uint t = gl_LocalInvocationID.x; t < BK * per_row; t += 256u) {
    const uint kr = t / per_row, u = n0 / 32u + t % per_row;
    vec4 f[8];
    if (k0 + kr < k_end && u < n_in / 32u)
      unit_decode_f32(unit_fetch(row0 + k0 + kr, u, 0u, n_in), f);
    else
      [[unroll]] for (uint e = 0u; e < 8u; ++e) f[e] = vec4(0.0);
    const uint nb = 32u * u - n0;  // the unit's first column in the tile (wraps below 0 where BN = 16)
    [[unroll]] for (uint i = 0u; i < 32u; ++i)
      if (nb + i < BN) Bs[kr * BN + nb + i] = f[i / 4u][i % 4u];
  }
}
#endif
