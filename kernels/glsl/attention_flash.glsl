// Shared parts of the fused attention kernels (attention_flash_*.comp): causal self-attention with grouped-query
// heads over q [T, H*D], k and v [T, Hkv*D], optionally within segments (seg [T] i32: query i attends key j
// only if j ≤ i and seg[j] == seg[i]); see autograd/ops/attention.cpp.
//
// SPLIT consecutive invocations share one row (a query row, or a key row in the dK/dV pass), each holding DPL of
// its head dims (D ≤ SPLIT·DPL, the rest zero) as DPL/4 vec4s: invocation `part` has vec4 slots part,
// part + SPLIT, ..., so that neighbours read neighbouring 16 bytes of the shared tiles. Every read of a shared
// row is a 128-bit load feeding four FMAs (a scalar layout took one shared load per FMA, the kernels' bound).
// A dot product over D is each invocation's partial sum reduced with subgroupShuffleXor over the SPLIT
// invocations (SPLIT is a power of two no larger than the subgroup). Tiles of TILE rows of the other side
// (keys, or queries) are staged in shared memory, TILE·DP floats each.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 3) in;
layout(constant_id = 0) const uint SPLIT = 2;
layout(constant_id = 1) const uint DPL = 32;  // a multiple of 4
layout(constant_id = 2) const uint TILE = 32;
layout(constant_id = 3) const uint WG = 128;  // invocations per workgroup, at least TILE
const uint DPL4 = DPL / 4u;     // vec4s per invocation
const uint DP = SPLIT * DPL;    // the padded head dim of a shared row
const uint DP4 = DP / 4u;
const uint ROWS = WG / SPLIT;  // rows per workgroup

// flags (the dK/dV pass): bit 0 writes dK, bit 1 writes dV. window: query i sees key j only if i − j < window
// (0xFFFFFFFF: no window). softcap > 0: scores become softcap·tanh(score / softcap) (the FP32 passes only).
layout(push_constant) uniform Push {
  uint T; uint H; uint Hkv; uint D; float s; uint segmented; uint flags; uint window; float softcap;
} u;

// Whether query i sees key j: causal and within the sliding window.
bool visible(uint i, uint j) { return j <= i && i - j < u.window; }
// Whether a tile of keys j0 .. j0 + n − 1 lies wholly before the window of query i (uniform when i, j0 are).
bool before_window(uint j0, uint n, uint i) { return u.window != 0xFFFFFFFFu && j0 + n - 1u + u.window <= i; }
// tanh without the overflow of (e^2x − 1) / (e^2x + 1) at large |x|.
float tanh_safe(float x) {
  const float e = exp(-2.0 * abs(x));
  return sign(x) * (1.0 - e) / (1.0 + e);
}
// The soft-capped score and 1 − tanh², its derivative by the raw score (1 without a cap).
float cap_score(float sc, out float dcap) {
  if (u.softcap <= 0.0) {
    dcap = 1.0;
    return sc;
  }
  const float t = tanh_safe(sc / u.softcap);
  dcap = 1.0 - t * t;
  return u.softcap * t;
}

// Head dim e (0..3) of this invocation's vec4 t.
uint dim_of(uint part, uint t, uint e) { return 4u * (part + SPLIT * t) + e; }

// Dims 4·slot .. 4·slot + 3 of the row starting at src[base], zero from D on: the global loads of a row.
#define LOAD_DIMS4(src, base, slot, scale) \
  vec4(4u * (slot) + 0u < u.D ? (scale) * src[(base) + 4u * (slot) + 0u] : 0.0, \
       4u * (slot) + 1u < u.D ? (scale) * src[(base) + 4u * (slot) + 1u] : 0.0, \
       4u * (slot) + 2u < u.D ? (scale) * src[(base) + 4u * (slot) + 2u] : 0.0, \
       4u * (slot) + 3u < u.D ? (scale) * src[(base) + 4u * (slot) + 3u] : 0.0)

// Σ a·b over this invocation's dims: four running sums (one per vec4 lane, so four independent FMA chains),
// added at the end in a fixed order (callers rely on equal inputs giving bitwise equal sums).
#define DOT_PARTIAL(acc4, a, b) acc4 = fma((a), (b), acc4)
float sum4(vec4 v) { return (v.x + v.y) + (v.z + v.w); }

// Σ over the row's SPLIT invocations of v.
float row_sum(float v) {
  for (uint m = 1u; m < SPLIT; m <<= 1u) v += subgroupShuffleXor(v, m);
  return v;
}

// Whether the segment ids of two tiles can meet: their [min, max] ranges overlap (always, unsegmented).
shared int tile_seg[TILE];
shared int range[2];  // min and max of this workgroup's rows' ids

// Ids min/max of `n` ids from seg starting at `first` into range[0], range[1]: by the first subgroup,
// its invocations reading the ids side by side (one invocation walking them one after another, each load
// waiting on the last, was the segmented kernels' largest cost).
void seg_range(uint first, uint n) {
  if (gl_SubgroupID == 0u) {
    int lo = 0x7FFFFFFF, hi = -0x7FFFFFFF;
    for (uint e = gl_SubgroupInvocationID; e < n; e += gl_SubgroupSize) {
      const int v = SEG_IDS[first + e];
      lo = min(lo, v);
      hi = max(hi, v);
    }
    lo = subgroupMin(lo);
    hi = subgroupMax(hi);
    if (subgroupElect()) {
      range[0] = lo;
      range[1] = hi;
    }
  }
}

// Whether tile t (rows t·TILE .. of keys, or of queries in the dK/dV pass) has an id in the workgroup's rows'
// [range[0], range[1]] (from seg_range). The answers come a window of WG tiles at a time, one bit each, so
// that a tile that cannot meet costs no barrier of its own: in a packed batch most of a row's earlier tiles
// belong to other examples (with a barrier and an id range per tile, skipping them took much of the time).
// The window's ids that the caller can reach (meet_lo .. meet_hi) are read by all invocations, neighbours at
// neighbouring ids, SCAN_LOADS loads in flight each; an id in the range sets its tile's bit. Called in uniform
// control flow, segmented only; WG is a multiple of 32.
shared uint meet_bits[WG / 32u];
uint meet_window = 0xFFFFFFFFu;  // the window (t / WG) meet_bits holds; the same in every invocation
const uint SCAN_LOADS = 16u;
// The tokens the caller's loop can ask about (keys 0 .. i_last, or queries j0 ..): ids outside are not read.
// meet_hi's default is one below the largest uint, so that meet_hi + 1 does not wrap.
uint meet_lo = 0u, meet_hi = 0xFFFFFFFEu;

bool tile_meets(uint t) {
  const uint w = t / WG, lid = gl_LocalInvocationIndex;
  if (w != meet_window) {
    meet_window = w;
    barrier();  // every invocation has read the last window's bits (and range is written)
    if (lid < WG / 32u) meet_bits[lid] = 0u;
    barrier();
    const uint first = w * WG * TILE, end = min(first + WG * TILE, u.T), last = min(end, meet_hi + 1u);
    const uint n = last > first ? last - first : 0u, e_first = meet_lo > first ? meet_lo - first : 0u;
    for (uint e0 = e_first; e0 < n; e0 += SCAN_LOADS * WG) {
      int v[SCAN_LOADS];
      for (uint k = 0u; k < SCAN_LOADS; ++k) {
        const uint e = e0 + k * WG + lid;
        v[k] = e < n ? SEG_IDS[first + e] : 0;
      }
      for (uint k = 0u; k < SCAN_LOADS; ++k) {
        const uint e = e0 + k * WG + lid, tl = e / TILE;
        if (e < n && v[k] >= range[0] && v[k] <= range[1]) atomicOr(meet_bits[tl / 32u], 1u << (tl % 32u));
      }
    }
    barrier();
  }
  const uint b = t % WG;
  return ((meet_bits[b / 32u] >> (b % 32u)) & 1u) != 0u;
}

#ifdef FLASH_KEY_TILES
// The forward and dq passes: keys j0 .. j0 + TILE - 1 of kv head hk staged as ks, vs [TILE, DP] (zero past T and
// D) from the including shader's k and v buffers, with their segment ids in tile_seg. Returns false when the
// tile's ids cannot meet the workgroup's rows' (tile_meets): the caller skips it. Every invocation gets the same
// answer, and the leading barrier keeps the previous tile until all have used it.
shared vec4 ks[TILE * DP4], vs[TILE * DP4];

bool stage_key_tile(uint j0, uint hk) {
  const uint lid = gl_LocalInvocationIndex, kvs = u.Hkv * u.D;
  if (u.segmented != 0u && !tile_meets(j0 / TILE)) return false;  // not loaded at all
  barrier();
  if (u.segmented != 0u && lid < min(TILE, u.T - j0)) tile_seg[lid] = SEG_IDS[j0 + lid];
  for (uint e = lid; e < TILE * DP4; e += WG) {
    const uint c = e / DP4, slot = e % DP4, j = j0 + c;
    const uint base = min(j, u.T - 1u) * kvs + hk * u.D;
    ks[e] = j < u.T ? LOAD_DIMS4(k, base, slot, 1.0) : vec4(0.0);
    vs[e] = j < u.T ? LOAD_DIMS4(v, base, slot, 1.0) : vec4(0.0);
  }
  barrier();
  return true;
}
#endif
