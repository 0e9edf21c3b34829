// Shared parts of the fused attention kernels (attention_flash_*.comp): causal self-attention with grouped-query
// heads over q [T, H*D], k and v [T, Hkv*D], optionally within segments (seg [T] i32: query i attends key j
// only if j ≤ i and seg[j] == seg[i]); see autograd/ops/attention.cpp.
//
// SPLIT consecutive invocations share one row (a query row, or a key row in the dK/dV pass): invocation `part`
// holds head dims part, part + SPLIT, ... (DPL of them; D ≤ SPLIT·DPL, the rest zero), so neighbours read
// neighbouring floats of the shared tiles. A dot product over D is each invocation's partial sum reduced with
// subgroupShuffleXor over the SPLIT invocations (SPLIT is a power of two no larger than the subgroup).
// Tiles of TILE rows of the other side (keys, or queries) are staged in shared memory, TILE·DP floats each.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint SPLIT = 2;
layout(constant_id = 1) const uint DPL = 32;
layout(constant_id = 2) const uint TILE = 32;
const uint DP = SPLIT * DPL;    // the padded head dim of a shared row
const uint ROWS = 64u / SPLIT;  // rows per workgroup

// flags (the dK/dV pass): bit 0 writes dK, bit 1 writes dV.
layout(push_constant) uniform Push { uint T; uint H; uint Hkv; uint D; float s; uint segmented; uint flags; } u;

// Σ over the row's SPLIT invocations of v.
float row_sum(float v) {
  for (uint m = 1u; m < SPLIT; m <<= 1u) v += subgroupShuffleXor(v, m);
  return v;
}

// Whether the segment ids of two tiles can meet: their [min, max] ranges overlap (always, unsegmented).
shared int tile_seg[TILE];
shared int range[4];  // min and max of this workgroup's rows' ids, then of the staged tile's

// Ids min/max of `n` ids from seg starting at `first` into range[slot], range[slot + 1]; by invocation 0.
void seg_range(uint first, uint n, uint slot) {
  if (gl_LocalInvocationIndex == 0u) {
    int lo = 0x7FFFFFFF, hi = -0x7FFFFFFF;
    for (uint e = 0u; e < n; ++e) {
      const int v = SEG_IDS[first + e];
      lo = min(lo, v);
      hi = max(hi, v);
    }
    range[slot] = lo;
    range[slot + 1u] = hi;
  }
}

#ifdef FLASH_KEY_TILES
// The forward and dq passes: keys j0 .. j0 + TILE - 1 of kv head hk staged as ks, vs [TILE, DP] (zero past T and
// D) from the including shader's k and v buffers, with their segment ids in tile_seg. Returns false when the
// tile's ids cannot meet the workgroup's rows' (range[0..1], from seg_range(.., 0)): the caller skips it. Every
// invocation gets the same answer, and the leading barrier keeps the previous tile until all have used it.
shared float ks[TILE * DP], vs[TILE * DP];

bool stage_key_tile(uint j0, uint hk) {
  const uint lid = gl_LocalInvocationIndex, kvs = u.Hkv * u.D;
  barrier();
  for (uint e = lid; e < TILE * DP; e += 64u) {
    const uint c = e / DP, d = e % DP, j = j0 + c;
    const bool ok = j < u.T && d < u.D;
    ks[e] = ok ? k[j * kvs + hk * u.D + d] : 0.0;
    vs[e] = ok ? v[j * kvs + hk * u.D + d] : 0.0;
  }
  const uint n_keys = min(TILE, u.T - j0);
  if (u.segmented != 0u) {
    if (lid < n_keys) tile_seg[lid] = SEG_IDS[j0 + lid];
    seg_range(j0, n_keys, 2u);
  }
  barrier();
  return u.segmented == 0u || (range[3] >= range[0] && range[2] <= range[1]);
}
#endif
