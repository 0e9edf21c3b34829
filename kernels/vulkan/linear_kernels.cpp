#include "kernels/vulkan/linear_kernels.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/shapes.h"
#include "kernels/vulkan/dispatch_util.h"

namespace q4t::vk {

// Must match kernels/glsl/gemm_push.glsl.
struct LinearKernels::GemmPush {
  uint32_t M, N, k_begin, k_end, lda, ldb, accumulate;
  uint32_t k_slice = 0;  // split K (gemm_tiled.glsl); 0: none
  uint32_t row0 = 0;     // first row of W (q4_0_gemm_coop.comp)
  float alpha = 1;       // C = (accumulate ? C : 0) + alpha·A·B (gemm_tiled.glsl)
};

namespace {

// GEMM tile edges (BM = BN, specialization constants of gemm_tiled.glsl): 128 where a product has at least
// kLargeTileMinGroups such tiles (a full wave of two 256-invocation workgroups per SM on a 132-SM H100), 64
// otherwise, where the large tiles would leave most of the GPU idle. H100, Q4_0 dx at T = 512: 16384 x 16384
// 27.2 TFLOPS with 128 against 17.9 with 64; n_in = 2048 (64 large tiles) 11.5 against 15.9.
constexpr uint32_t kGemmTile = 64;
constexpr uint32_t kGemmTileLarge = 128;
constexpr int64_t kLargeTileMinGroups = 256;
constexpr uint32_t kSkinnyEdge = 16;  // the short edge of the f32 GEMMs' tiles for rank-r products
// The tensor-core GEMMs (*_coop.comp, on devices with Device::coop_matrix): tile M x N, and the fewest tokens
// that take them (below, most of a 64-row tile would be padding).
constexpr uint32_t kCoopTileM = 64, kCoopTileN = 128;
constexpr int64_t kCoopMinTokens = 32;
constexpr int64_t kCoopLoraMaxRank = 32;  // q4_0_gemm_coop.comp's LORA_R: the staging of hs and B fits the tiles
// The tensor-core GEMM splits K when it has fewer output tiles than this (tinyllama's k and v projections at
// T = 512: 16), into slices of at least kCoopMinSliceK (a multiple of its K step of 64) for about
// kCoopSplitTarget workgroups.
constexpr int64_t kCoopSplitBelowTiles = 64;
constexpr int64_t kCoopSplitTarget = 128;
constexpr int64_t kCoopMinSliceK = 256;
// The tensor-core GEMM takes X split once per product (coop_split_rows.comp) where at least this many tiles
// along N would each split it again. H100, T = 512: 2048x2048 (16 such tiles) 81.6 -> 71.2 us, 16384x16384
// 50.6 -> 68.0 TFLOPS; 256x2048 (2 tiles) 21.2 -> 24.5 us, so it keeps splitting X per workgroup.
constexpr int64_t kCoopSplitAMinTilesN = 4;
constexpr uint32_t kGemvWorkgroup = 256;
constexpr uint32_t kGemvRows = 2;
// Q4_0 GEMV: 128 invocations, 2 rows (H100, 16384x16384: 90.0 us vs 92.9 with 256 invocations; 4 or 8 rows, and
// several quarters in flight per invocation, measured slower).
constexpr uint32_t kGemvQ4_0Workgroup = 128;
// The integer-dot GEMVs (*_gemv_dot.comp): 128 invocations, each taking 2 rows (one row set). H100, 16384x16384,
// the limb pass included: Q4_0 60.4 us and Q4_K 60.1 (91.5% and 91.9% of copy) against 65.9 and 63.7 with 4 rows,
// 71.7 and 70.8 with 8, and 67.2 and 65.4 with 4 rows of 256 invocations; the float GEMVs they replace take 90.2
// and 77.2. Q6_K: 87.9 us (91.6%) against 94.4 with 1 row, 105.2 with 4 and 92.4 with 2 sets of 2; the float
// GEMV 97.3 (all in GGML's layout; in the grouped one of q6_k.glsl, 79.9 us: 100.8% of a copy, which also
// writes). Without the limb pass the Q4_K GEMV takes 59.7 us with 4 rows: the decode's instructions, not the
// memory, bounded the float GEMVs (the comment above kGemvKWorkgroup).
// The limb pass is a dispatch and a barrier more (about 2.5 us), so small matrices keep the float GEMVs: H100,
// integer-dot against float, Q4_0 and Q4_K, us: 2048x2048 7.5/7.7 vs 5.0/5.9, 5632x2048 10.0/10.5 vs 8.0/9.7,
// 4096x4096 10.9/11.3 vs 9.6/10.1, 16384x16384 60.4/60.1 vs 90.2/77.2; the times cross near 2^25 weights. Q6_K:
// 4096x11008 (2^25.4) 22.9 either way, 32000x2048 38.2 vs 42.9.
constexpr uint32_t kGemvDotWorkgroup = 128;
constexpr uint32_t kGemvDotRows = 2;
constexpr int64_t kGemvDotMinWeights = int64_t(1) << 25;
constexpr uint32_t kDxQuarters = 64;  // quarters of block columns per dx workgroup (x)
constexpr uint32_t kDxRowSlots = 8;   // row slots per dx workgroup (y)
// Rows whose loads an invocation of the one-token dx split issues together (RU of the shaders). The split
// passes are bound by how many loads are in flight, not by occupancy: on an H100 at 16384x16384, Q4_0 89 us
// with 16 vs 100 with 4 (32: 91); Q4_K 83 us with 8 vs 92 with 4 (12 and 16 spill: 149, 198). Q6_K in GGML's
// layout, each 8-byte piece loaded with its block's alignment known, was the exception: 108.7 us with 4 vs 122.4
// with 8 (12: 204.8, 168 registers); in the grouped layout (q6_k.glsl), software-pipelined as Q4_K below: 92.2
// with 4 vs 94.2 with 3, 96.8 with 5 and 100.3 with 6. With the f16 decodes: Q4_0's pairs 64.8 us with 16 vs 66.7
// with 24 and 64.7 with 32 (q4_0_dx_split_pairs.comp reads dy 4 rows at a time: a multiple of 4); Q4_K 78.4
// with 8 vs 89.9 with 4 (12: 150.4), then software-pipelined (q4_k_dx_split.glsl: RU rows loading while RU are
// added) 68.4-69.1 with 4 vs 72.4 with 3 and 79.3 with 8.
constexpr uint32_t kDxQ4_0RowsInFlight = 16;
static_assert(kDxQ4_0RowsInFlight % 4 == 0);
constexpr uint32_t kDxKRowsInFlight = 4;
constexpr uint32_t kDxQ6_KRowsInFlight = 4;
constexpr int64_t kDxQ4_0Cols = 8 * kDxQuarters;  // dx columns per Q4_0 (and Q8_0) split workgroup
// Rows per chunk of the one-token dx: enough chunks to fill a large GPU, few enough that the partial sums
// (n_chunks x n_in floats, written and read once) stay a small fraction of the weight bytes.
constexpr int64_t kDxTargetGroups = 1024;
constexpr int64_t kDxMinRowsPerChunk = 128;

// The activations of a one-token GEMV as limbs (int_dot.glsl): three byte planes, a scale per 32 and a sum per 16.
size_t limb_bytes(int64_t n_in) { return size_t(3 * n_in + (n_in / 32 + n_in / 16) * 4); }

// What every Q4_0 product checks: W [n_out, n_in] and its bytes, and an input and an output of T rows (X and Y,
// or dY and dX).
void check_q4_0_product(const char* k, const Buffer& w, int64_t T, int64_t n_out, int64_t n_in, const char* in_name,
                        const Buffer& in, int64_t in_cols, const char* out_name, const Buffer& out, int64_t out_cols) {
  check_q4_0_linear(k, n_out, n_in, T);
  check_fits_u32(k, in_name, T * in_cols);
  check_fits_u32(k, out_name, T * out_cols);
  check_min_size(k, "W", w.size(), size_t(n_out * q4_0_row_bytes(n_in)));
  check_min_size(k, in_name, in.size(), size_t(T * in_cols) * 4);
  check_min_size(k, out_name, out.size(), size_t(T * out_cols) * 4);
}

// cols_per_group: the dx columns one workgroup of the split pass covers.
int64_t dx_rows_per_chunk(int64_t n_rows, int64_t n_in, int64_t cols_per_group) {
  const int64_t col_groups = (n_in + cols_per_group - 1) / cols_per_group;
  const int64_t want_chunks = std::max<int64_t>(1, kDxTargetGroups / col_groups);
  return std::max(kDxMinRowsPerChunk, (n_rows + want_chunks - 1) / want_chunks);
}

// The dx GEMM (T > 1) of a product too small for a wave of 128-wide tiles, but with many rows (its K): split
// over K into slices of at least kMinDxSliceRows rows, enough for about kLargeTileMinGroups workgroups of
// 128-wide tiles, summed in order by dx_reduce. H100, tinyllama's T = 512: the 64-wide tiles reach 16 TFLOPS.
constexpr int64_t kMinDxSliceRows = 512;
constexpr int64_t kMinDxSplitTiles = 16;  // fewer tiles than this: too small a product to be worth a second pass

// The forward GEMMs' split over K (see kCoopSplitBelowTiles; the tiled FP32 GEMMs, whose K steps of 32 divide
// the slices too, split the same shapes). Depends on the shape alone (the scratch is sized from it).
std::pair<int64_t, int64_t> forward_split(int64_t T, int64_t n_out, int64_t n_in) {
  const int64_t tiles = int64_t(ceil_div(T, kCoopTileM)) * ceil_div(n_out, kCoopTileN);
  if (T < kCoopMinTokens || tiles >= kCoopSplitBelowTiles) return {1, 0};
  return split_k(tiles, kCoopSplitTarget, n_in, kCoopMinSliceK, 64);
}

// The dx GEMM's split (K = n_rows; K steps of GEMM_BK = 16 in the FP32 kernels, 32 on the tensor cores).
// Depends on the shape alone (the scratch is sized from it).
std::pair<int64_t, int64_t> dx_gemm_split(int64_t T, int64_t n_rows, int64_t n_in) {
  const int64_t tiles = int64_t(ceil_div(T, kGemmTileLarge)) * ceil_div(n_in, kGemmTileLarge);
  if (T <= 1 || tiles >= kLargeTileMinGroups || tiles < kMinDxSplitTiles) return {1, 0};
  return split_k(tiles, kLargeTileMinGroups, n_rows, kMinDxSliceRows, 32);  // 32: q4_0_dx_coop.comp's K step
}

size_t dx_scratch_bytes(int64_t T, int64_t n_rows, int64_t n_in, int64_t cols_per_group) {
  if (T < 1 || n_rows <= 0 || n_in <= 0) return 0;
  if (T > 1) {
    const auto [slices, k_slice] = dx_gemm_split(T, n_rows, n_in);
    return slices > 1 ? size_t(slices * T * n_in) * 4 : 0;
  }
  const int64_t rows_per_chunk = dx_rows_per_chunk(n_rows, n_in, cols_per_group);
  return size_t((n_rows + rows_per_chunk - 1) / rows_per_chunk * n_in) * 4;
}

}  // namespace

LinearKernels::LinearKernels(Device& dev) : dev_(dev) {}

void LinearKernels::force_gemm_tile(uint32_t tile) {
  if (tile != 0 && tile != kGemmTile && tile != kGemmTileLarge)
    throw std::invalid_argument("LinearKernels::force_gemm_tile: " + std::to_string(tile) + " is not 0, " +
                                std::to_string(kGemmTile) + " or " + std::to_string(kGemmTileLarge));
  forced_gemm_tile_ = tile;
}

uint32_t LinearKernels::gemm_tile(int64_t M, int64_t N) const {
  return forced_gemm_tile_ ? forced_gemm_tile_ : gemm_tile_for(M, N);
}

uint32_t gemm_tile_for(int64_t M, int64_t N) {
  const int64_t large = int64_t(ceil_div(M, kGemmTileLarge)) * ceil_div(N, kGemmTileLarge);
  return large >= kLargeTileMinGroups ? kGemmTileLarge : kGemmTile;
}

const Pipeline& LinearKernels::pipeline(const std::string& shader, uint32_t n_buffers, uint32_t push_bytes,
                                        const std::vector<uint32_t>& spec) {
  std::string key = shader;
  for (uint32_t v : spec) key += ":" + std::to_string(v);
  auto& slot = pipelines_[key];
  if (!slot) slot = std::make_unique<Pipeline>(dev_, shader, n_buffers, push_bytes, spec);
  return *slot;
}

void LinearKernels::q4_0_gemv(Sequence& s, const Buffer& y, const Buffer& w, const Buffer& x, int64_t n_out,
                              int64_t n_in) {
  const char* k = "q4_0_gemv";
  check_q4_0_linear(k, n_out, n_in, 1);
  check_min_size(k, "W", w.size(), size_t(n_out * q4_0_row_bytes(n_in)));
  check_min_size(k, "x", x.size(), size_t(n_in) * 4);
  check_min_size(k, "y", y.size(), size_t(n_out) * 4);
  struct { uint32_t n_out, n_in; } push{uint32_t(n_out), uint32_t(n_in)};
  const uint32_t wg = kGemvQ4_0Workgroup, rows = kGemvRows;
  const auto& p = pipeline("q4_0_gemv", 3, sizeof(push), {wg, rows});
  s.dispatch(p, {&y, &w, &x}, push, {ceil_div(n_out, rows), 1, 1});
}

bool LinearKernels::integer_dot_gemv(int64_t n_out, int64_t n_in) const {
  if (!dev_.integer_dot() || integer_dot_ == IntegerDot::Never) return false;
  return integer_dot_ == IntegerDot::Always || n_out * n_in >= kGemvDotMinWeights;
}

bool LinearKernels::gemv_dot(const char* shader, uint32_t layout, uint32_t rows, Sequence& s, const Buffer& y,
                             const Buffer& w, const Buffer& x, int64_t n_out, int64_t n_in, const Buffer* scratch) {
  if (!integer_dot_gemv(n_out, n_in) || !scratch || scratch->size() < limb_bytes(n_in)) return false;
  struct { uint32_t n_in; } lp{uint32_t(n_in)};
  s.dispatch(pipeline("x_limbs", 2, sizeof(lp), {layout}), {scratch, &x}, lp,
             groups_1d(ceil_div(n_in, 256)));
  struct { uint32_t n_out, n_in; } push{uint32_t(n_out), uint32_t(n_in)};
  s.dispatch(pipeline(shader, 3, sizeof(push), {kGemvDotWorkgroup, rows, rows}), {&y, &w, scratch}, push,
             groups_1d(ceil_div(n_out, rows)));
  return true;
}

size_t LinearKernels::gemm_scratch_bytes(int64_t T, int64_t n_out, int64_t n_in) {
  if (T == 1) return limb_bytes(n_in);
  const auto [slices, k_slice] = forward_split(T, n_out, n_in);
  return slices > 1 ? size_t(slices * T * n_out) * 4 : 0;
}

namespace {
// The activations of a tensor-core GEMM split by coop_split_rows.comp into a scratch whose first `split_bytes`
// hold the split-K slices: their first uvec4, and their bytes (T rows of K values in runs of 8, and T scales).
int64_t coop_a_base(size_t split_bytes) { return int64_t((split_bytes + 15) / 16); }
size_t coop_a_bytes(int64_t T, int64_t K) { return size_t(T * ((K + 7) / 8 * 8) + T) * 4; }
struct SplitRowsPush {  // coop_split_rows.comp
  uint32_t M, K, lda, base, k_begin;
};
}  // namespace

size_t LinearKernels::forward_scratch_bytes(int64_t T, int64_t n_out, int64_t n_in) const {
  const size_t split = gemm_scratch_bytes(T, n_out, n_in);
  if (!dev_.coop_matrix() || T < kCoopMinTokens || ceil_div(n_out, kCoopTileN) < kCoopSplitAMinTilesN)
    return split;
  return size_t(coop_a_base(split)) * 16 + coop_a_bytes(T, n_in);
}

void LinearKernels::q4_0_gemm(Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                              int64_t n_out, int64_t n_in, const Buffer* scratch) {
  const char* k = "q4_0_gemm";
  check_q4_0_linear(k, n_out, n_in, T);
  if (T == 1) {
    if (!gemv_dot("q4_0_gemv_dot", 0, kGemvDotRows, s, Y, w, X, n_out, n_in, scratch))
      q4_0_gemv(s, Y, w, X, n_out, n_in);
    return;
  }
  check_q4_0_product(k, w, T, n_out, n_in, "X", X, n_in, "Y", Y, n_out);
  if (mixed_for(T, n_in)) return routed_mixed_gemm(Format::Q4_0, k, s, Y, w, X, T, n_out, n_in, scratch);
  if (dev_.coop_matrix() && T >= kCoopMinTokens) return q4_0_gemm_coop(k, s, Y, w, X, T, n_out, n_in, scratch, {}, 0);
  tiled_gemm("q4_0_gemm", s, Y, w, X, T, n_out, n_in, scratch);
}

void LinearKernels::q4_0_gemm_coop(const char* k, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X,
                                   int64_t T, int64_t n_out, int64_t n_in, const Buffer* scratch,
                                   std::array<const Buffer*, 2> lora, int64_t r) {
  // Without an adapter, bindings 3 and 4 are not read: X and W stand in.
  if (!lora[0]) lora = {&X, &w};
  const size_t split_bytes = gemm_scratch_bytes(T, n_out, n_in);
  const size_t need = forward_scratch_bytes(T, n_out, n_in);
  if (need > split_bytes && scratch && scratch->size() >= need) {
    // X split once into the scratch past the slices (the same buffer serves as C's slices and as A).
    const int64_t base = coop_a_base(split_bytes);
    check_fits_u32(k, "the scratch", int64_t(need / 4));
    const SplitRowsPush sp{uint32_t(T), uint32_t(n_in), uint32_t(n_in), uint32_t(base), 0};
    s.dispatch(pipeline("coop_split_rows", 2, sizeof(sp)), {scratch, &X}, sp, groups_1d(T));
    GemmPush push{uint32_t(T), uint32_t(n_out), 0, uint32_t(n_in), uint32_t(n_in), uint32_t(base), 0};
    dispatch_gemm(k, pipeline("q4_0_gemm_coop", 5, sizeof(GemmPush), {1, uint32_t(r)}), s, Y, *scratch, w, push, T,
                  n_out, forward_split(T, n_out, n_in), {ceil_div(n_out, kCoopTileN), ceil_div(T, kCoopTileM)},
                  scratch, lora);
    return;
  }
  const auto& p = pipeline("q4_0_gemm_coop", 5, sizeof(GemmPush), {0, uint32_t(r)});
  dispatch_forward(k, p, s, Y, w, X, T, n_out, n_in, ceil_div(n_out, kCoopTileN), ceil_div(T, kCoopTileM), scratch, 0,
                   lora);
}

bool LinearKernels::q4_0_gemm_lora(Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                                   int64_t n_out, int64_t n_in, const Buffer* scratch, const Buffer& hs,
                                   const Buffer& B, int64_t r) {
  const char* k = "q4_0_gemm (with the adapter's term)";
  if (!dev_.coop_matrix() || T < kCoopMinTokens || r < 1 || r > kCoopLoraMaxRank || mixed(T)) return false;
  check_q4_0_product(k, w, T, n_out, n_in, "X", X, n_in, "Y", Y, n_out);
  check_min_size(k, "hs", hs.size(), size_t(T * r) * 4);
  check_min_size(k, "B", B.size(), size_t(n_out * r) * 4);
  q4_0_gemm_coop(k, s, Y, w, X, T, n_out, n_in, scratch, {&hs, &B}, r);
  return true;
}

namespace {
// The window W[row0 : row0 + n] of a Q4_0 W [n_rows, n_in] (a vocabulary tile), with x [T, n_in] and the tile's
// y [T, n] (the logits, or the dx's d).
void check_rows_window(const char* k, const Buffer& w, const Buffer& x, const Buffer& y, int64_t T, int64_t n_rows,
                       int64_t row0, int64_t n, int64_t n_in) {
  check_q4_0_linear(k, n_rows, n_in, T);
  if (row0 < 0 || n < 1 || row0 + n > n_rows)
    throw ShapeError(std::string(k) + ": rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n) +
                     ") are not inside the " + std::to_string(n_rows) + " rows of W");
  check_fits_u32(k, "x", T * n_in);
  check_fits_u32(k, "the tile", T * n);
  check_min_size(k, "W", w.size(), size_t(n_rows * q4_0_row_bytes(n_in)));
  check_min_size(k, "x", x.size(), size_t(T * n_in) * 4);
  check_min_size(k, "the tile", y.size(), size_t(T * n) * 4);
}
}  // namespace

bool LinearKernels::q4_0_gemm_rows_coop(Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                                        int64_t n_rows, int64_t row0, int64_t n, int64_t n_in) {
  const char* k = "q4_0_gemm (rows)";
  if (!dev_.coop_matrix() || T < kCoopMinTokens || mixed(T)) return false;
  check_rows_window(k, w, X, Y, T, n_rows, row0, n, n_in);
  const auto& p = pipeline("q4_0_gemm_coop", 5, sizeof(GemmPush), {0, 0});
  dispatch_forward(k, p, s, Y, w, X, T, n, n_in, ceil_div(n, kCoopTileN), ceil_div(T, kCoopTileM), nullptr, row0,
                   {&X, &w});
  return true;
}

void LinearKernels::dx_coop_split(const char* k, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                                  const Buffer& scratch, int64_t T, int64_t n_in, int64_t dy_stride, int64_t dy_col0,
                                  int64_t j_start, int64_t j_end, bool accumulate, std::array<const Buffer*, 2> lora,
                                  int64_t r) {
  const int64_t n_rows = j_end - j_start;
  const int64_t base = coop_a_base(q4_0_dx_scratch_bytes(T, n_rows, n_in));
  check_fits_u32(k, "the scratch", int64_t(q4_0_dx_device_scratch_bytes(T, n_rows, n_in) / 4));
  const SplitRowsPush sp{uint32_t(T), uint32_t(n_rows), uint32_t(dy_stride), uint32_t(base), uint32_t(dy_col0)};
  s.dispatch(pipeline("coop_split_rows", 2, sizeof(sp), {1}), {&scratch, &dY}, sp, groups_1d(T));
  GemmPush push{uint32_t(T), uint32_t(n_in), uint32_t(j_start), uint32_t(j_end), uint32_t(dy_stride),
                uint32_t(base), accumulate ? 1u : 0u};
  if (!lora[0]) lora = {&scratch, &w};  // not read without an adapter
  dispatch_gemm(k, pipeline("q4_0_dx_coop", 5, sizeof(GemmPush), {1, uint32_t(r)}), s, dX, scratch, w, push, T,
                n_in, dx_gemm_split(T, n_rows, n_in), {ceil_div(n_in, kCoopTileN), ceil_div(T, kCoopTileM)},
                &scratch, lora);
}

bool LinearKernels::q4_0_dx_rows_coop(Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& d,
                                      const Buffer& scratch, int64_t T, int64_t n_rows, int64_t row0, int64_t n,
                                      int64_t n_in) {
  const char* k = "q4_0_dx (rows)";
  if (!dev_.coop_matrix() || T < kCoopMinTokens || mixed(T)) return false;
  check_rows_window(k, w, dX, d, T, n_rows, row0, n, n_in);
  check_min_size(k, "scratch", scratch.size(), q4_0_dx_device_scratch_bytes(T, n, n_in));
  dx_coop_split(k, s, dX, w, d, scratch, T, n_in, n, 0, row0, row0 + n, true);
  return true;
}

void LinearKernels::tiled_gemm(const char* shader, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X,
                               int64_t T, int64_t n_out, int64_t n_in, const Buffer* scratch) {
  const uint32_t tile = gemm_tile(T, n_out);
  const auto& p = pipeline(shader, 3, sizeof(GemmPush), {tile, tile});
  dispatch_forward(shader, p, s, Y, w, X, T, n_out, n_in, ceil_div(n_out, tile), ceil_div(T, tile), scratch);
}

void LinearKernels::dispatch_forward(const char* k, const Pipeline& p, Sequence& s, const Buffer& Y, const Buffer& w,
                                     const Buffer& X, int64_t T, int64_t n_out, int64_t n_in, uint32_t groups_n,
                                     uint32_t groups_m, const Buffer* scratch, int64_t row0,
                                     std::array<const Buffer*, 2> lora) {
  GemmPush push{uint32_t(T), uint32_t(n_out), 0, uint32_t(n_in), uint32_t(n_in), 0, 0};
  push.row0 = uint32_t(row0);
  dispatch_gemm(k, p, s, Y, X, w, push, T, n_out, forward_split(T, n_out, n_in), {groups_n, groups_m}, scratch,
                lora);
}

void LinearKernels::dispatch_gemm(const char* k, const Pipeline& p, Sequence& s, const Buffer& C, const Buffer& A,
                                  const Buffer& B, const GemmPush& push, int64_t M, int64_t N,
                                  std::pair<int64_t, int64_t> split, std::array<uint32_t, 2> groups,
                                  const Buffer* scratch, std::array<const Buffer*, 2> extra) {
  const auto [slices, k_slice] = split;
  const bool sliced = slices > 1 && scratch;
  const Buffer* out = sliced ? scratch : &C;
  GemmPush q = push;
  if (sliced) {
    check_fits_u32(k, "the split partial sums", slices * M * N);
    check_min_size(k, "scratch", scratch->size(), size_t(slices * M * N) * 4);
    q.accumulate = 0;
    q.k_slice = uint32_t(k_slice);
  }
  const std::array<uint32_t, 3> g{groups[0], groups[1], sliced ? uint32_t(slices) : 1u};
  if (extra[0])
    s.dispatch(p, {out, &A, &B, extra[0], extra[1]}, q, g);
  else
    s.dispatch(p, {out, &A, &B}, q, g);
  if (sliced) dx_reduce(s, C, *scratch, M * N, slices, push.accumulate != 0);
}

size_t LinearKernels::q4_0_dx_scratch_bytes(int64_t T, int64_t n_rows, int64_t n_in) {
  return dx_scratch_bytes(T, n_rows, n_in, kDxQ4_0Cols);
}

size_t LinearKernels::q4_0_dx_device_scratch_bytes(int64_t T, int64_t n_rows, int64_t n_in) const {
  const size_t split = q4_0_dx_scratch_bytes(T, n_rows, n_in);
  if (!dev_.coop_matrix() || T < kCoopMinTokens || n_rows <= 0) return split;
  return size_t(coop_a_base(split)) * 16 + coop_a_bytes(T, n_rows);
}

void LinearKernels::q4_0_dx(Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer* scratch,
                            int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
                            bool accumulate) {
  const char* k = "q4_0_dx";
  check_q4_0_linear(k, n_out, n_in, T);
  check_j_range(k, j_start, j_end, n_out);
  check_q4_0_product(k, w, T, n_out, n_in, "dY", dY, n_out, "dX", dX, n_in);
  if (mixed_for(T, n_in))
    return routed_mixed_dx(Format::Q4_0, k, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
  if (T > 1) {
    // On devices with cooperative matrices, q4_0_dx_coop.comp (each weight as two exact f16 parts, dY as f16
    // hi + lo; three products per K slice). H100, T = 512: 33.3 TFLOPS at 16384 x 16384 against 27.5 for the
    // FP32 kernel, 30-33 against 20-26 at tinyllama's shapes; tinyllama batch 4 with --grad-checkpoint 5161 ->
    // 5720 tok/s. Three earlier tensor-core versions measured slower than the FP32 kernel; that was before the
    // way out that slowed q4_0_gemm_coop.comp's main loop was found, and their code is gone, so whether it
    // slowed them too is not known:
    // - dY split into f16 hi + lo, each weight d·(q - 8) scaled by one power of two per workgroup and split
    //   likewise, three products per step: 9.0-10.8 TFLOPS at T = 512 against 14.2 for the FP32 kernel then;
    // - on the forward GEMM's uvec4 tiles, d split exactly into an 8-bit and a 3-bit f16 part, the hi x hi and
    //   the cross products in two sets of accumulators (which doubled its speed over one set): 25 TFLOPS at
    //   16384 x 16384 and 24-26 at tinyllama's shapes, against 27 and 20-26;
    // - one block column of W per workgroup (128 x 32 tiles, 4 subgroups), its scales folded into dY (two
    //   products per step): 14.2 TFLOPS at 16384 x 16384 and 12-13 at tinyllama's shapes against 27.5 and 20,
    //   and no faster with the hi and lo products in separate accumulators or the code tile stored [n][k].
    if (dev_.coop_matrix() && T >= kCoopMinTokens)
      return q4_0_dx_coop(k, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate, {}, 0);
    dx_gemm("q4_0_dx_gemm", s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
    return;
  }
  const int64_t n_rows = j_end - j_start;
  const int64_t rows_per_chunk = dx_rows_per_chunk(n_rows, n_in, kDxQ4_0Cols);
  const int64_t n_chunks = (n_rows + rows_per_chunk - 1) / rows_per_chunk;
  const size_t need = q4_0_dx_scratch_bytes(T, n_rows, n_in);
  if (!scratch) throw ShapeError(std::string(k) + ": the one-token path needs a scratch buffer of " +
                                 std::to_string(need) + " bytes");
  check_min_size(k, "scratch", scratch->size(), need);
  struct { uint32_t n_in, j_start, j_end, rows_per_chunk; } split{uint32_t(n_in), uint32_t(j_start),
                                                                   uint32_t(j_end), uint32_t(rows_per_chunk)};
  // Rows of an even number of blocks read as aligned words on devices with f16 arithmetic (q4_0_dx_split_pairs.comp).
  const bool pairs = f16_decode() && (n_in / 32) % 2 == 0;
  const auto& p1 =
      pipeline(pairs ? "q4_0_dx_split_pairs" : "q4_0_dx_split", 3, sizeof(split), {kDxRowSlots, kDxQ4_0RowsInFlight});
  s.dispatch(p1, {scratch, &w, &dY}, split, {ceil_div(n_in / 8, kDxQuarters), uint32_t(n_chunks), 1});
  dx_reduce(s, dX, *scratch, n_in, n_chunks, accumulate);
}

void LinearKernels::dx_gemm(const char* shader, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                            const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start,
                            int64_t j_end, bool accumulate) {
  const GemmPush push{uint32_t(T), uint32_t(n_in), uint32_t(j_start), uint32_t(j_end), uint32_t(n_out), 0,
                      accumulate ? 1u : 0u};
  // Callers size the scratch with *_dx_scratch_bytes; without one, no split. Split products take 128-wide tiles.
  const auto split = dx_gemm_split(T, j_end - j_start, n_in);
  const bool sliced = split.first > 1 && scratch;
  const uint32_t tile = sliced ? (forced_gemm_tile_ ? forced_gemm_tile_ : kGemmTileLarge) : gemm_tile(T, n_in);
  const auto& p = pipeline(shader, 3, sizeof(push), {tile, tile});
  dispatch_gemm(shader, p, s, dX, dY, w, push, T, n_in, split, {ceil_div(n_in, tile), ceil_div(T, tile)}, scratch);
}

void LinearKernels::q4_0_dx_coop(const char* k, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                                 const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start,
                                 int64_t j_end, bool accumulate, std::array<const Buffer*, 2> lora, int64_t r) {
  GemmPush push{uint32_t(T), uint32_t(n_in), uint32_t(j_start), uint32_t(j_end), uint32_t(n_out), 0,
                accumulate ? 1u : 0u};
  const int64_t n_rows = j_end - j_start;
  const size_t split_bytes = q4_0_dx_scratch_bytes(T, n_rows, n_in);
  const size_t need = q4_0_dx_device_scratch_bytes(T, n_rows, n_in);
  const std::array<uint32_t, 2> groups{ceil_div(n_in, kCoopTileN), ceil_div(T, kCoopTileM)};
  if (need > split_bytes && scratch && scratch->size() >= need) {
    // dY split once into the scratch past the slices (the same buffer serves as the slices and as A).
    // H100, T = 512: 16384x16384 33.1 -> 50.8 TFLOPS, tinyllama's shapes 30-33 -> 40-48: the 8 scalar loads
    // per invocation and step that this replaces cost more than the conversion (converting in place from
    // them, 33.1 against 34.8 when timed without the conversion).
    dx_coop_split(k, s, dX, w, dY, *scratch, T, n_in, n_out, j_start, j_start, j_end, accumulate, lora, r);
    return;
  }
  if (!lora[0]) lora = {&dY, &w};  // not read without an adapter
  dispatch_gemm(k, pipeline("q4_0_dx_coop", 5, sizeof(GemmPush), {0, uint32_t(r)}), s, dX, dY, w, push, T, n_in,
                dx_gemm_split(T, n_rows, n_in), groups, scratch, lora);
}

bool LinearKernels::q4_0_dx_lora(Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                                 const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, const Buffer& dh,
                                 const Buffer& A, int64_t r) {
  const char* k = "q4_0_dx (with the adapter's term)";
  if (!dev_.coop_matrix() || T < kCoopMinTokens || r < 1 || r > kCoopLoraMaxRank || mixed(T)) return false;
  check_q4_0_product(k, w, T, n_out, n_in, "dY", dY, n_out, "dX", dX, n_in);
  check_min_size(k, "dh", dh.size(), size_t(T * r) * 4);
  check_min_size(k, "A", A.size(), size_t(r * n_in) * 4);
  q4_0_dx_coop(k, s, dX, w, dY, scratch, T, n_out, n_in, 0, n_out, true, {&dh, &A}, r);
  return true;
}

void LinearKernels::dx_reduce(Sequence& s, const Buffer& dX, const Buffer& scratch, int64_t n_in, int64_t n_chunks,
                              bool accumulate) {
  struct { uint32_t n, n_chunks, accumulate; } red{uint32_t(n_in), uint32_t(n_chunks), accumulate ? 1u : 0u};
  const auto& p = pipeline("q4_0_dx_reduce", 2, sizeof(red));
  s.dispatch(p, {&dX, &scratch}, red, groups_1d(ceil_div(n_in, 256)));
}

// --- Q8_0, Q4_K, Q6_K and F16: one implementation over the format's shaders --------------------------------------------------

struct FrozenFormat {
  Format format;
  const char* gemm_name;  // kernel names in error messages
  const char* dx_name;
  const char* gemv_shader;
  const char* gemv_dot_shader;  // nullptr: no integer-dot GEMV
  uint32_t gemv_dot_layout;     // its limbs' layout (x_limbs.comp)
  const char* gemm_shader;
  const char* dx_gemm_shader;
  const char* dx_split_shader;
  uint32_t gemv_workgroup;    // invocations per GEMV workgroup
  uint32_t gemv_rows;         // rows per GEMV workgroup
  int64_t dx_cols_per_group;  // dx columns per workgroup of the one-token split pass
  uint32_t dx_rows_in_flight;  // RU of the split pass; 0: the shader has no such constant
  void (*check)(const char* kernel, int64_t n_out, int64_t n_in, int64_t T);
  const char* dx_split_f16_shader = nullptr;  // the split pass with the f16 decode, if the format has one
};

namespace {
constexpr int64_t kDxF16Cols = 4 * 64;  // f16_dx_split.comp: 64 invocations x 4 columns

void check_f16_on_gpu(const char* kernel, int64_t n_out, int64_t n_in, int64_t T) {
  check_f16_linear(kernel, n_out, n_in, T);
  check_f16_pairs(kernel, n_in);
}

const FrozenFormat kQ8_0{Format::Q8_0, "q8_0_gemm", "q8_0_dx", "q8_0_gemv", nullptr, 0, "q8_0_gemm", "q8_0_dx_gemm",
                         "q8_0_dx_split", kGemvWorkgroup, 2, kDxQ4_0Cols, 0,
                         check_q8_0_linear};
// K-quant GEMVs: 128 invocations per workgroup, each taking ROWS_PER_INVOCATION rows (q4_k_gemv.comp: 4, so one
// row set; q6_k_gemv.comp: 2, so one set of 128 as well). Measured at 16384x16384 against other (invocations,
// rows) pairs: on an H100, Q4_K 78.2 us here vs 81.7 with (256, 4) and 79.6 with (64, 4); Q6_K 100.2 us vs
// 108.4 with (256, 8) and 103.7 with (64, 2); on an H200 the same order, and 8 rows per invocation was slower
// still. Q6_K's in-place decode with the block alignment known per subgroup (GGML's layout) took it to 97.4 us;
// the same in-place decode for Q4_K gave 78.5 us against 76.8 (72 registers against 64), so Q4_K keeps 1 + q/16.
// The split passes cover 4 units of 32 columns per workgroup (Q6_K: 8, whole blocks), so that the chunks, which
// the reduce pass adds one after another, stay few (1024 target groups and 8 row slots measured best on the
// H100, against 512 to 8192 groups and 4 or 16 slots; 792, 1188 and 1584 slower too). Also measured there and
// slower: Q4_K with 8 to 32 units, with 16-column units (half the registers: 78 against 131, yet 61% of
// copy against 67%), with rows streamed through shared memory a tile at a time (52%), and with the chunks added
// by the last workgroup of each column group to finish instead of a second pass (an arrival counter behind a
// device-wide memory barrier: Q4_K 96 us and Q6_K 133 against 83 and 109, Q4_0 no faster).
// What bounds the K-quant GEMV and one-token dx (H100, 16384x16384, variants of the shaders timed in place of
// them): a plain read of the same 151 MB takes 50 us (110% of copy); the Q4_K GEMV's loads alone, without the
// arithmetic, 68 us (59 with the activations read contiguously); the whole GEMV with its weights kept in cache,
// 74 us, and 48 without the nibble decode. So the decode's instructions, not the memory, set the 77 us: two
// per weight (shift, and-or) beside one FMA. Decodes with fewer: nibbles left at bits 15-18 (five shifts per
// word) 73.2 us but 30 times the rounding error (2.7e-5 against 9e-7); exact floats from masks alone
// (2^23 + n·16^k, one subtraction each) 75.9 us. The Q4_K and Q6_K dx likewise: loads alone 66 and 96 us, the
// arithmetic alone 71 and 88, together 83 and 109. The integer-dot GEMVs (kGemvDotRows) take the decode away.
// The one-token dx of Q4_0 and Q4_K decodes through f16 pairs instead (q4_0_dx_split_pairs.comp,
// q4_k_dx_split.glsl): one integer operation per two weights. Measured for it on the H100 and not kept
// (16384x16384):
// - Q4_K on int8 tensor cores (16 x 16 x 32 products, codes exact, dy·d·sc as three int8 digits at one scale per
//   chunk and sub-block, the token copied into the 16 rows of M): correct, but 313 us against 83; 160 us with
//   the products left out, so staging 32 rows a step through shared memory behind two barriers already costs
//   more than the split pass;
// - Q4_K with 64-column units (a whole chunk: one header decode per 64 weights): 94-148 us at 155-193 registers;
// - codes as f32 denormals, one AND per weight and no shift (n·2^(p - 149), with dy scaled by 2^X per chunk and
//   the columns by 2^(149 - p - X) at the end; DenormPreserve declared): exact, 81.9 us at 16 rows in flight,
//   and 2-4 times slower wherever the compiler spilled the row arrays;
// - Q4_0 with a whole block per invocation and the same denormal decode: 93.6 us against 89.7.
// - Q4_K on f16 tensor cores with no digits to carry: codes exact in f16; dy·d·sc sorted into 8 exponent classes
//   of 16 binades, each class one hi and one lo f16 column of B at its own fixed scale, so the accumulators need
//   no rescaling until the end; each subgroup staged its own 16 rows a step behind subgroup barriers only.
//   Correct, but 218-266 us against 83. Taken apart by leaving pieces out: the products with their tile loads
//   about 53 us, the codes' writes to shared memory 38, the classes 28, the loop and its barriers alone 34. The
//   codes' round trip through shared memory (4 bytes per weight) is most of the split pass's time by itself.
// - Other split shapes (reduce pass included), before the f16 decode: Q4_K with 1, 2, 8 or 16 units, 2 to 64
//   row slots and 512 to 2048 target groups (best 81.5 us, 8 units and 4 slots, against 82.2); Q6_K with 1, 2,
//   4 or 16 units, 4 to 128 slots and 512 to 2048 target groups (111-572 against 107.7, GGML's layout); one
//   chunk per column group, so no reduce pass at all: 132-572. Q6_K's codes through f16 pairs as well: 108.4
//   against 108.2.
constexpr uint32_t kGemvKWorkgroup = 128;
constexpr uint32_t kGemvQ4_KRows = 4;
constexpr uint32_t kGemvQ6_KRows = 2;
constexpr int64_t kDxKCols = 256;     // q4_k_dx_split.glsl: 8 units of 32 columns
constexpr int64_t kDxQ6_KCols = 256;  // q6_k_dx_split.comp: whole blocks per workgroup
const FrozenFormat kQ4_K{Format::Q4_K, "q4_k_gemm", "q4_k_dx", "q4_k_gemv", "q4_k_gemv_dot", 1, "q4_k_gemm", "q4_k_dx_gemm", "q4_k_dx_split",
                         kGemvKWorkgroup, kGemvQ4_KRows, kDxKCols, kDxKRowsInFlight,
                         check_q4_k_linear, "q4_k_dx_split_f16"};
const FrozenFormat kQ6_K{Format::Q6_K, "q6_k_gemm", "q6_k_dx", "q6_k_gemv", "q6_k_gemv_dot", 2, "q6_k_gemm", "q6_k_dx_gemm", "q6_k_dx_split",
                         kGemvKWorkgroup, kGemvQ6_KRows, kDxQ6_KCols, kDxQ6_KRowsInFlight,
                         check_q6_k_linear};
const FrozenFormat kF16{Format::F16, "f16_gemm", "f16_dx", "f16_gemv", nullptr, 0, "f16_gemm", "f16_dx_gemm",
                        "f16_dx_split", kGemvWorkgroup, 4, kDxF16Cols, 0, check_f16_on_gpu};
}  // namespace

void LinearKernels::frozen_gemm(const FrozenFormat& f, Sequence& s, const Buffer& Y, const Buffer& w,
                                const Buffer& X, int64_t T, int64_t n_out, int64_t n_in, const Buffer* scratch) {
  const char* k = f.gemm_name;
  f.check(k, n_out, n_in, T);
  check_fits_u32(k, "X", T * n_in);
  check_fits_u32(k, "Y", T * n_out);
  check_min_size(k, "W", w.size(), size_t(device_weight_bytes(f.format, n_out, n_in)));
  check_min_size(k, "X", X.size(), size_t(T * n_in) * 4);
  check_min_size(k, "Y", Y.size(), size_t(T * n_out) * 4);
  if (mixed_for(T, n_in)) return routed_mixed_gemm(f.format, k, s, Y, w, X, T, n_out, n_in, scratch);
  if (T == 1) {
    if (f.gemv_dot_shader &&
        gemv_dot(f.gemv_dot_shader, f.gemv_dot_layout, kGemvDotRows, s, Y, w, X, n_out, n_in, scratch))
      return;
    struct { uint32_t n_out, n_in; } push{uint32_t(n_out), uint32_t(n_in)};
    const auto& p = pipeline(f.gemv_shader, 3, sizeof(push), {f.gemv_workgroup, f.gemv_rows});
    s.dispatch(p, {&Y, &w, &X}, push, groups_1d(ceil_div(n_out, f.gemv_rows)));
    return;
  }
  tiled_gemm(f.gemm_shader, s, Y, w, X, T, n_out, n_in, scratch);
}

void LinearKernels::frozen_dx(const FrozenFormat& f, Sequence& s, const Buffer& dX, const Buffer& w,
                              const Buffer& dY, const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in,
                              int64_t j_start, int64_t j_end, bool accumulate) {
  const char* k = f.dx_name;
  f.check(k, n_out, n_in, T);
  check_j_range(k, j_start, j_end, n_out);
  check_fits_u32(k, "dY", T * n_out);
  check_fits_u32(k, "dX", T * n_in);
  check_min_size(k, "W", w.size(), size_t(device_weight_bytes(f.format, n_out, n_in)));
  check_min_size(k, "dY", dY.size(), size_t(T * n_out) * 4);
  check_min_size(k, "dX", dX.size(), size_t(T * n_in) * 4);
  if (mixed_for(T, n_in))
    return routed_mixed_dx(f.format, k, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
  if (T > 1) return dx_gemm(f.dx_gemm_shader, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
  const int64_t n_rows = j_end - j_start;
  const int64_t rows_per_chunk = dx_rows_per_chunk(n_rows, n_in, f.dx_cols_per_group);
  const int64_t n_chunks = (n_rows + rows_per_chunk - 1) / rows_per_chunk;
  const size_t need = dx_scratch_bytes(T, n_rows, n_in, f.dx_cols_per_group);
  if (!scratch) throw ShapeError(std::string(k) + ": the one-token path needs a scratch buffer of " +
                                 std::to_string(need) + " bytes");
  check_min_size(k, "scratch", scratch->size(), need);
  struct { uint32_t n_in, j_start, j_end, rows_per_chunk; } split{uint32_t(n_in), uint32_t(j_start),
                                                                   uint32_t(j_end), uint32_t(rows_per_chunk)};
  std::vector<uint32_t> spec{kDxRowSlots};
  if (f.dx_rows_in_flight) spec.push_back(f.dx_rows_in_flight);
  const bool f16 = f.dx_split_f16_shader && f16_decode();
  const auto& p = pipeline(f16 ? f.dx_split_f16_shader : f.dx_split_shader, 3, sizeof(split), spec);
  s.dispatch(p, {scratch, &w, &dY}, split, {ceil_div(n_in, f.dx_cols_per_group), uint32_t(n_chunks), 1});
  dx_reduce(s, dX, *scratch, n_in, n_chunks, accumulate);
}

void LinearKernels::q8_0_gemm(Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                              int64_t n_out, int64_t n_in, const Buffer* scratch) {
  frozen_gemm(kQ8_0, s, Y, w, X, T, n_out, n_in, scratch);
}
void LinearKernels::q8_0_dx(Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer* scratch,
                            int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
                            bool accumulate) {
  frozen_dx(kQ8_0, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
}
size_t LinearKernels::q8_0_dx_scratch_bytes(int64_t T, int64_t n_rows, int64_t n_in) {
  return dx_scratch_bytes(T, n_rows, n_in, kQ8_0.dx_cols_per_group);
}

void LinearKernels::f16_gemm(Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                             int64_t n_out, int64_t n_in, const Buffer* scratch) {
  frozen_gemm(kF16, s, Y, w, X, T, n_out, n_in, scratch);
}
void LinearKernels::f16_dx(Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer* scratch,
                           int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate) {
  frozen_dx(kF16, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
}
size_t LinearKernels::f16_dx_scratch_bytes(int64_t T, int64_t n_rows, int64_t n_in) {
  return dx_scratch_bytes(T, n_rows, n_in, kF16.dx_cols_per_group);
}

void LinearKernels::q4_k_gemm(Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                              int64_t n_out, int64_t n_in, const Buffer* scratch) {
  frozen_gemm(kQ4_K, s, Y, w, X, T, n_out, n_in, scratch);
}
void LinearKernels::q4_k_dx(Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer* scratch,
                            int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
                            bool accumulate) {
  frozen_dx(kQ4_K, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
}
size_t LinearKernels::q4_k_dx_scratch_bytes(int64_t T, int64_t n_rows, int64_t n_in) {
  return dx_scratch_bytes(T, n_rows, n_in, kQ4_K.dx_cols_per_group);
}

void LinearKernels::q6_k_gemm(Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                              int64_t n_out, int64_t n_in, const Buffer* scratch) {
  frozen_gemm(kQ6_K, s, Y, w, X, T, n_out, n_in, scratch);
}
void LinearKernels::q6_k_dx(Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer* scratch,
                            int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
                            bool accumulate) {
  frozen_dx(kQ6_K, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
}
size_t LinearKernels::q6_k_dx_scratch_bytes(int64_t T, int64_t n_rows, int64_t n_in) {
  return dx_scratch_bytes(T, n_rows, n_in, kQ6_K.dx_cols_per_group);
}

namespace {
// Split K when a product has fewer than kSplitBelowTiles output tiles of the small edge: into enough slices of
// at least kMinSliceK (a multiple of the tile's BK) to make about kSplitTargetGroups workgroups. Such products
// never take the large tiles (gemm_tile), so the split depends on the shape alone. LoRA's rank-r products are
// bound by their loads' latency, not by the partial sums (slices x M x r floats): H100, tinyllama-1.1b at batch 4,
// matmul_nt forward + backward ms per step: 13.6 + 30.6 splitting below 64 tiles into about 128 workgroups, 11.4 +
// 25.7 into 1024, 11.4 + 20.2 below 256 tiles into 1024 (the 5632-row products of the MLP's weights split too).
constexpr int64_t kSplitBelowTiles = 256;
constexpr int64_t kSplitTargetGroups = 1024;
constexpr int64_t kMinSliceK = 128;

// {slices, k_slice}: 1 slice means no split.
std::pair<int64_t, int64_t> gemm_split(int64_t M, int64_t N, int64_t K) {
  const int64_t tiles = ((M + kGemmTile - 1) / kGemmTile) * ((N + kGemmTile - 1) / kGemmTile);
  if (tiles >= kSplitBelowTiles) return {1, 0};
  return split_k(tiles, kSplitTargetGroups, K, kMinSliceK, 32);
}
}  // namespace

size_t LinearKernels::gemm_split_scratch_bytes(int64_t M, int64_t N, int64_t K) {
  const auto [slices, k_slice] = gemm_split(M, N, K);
  return slices > 1 ? size_t(slices * M * N) * 4 : 0;
}

void LinearKernels::f32_gemm(const char* shader, Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B,
                             int64_t M, int64_t N, int64_t K, uint32_t lda, uint32_t ldb, bool accumulate,
                             const Buffer* scratch, float alpha) {
  check_gemm(shader, M, N, K);
  check_fits_u32(shader, "A", M * K);
  check_fits_u32(shader, "B", K * N);
  check_fits_u32(shader, "C", M * N);
  check_min_size(shader, "A", A.size(), size_t(M * K) * 4);
  check_min_size(shader, "B", B.size(), size_t(K * N) * 4);
  check_min_size(shader, "C", C.size(), size_t(M * N) * 4);
  // LoRA's rank-r sides (N or M at most 32) take 64 x 16 or 64 x 32 tiles (or 16 x 64, 32 x 64): a square tile
  // would spend most of its FMAs on padding. The tile counts, and so the split below, are those of 64 x 64 tiles.
  uint32_t bm = gemm_tile(M, N), bn = bm;
  const auto skinny = [](int64_t e) { return e <= kSkinnyEdge ? kSkinnyEdge : 2 * kSkinnyEdge; };
  if (!forced_gemm_tile_ && N <= 2 * kSkinnyEdge) bn = skinny(N), bm = kGemmTile;
  else if (!forced_gemm_tile_ && M <= 2 * kSkinnyEdge) bm = skinny(M), bn = kGemmTile;
  const auto& p = pipeline(shader, 3, sizeof(GemmPush), {bm, bn});
  GemmPush push{uint32_t(M), uint32_t(N), 0, uint32_t(K), lda, ldb, accumulate ? 1u : 0u};
  push.alpha = alpha;
  dispatch_gemm(shader, p, s, C, A, B, push, M, N, gemm_split(M, N, K), {ceil_div(N, bn), ceil_div(M, bm)},
                scratch);
}

void LinearKernels::gemm_nt(Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B, int64_t M, int64_t N,
                            int64_t K, bool accumulate, const Buffer* scratch, float alpha) {
  f32_gemm("f32_gemm_nt", s, C, A, B, M, N, K, uint32_t(K), uint32_t(K), accumulate, scratch, alpha);
}
void LinearKernels::gemm_nn(Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B, int64_t M, int64_t N,
                            int64_t K, bool accumulate, const Buffer* scratch, float alpha) {
  f32_gemm("f32_gemm_nn", s, C, A, B, M, N, K, uint32_t(K), uint32_t(N), accumulate, scratch, alpha);
}
void LinearKernels::gemm_tn(Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B, int64_t M, int64_t N,
                            int64_t K, bool accumulate, const Buffer* scratch, float alpha) {
  f32_gemm("f32_gemm_tn", s, C, A, B, M, N, K, uint32_t(M), uint32_t(N), accumulate, scratch, alpha);
}

void LinearKernels::copy(Sequence& s, const Buffer& dst, const Buffer& src, size_t bytes) {
  if (bytes % 16 != 0) throw ShapeError("copy: " + std::to_string(bytes) + " bytes is not a multiple of 16");
  check_min_size("copy", "src", src.size(), bytes);
  check_min_size("copy", "dst", dst.size(), bytes);
  struct { uint32_t n_vec4; } push{uint32_t(bytes / 16)};
  const auto& p = pipeline("copy", 2, sizeof(push));
  s.dispatch(p, {&dst, &src}, push, groups_1d(ceil_div(int64_t(bytes / 16), 256)));
}

}  // namespace q4t::vk
