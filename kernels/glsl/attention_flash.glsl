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
