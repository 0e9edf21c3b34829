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
// otherwise, where the large tiles would leave most of the GPU idle (docs/kernels.md, "Tiled GEMMs").
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
// along N would each split it again; with fewer, the extra pass costs more than it saves (docs/kernels.md).
constexpr int64_t kCoopSplitAMinTilesN = 4;
// The integer-dot GEMVs (*_gemv_dot.comp): 128 invocations in one row set of the format's gemv_dot_rows. They
// take away the decode's instructions, which bound the float GEMVs; their limb pass is a dispatch and a barrier
// more, so matrices under kGemvDotMinWeights keep the float GEMVs (docs/kernels.md, "Integer-dot GEMVs").
constexpr uint32_t kGemvDotWorkgroup = 128;
constexpr int64_t kGemvDotMinWeights = int64_t(1) << 25;
// Rows per chunk of the one-token dx: enough chunks to fill a large GPU, few enough that the partial sums
// (n_chunks x n_in floats, written and read once) stay a small fraction of the weight bytes.
constexpr int64_t kDxTargetGroups = 1024;
constexpr int64_t kDxMinRowsPerChunk = 128;

// The activations of a one-token GEMV as limbs (int_dot.glsl): three byte planes, a scale per 32 and a sum per 16.
size_t limb_bytes(int64_t n_in) { return size_t(3 * n_in + (n_in / 32 + n_in / 16) * 4); }

// cols_per_group: the dx columns one workgroup of the split pass covers.
int64_t dx_rows_per_chunk(int64_t n_rows, int64_t n_in, int64_t cols_per_group) {
  const int64_t col_groups = (n_in + cols_per_group - 1) / cols_per_group;
  const int64_t want_chunks = std::max<int64_t>(1, kDxTargetGroups / col_groups);
  return std::max(kDxMinRowsPerChunk, (n_rows + want_chunks - 1) / want_chunks);
}

// The dx GEMM (T > 1) of a product too small for a wave of 128-wide tiles, but with many rows (its K): split
// over K into slices of at least kMinDxSliceRows rows, enough for about kLargeTileMinGroups workgroups of
// 128-wide tiles, summed in order by dx_reduce.
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

bool LinearKernels::integer_dot_gemv(int64_t n_out, int64_t n_in) const {
  if (!dev_.integer_dot() || integer_dot_ == IntegerDot::Never) return false;
  return integer_dot_ == IntegerDot::Always || n_out * n_in >= kGemvDotMinWeights;
}

bool LinearKernels::gemv_dot(const char* shader, uint32_t layout, uint32_t rows, Sequence& s, const Buffer& y,
                             const Buffer& w, const Buffer& x, int64_t n_out, int64_t n_in, const Buffer* scratch) {
  if (!integer_dot_gemv(n_out, n_in) || !scratch || scratch->size() < limb_bytes(n_in)) return false;
  struct { uint32_t n_in; } lp{uint32_t(n_in)};
  // Two limbs (16-bit activations) under the mixed precision, three (24-bit) in f32: int_dot.glsl.
  const uint32_t limbs = precision_ == Precision::Mixed ? 2 : 3;
  s.dispatch(pipeline("x_limbs", 2, sizeof(lp), {layout, limbs}), {scratch, &x}, lp,
             groups_1d(ceil_div(n_in, 256)));
  struct { uint32_t n_out, n_in; } push{uint32_t(n_out), uint32_t(n_in)};
  s.dispatch(pipeline(shader, 3, sizeof(push), {kGemvDotWorkgroup, rows, rows, limbs}), {&y, &w, scratch}, push,
             groups_1d(ceil_div(n_out, rows)));
  return true;
}

namespace {
// The activations of a tensor-core GEMM split by coop_split_rows.comp into a scratch whose first `split_bytes`
// hold the split-K slices: their first uvec4, and their bytes (T rows of K values in runs of 8, and T scales).
int64_t coop_a_base(size_t split_bytes) { return int64_t((split_bytes + 15) / 16); }
size_t coop_a_bytes(int64_t T, int64_t K) { return size_t(T * ((K + 7) / 8 * 8) + T) * 4; }
struct SplitRowsPush {  // coop_split_rows.comp
  uint32_t M, K, lda, base, k_begin;
};

// The forward's scratch without the tensor-core part: the limbs of a one-token GEMV, or the split-K slices.
size_t forward_split_bytes(int64_t T, int64_t n_out, int64_t n_in) {
  if (T == 1) return limb_bytes(n_in);
  const auto [slices, k_slice] = forward_split(T, n_out, n_in);
  return slices > 1 ? size_t(slices * T * n_out) * 4 : 0;
}

// A shader of the format's row, or its unit kernel (unit_<kind>_<name>) where the row names none.
std::string shader_of(const char* own, const char* unit_kind, const FormatTraits& t) {
  return own ? std::string(own) : std::string("unit_") + unit_kind + "_" + t.name;
}

// What every frozen product checks: W [n_out, n_in] in its device layout, and an input and an output of T rows (X
// and Y, or dY and dX).
void check_product(Format f, const char* k, const Buffer& w, int64_t T, int64_t n_out, int64_t n_in,
                   const char* in_name, const Buffer& in, int64_t in_cols, const char* out_name, const Buffer& out,
                   int64_t out_cols) {
  check_gpu_frozen_linear(f, k, n_out, n_in, T);
  check_fits_u32(k, in_name, T * in_cols);
  check_fits_u32(k, out_name, T * out_cols);
  check_min_size(k, "W", w.size(), size_t(device_weight_bytes(f, n_out, n_in)));
  check_min_size(k, in_name, in.size(), size_t(T * in_cols) * 4);
  check_min_size(k, out_name, out.size(), size_t(T * out_cols) * 4);
}

// The window W[row0 : row0 + n] of W [n_rows, n_in] (a vocabulary tile), with x [T, n_in] and the tile's y [T, n]
// (the logits, or the dx's d).
void check_rows_window(Format f, const char* k, const Buffer& w, const Buffer& x, const Buffer& y, int64_t T,
                       int64_t n_rows, int64_t row0, int64_t n, int64_t n_in) {
  check_gpu_frozen_linear(f, k, n_rows, n_in, T);
  if (row0 < 0 || n < 1 || row0 + n > n_rows)
    throw ShapeError(std::string(k) + ": rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n) +
                     ") are not inside the " + std::to_string(n_rows) + " rows of W");
  check_fits_u32(k, "x", T * n_in);
  check_fits_u32(k, "the tile", T * n);
  check_min_size(k, "W", w.size(), size_t(device_weight_bytes(f, n_rows, n_in)));
  check_min_size(k, "x", x.size(), size_t(T * n_in) * 4);
  check_min_size(k, "the tile", y.size(), size_t(T * n) * 4);
}
}  // namespace

size_t LinearKernels::gemm_scratch_bytes(Format f, int64_t T, int64_t n_out, int64_t n_in) const {
  const size_t split = forward_split_bytes(T, n_out, n_in);
  if (!format_traits(f).gpu.coop_gemm || !dev_.coop_matrix() || T < kCoopMinTokens ||
      ceil_div(n_out, kCoopTileN) < kCoopSplitAMinTilesN)
    return split;
  return size_t(coop_a_base(split)) * 16 + coop_a_bytes(T, n_in);
}

size_t LinearKernels::dx_scratch_bytes(Format f, int64_t T, int64_t n_rows, int64_t n_in) const {
  const FormatTraits& t = format_traits(f);
  const size_t split = q4t::vk::dx_scratch_bytes(T, n_rows, n_in, t.gpu.dx_cols);
  if (!t.gpu.coop_dx || !dev_.coop_matrix() || T < kCoopMinTokens || n_rows <= 0) return split;
  return size_t(coop_a_base(split)) * 16 + coop_a_bytes(T, n_rows);
}

void LinearKernels::gemm(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                         int64_t n_out, int64_t n_in, const Buffer* scratch) {
  const FormatTraits& t = format_traits(f);
  const GpuKernels& g = t.gpu;
  const std::string name = std::string(t.name) + (T == 1 ? "_gemv" : "_gemm");
  const char* k = name.c_str();
  check_product(f, k, w, T, n_out, n_in, T == 1 ? "x" : "X", X, n_in, T == 1 ? "y" : "Y", Y, n_out);
  if (mixed_for(T, n_in)) return routed_mixed_gemm(f, k, s, Y, w, X, T, n_out, n_in, scratch);
  if (T == 1) {
    if (g.gemv_dot && gemv_dot(g.gemv_dot, g.gemv_dot_layout, g.gemv_dot_rows, s, Y, w, X, n_out, n_in, scratch))
      return;
    struct { uint32_t n_out, n_in; } push{uint32_t(n_out), uint32_t(n_in)};
    const auto& p = pipeline(shader_of(g.gemv, "gemv", t), 3, sizeof(push), {g.gemv_workgroup, g.gemv_rows});
    s.dispatch(p, {&Y, &w, &X}, push, groups_1d(ceil_div(n_out, g.gemv_rows)));
    return;
  }
  if (g.coop_gemm && dev_.coop_matrix() && T >= kCoopMinTokens)
    return coop_gemm(t, k, s, Y, w, X, T, n_out, n_in, scratch, {}, 0);
  const std::string shader = shader_of(g.gemm, "gemm", t);
  tiled_gemm(shader.c_str(), s, Y, w, X, T, n_out, n_in, scratch);
}

void LinearKernels::coop_gemm(const FormatTraits& t, const char* k, Sequence& s, const Buffer& Y, const Buffer& w,
                              const Buffer& X, int64_t T, int64_t n_out, int64_t n_in, const Buffer* scratch,
                              std::array<const Buffer*, 2> lora, int64_t r) {
  // Without an adapter, bindings 3 and 4 are not read: X and W stand in.
  if (!lora[0]) lora = {&X, &w};
  const size_t split_bytes = forward_split_bytes(T, n_out, n_in);
  const size_t need = gemm_scratch_bytes(t.format, T, n_out, n_in);
  if (need > split_bytes && scratch && scratch->size() >= need) {
    // X split once into the scratch past the slices (the same buffer serves as C's slices and as A).
    const int64_t base = coop_a_base(split_bytes);
    check_fits_u32(k, "the scratch", int64_t(need / 4));
    const SplitRowsPush sp{uint32_t(T), uint32_t(n_in), uint32_t(n_in), uint32_t(base), 0};
    s.dispatch(pipeline("coop_split_rows", 2, sizeof(sp)), {scratch, &X}, sp, groups_1d(T));
    GemmPush push{uint32_t(T), uint32_t(n_out), 0, uint32_t(n_in), uint32_t(n_in), uint32_t(base), 0};
    dispatch_gemm(k, pipeline(t.gpu.coop_gemm, 5, sizeof(GemmPush), {1, uint32_t(r)}), s, Y, *scratch, w, push, T,
                  n_out, forward_split(T, n_out, n_in), {ceil_div(n_out, kCoopTileN), ceil_div(T, kCoopTileM)},
                  scratch, lora);
    return;
  }
  const auto& p = pipeline(t.gpu.coop_gemm, 5, sizeof(GemmPush), {0, uint32_t(r)});
  dispatch_forward(k, p, s, Y, w, X, T, n_out, n_in, ceil_div(n_out, kCoopTileN), ceil_div(T, kCoopTileM), scratch, 0,
                   lora);
}

bool LinearKernels::gemm_lora(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                              int64_t n_out, int64_t n_in, const Buffer* scratch, const Buffer& hs, const Buffer& B,
                              int64_t r) {
  const FormatTraits& t = format_traits(f);
  const std::string name = std::string(t.name) + "_gemm (with the adapter's term)";
  const char* k = name.c_str();
  if (!t.gpu.coop_gemm || !dev_.coop_matrix() || T < kCoopMinTokens || r < 1 || r > kCoopLoraMaxRank || mixed(T))
    return false;
  check_product(f, k, w, T, n_out, n_in, "X", X, n_in, "Y", Y, n_out);
  check_min_size(k, "hs", hs.size(), size_t(T * r) * 4);
  check_min_size(k, "B", B.size(), size_t(n_out * r) * 4);
  coop_gemm(t, k, s, Y, w, X, T, n_out, n_in, scratch, {&hs, &B}, r);
  return true;
}

bool LinearKernels::gemm_rows_coop(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                                   int64_t n_rows, int64_t row0, int64_t n, int64_t n_in) {
  const FormatTraits& t = format_traits(f);
  const std::string name = std::string(t.name) + "_gemm (rows)";
  const char* k = name.c_str();
  if (!t.gpu.coop_gemm || !dev_.coop_matrix() || T < kCoopMinTokens || mixed(T)) return false;
  check_rows_window(f, k, w, X, Y, T, n_rows, row0, n, n_in);
  const auto& p = pipeline(t.gpu.coop_gemm, 5, sizeof(GemmPush), {0, 0});
  dispatch_forward(k, p, s, Y, w, X, T, n, n_in, ceil_div(n, kCoopTileN), ceil_div(T, kCoopTileM), nullptr, row0,
                   {&X, &w});
  return true;
}

void LinearKernels::dx_coop_split(const FormatTraits& t, const char* k, Sequence& s, const Buffer& dX, const Buffer& w,
                                  const Buffer& dY, const Buffer& scratch, int64_t T, int64_t n_in, int64_t dy_stride,
                                  int64_t dy_col0, int64_t j_start, int64_t j_end, bool accumulate,
                                  std::array<const Buffer*, 2> lora, int64_t r) {
  const int64_t n_rows = j_end - j_start;
  const int64_t base = coop_a_base(q4t::vk::dx_scratch_bytes(T, n_rows, n_in, t.gpu.dx_cols));
  check_fits_u32(k, "the scratch", int64_t(dx_scratch_bytes(t.format, T, n_rows, n_in) / 4));
  const SplitRowsPush sp{uint32_t(T), uint32_t(n_rows), uint32_t(dy_stride), uint32_t(base), uint32_t(dy_col0)};
  s.dispatch(pipeline("coop_split_rows", 2, sizeof(sp), {1}), {&scratch, &dY}, sp, groups_1d(T));
  GemmPush push{uint32_t(T), uint32_t(n_in), uint32_t(j_start), uint32_t(j_end), uint32_t(dy_stride),
                uint32_t(base), accumulate ? 1u : 0u};
  if (!lora[0]) lora = {&scratch, &w};  // not read without an adapter
  dispatch_gemm(k, pipeline(t.gpu.coop_dx, 5, sizeof(GemmPush), {1, uint32_t(r)}), s, dX, scratch, w, push, T, n_in,
                dx_gemm_split(T, n_rows, n_in), {ceil_div(n_in, kCoopTileN), ceil_div(T, kCoopTileM)}, &scratch,
                lora);
}

bool LinearKernels::dx_rows_coop(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& d,
                                 const Buffer& scratch, int64_t T, int64_t n_rows, int64_t row0, int64_t n,
                                 int64_t n_in) {
  const FormatTraits& t = format_traits(f);
  const std::string name = std::string(t.name) + "_dx (rows)";
  const char* k = name.c_str();
  if (!t.gpu.coop_dx || !dev_.coop_matrix() || T < kCoopMinTokens || mixed(T)) return false;
  check_rows_window(f, k, w, dX, d, T, n_rows, row0, n, n_in);
  check_min_size(k, "scratch", scratch.size(), dx_scratch_bytes(f, T, n, n_in));
  dx_coop_split(t, k, s, dX, w, d, scratch, T, n_in, n, 0, row0, row0 + n, true);
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

void LinearKernels::dx(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                       const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
                       bool accumulate) {
  const FormatTraits& t = format_traits(f);
  const GpuKernels& g = t.gpu;
  const std::string name = std::string(t.name) + "_dx";
  const char* k = name.c_str();
  check_gpu_frozen_linear(f, k, n_out, n_in, T);
  check_j_range(k, j_start, j_end, n_out);
  check_product(f, k, w, T, n_out, n_in, "dY", dY, n_out, "dX", dX, n_in);
  if (mixed_for(T, n_in))
    return routed_mixed_dx(f, k, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
  if (T > 1) {
    if (g.coop_dx && dev_.coop_matrix() && T >= kCoopMinTokens)
      return coop_dx(t, k, s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate, {}, 0);
    const std::string shader = shader_of(g.dx_gemm, "dx_gemm", t);
    return dx_gemm(shader.c_str(), s, dX, w, dY, scratch, T, n_out, n_in, j_start, j_end, accumulate);
  }
  const int64_t n_rows = j_end - j_start;
  const int64_t rows_per_chunk = dx_rows_per_chunk(n_rows, n_in, g.dx_cols);
  const int64_t n_chunks = (n_rows + rows_per_chunk - 1) / rows_per_chunk;
  const size_t need = q4t::vk::dx_scratch_bytes(T, n_rows, n_in, g.dx_cols);
  if (!scratch) throw ShapeError(std::string(k) + ": the one-token path needs a scratch buffer of " +
                                 std::to_string(need) + " bytes");
  check_min_size(k, "scratch", scratch->size(), need);
  struct { uint32_t n_in, j_start, j_end, rows_per_chunk; } split{uint32_t(n_in), uint32_t(j_start),
                                                                   uint32_t(j_end), uint32_t(rows_per_chunk)};
  std::vector<uint32_t> spec{g.dx_row_slots};
  if (g.dx_rows_in_flight) spec.push_back(g.dx_rows_in_flight);
  // The f16-decode twin where the device has f16 arithmetic and the rows suit it.
  const bool f16 = g.dx_split_f16 && f16_decode() && n_in % g.dx_split_f16_n_in == 0;
  const auto& p = pipeline(f16 ? std::string(g.dx_split_f16) : shader_of(g.dx_split, "dx_split", t), 3,
                           sizeof(split), spec);
  s.dispatch(p, {scratch, &w, &dY}, split, {ceil_div(n_in, g.dx_cols), uint32_t(n_chunks), 1});
  dx_reduce(s, dX, *scratch, n_in, n_chunks, accumulate);
}

void LinearKernels::dx_gemm(const char* shader, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                            const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start,
                            int64_t j_end, bool accumulate) {
  const GemmPush push{uint32_t(T), uint32_t(n_in), uint32_t(j_start), uint32_t(j_end), uint32_t(n_out), 0,
                      accumulate ? 1u : 0u};
  // Callers size the scratch with dx_scratch_bytes; without one, no split. Split products take 128-wide tiles.
  const auto split = dx_gemm_split(T, j_end - j_start, n_in);
  const bool sliced = split.first > 1 && scratch;
  const uint32_t tile = sliced ? (forced_gemm_tile_ ? forced_gemm_tile_ : kGemmTileLarge) : gemm_tile(T, n_in);
  const auto& p = pipeline(shader, 3, sizeof(push), {tile, tile});
  dispatch_gemm(shader, p, s, dX, dY, w, push, T, n_in, split, {ceil_div(n_in, tile), ceil_div(T, tile)}, scratch);
}

void LinearKernels::coop_dx(const FormatTraits& t, const char* k, Sequence& s, const Buffer& dX, const Buffer& w,
                            const Buffer& dY, const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in,
                            int64_t j_start, int64_t j_end, bool accumulate, std::array<const Buffer*, 2> lora,
                            int64_t r) {
  GemmPush push{uint32_t(T), uint32_t(n_in), uint32_t(j_start), uint32_t(j_end), uint32_t(n_out), 0,
                accumulate ? 1u : 0u};
  const int64_t n_rows = j_end - j_start;
  const size_t split_bytes = q4t::vk::dx_scratch_bytes(T, n_rows, n_in, t.gpu.dx_cols);
  const size_t need = dx_scratch_bytes(t.format, T, n_rows, n_in);
  const std::array<uint32_t, 2> groups{ceil_div(n_in, kCoopTileN), ceil_div(T, kCoopTileM)};
  if (need > split_bytes && scratch && scratch->size() >= need) {
    // dY split once into the scratch past the slices (the same buffer serves as the slices and as A).
    dx_coop_split(t, k, s, dX, w, dY, *scratch, T, n_in, n_out, j_start, j_start, j_end, accumulate, lora, r);
    return;
  }
  if (!lora[0]) lora = {&dY, &w};  // not read without an adapter
  dispatch_gemm(k, pipeline(t.gpu.coop_dx, 5, sizeof(GemmPush), {0, uint32_t(r)}), s, dX, dY, w, push, T, n_in,
                dx_gemm_split(T, n_rows, n_in), groups, scratch, lora);
}

bool LinearKernels::dx_lora(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                            const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, const Buffer& dh,
                            const Buffer& A, int64_t r) {
  const FormatTraits& t = format_traits(f);
  const std::string name = std::string(t.name) + "_dx (with the adapter's term)";
  const char* k = name.c_str();
  if (!t.gpu.coop_dx || !dev_.coop_matrix() || T < kCoopMinTokens || r < 1 || r > kCoopLoraMaxRank || mixed(T))
    return false;
  check_product(f, k, w, T, n_out, n_in, "dY", dY, n_out, "dX", dX, n_in);
  check_min_size(k, "dh", dh.size(), size_t(T * r) * 4);
  check_min_size(k, "A", A.size(), size_t(r * n_in) * 4);
  coop_dx(t, k, s, dX, w, dY, scratch, T, n_out, n_in, 0, n_out, true, {&dh, &A}, r);
  return true;
}

void LinearKernels::dx_reduce(Sequence& s, const Buffer& dX, const Buffer& scratch, int64_t n_in, int64_t n_chunks,
                              bool accumulate) {
  struct { uint32_t n, n_chunks, accumulate; } red{uint32_t(n_in), uint32_t(n_chunks), accumulate ? 1u : 0u};
  const auto& p = pipeline("q4_0_dx_reduce", 2, sizeof(red));
  s.dispatch(p, {&dX, &scratch}, red, groups_1d(ceil_div(n_in, 256)));
}

namespace {
// Split K when a product has fewer than kSplitBelowTiles output tiles of the small edge: into enough slices of
// at least kMinSliceK (a multiple of the tile's BK) to make about kSplitTargetGroups workgroups. Such products
// never take the large tiles (gemm_tile), so the split depends on the shape alone. LoRA's rank-r products are
// bound by their loads' latency, not by the partial sums (slices x M x r floats) (docs/kernels.md, "Tiled GEMMs").
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
