// The mixed-precision products of LinearKernels (linear_kernels.h: "Mixed precision"): the f16 rows pass
// (rows_to_f16.comp), the shared GEMM of every format (mixed_gemm.comp, variants mixed_gemm_<format> and
// mixed_dx_<format>, their portable twins *_fma) and the decode of a weight to f16 rows (decode_f16_<format>).
#include <algorithm>
#include <bit>
#include <stdexcept>

#include "kernels/shapes.h"
#include "kernels/vulkan/dispatch_util.h"
#include "kernels/vulkan/linear_kernels.h"
#include "kernels/vulkan/shaders.h"

namespace q4t::vk {

namespace {

constexpr int64_t kBK = 32;  // mixed_gemm.comp's K step: A's rows are padded to a multiple of it

struct MixedPush {  // mixed_gemm.comp
  uint32_t M, N, K, a_rows, a_base, s_base, ldc, accumulate, k_slice, w_row0, w_cols, w_base;
};
struct ToF16Push {  // rows_to_f16.comp
  uint32_t M, K, lda, col0, out_base, panels, s_base;
};
struct DecodePush {  // decode_f16.comp
  uint32_t rows, n_in, w_row0, out_base;
};
// decode_f16.comp's tile: rows by 128 / kDecodeTileRows units per workgroup (docs/mixed-precision.md).
constexpr uint32_t kDecodeTileRows = 8;
// rows_to_f16.comp's loads in flight per invocation: about one per 1024 values of a row, a power of two up to 8
// (docs/mixed-precision.md, "The f16 rows").
uint32_t to_f16_unroll(int64_t K) { return std::bit_floor(uint32_t(std::clamp<int64_t>(K / 1024, 1, 8))); }

// The workgroup tiles of the mixed_gemm.comp variants (kernels/CMakeLists.txt): the tensor-core default (""), the
// bench's other shapes, and the portable twins.
struct TileRow {
  const char* suffix;
  uint32_t bm, bn;
};
constexpr TileRow kCoopTiles[] = {{"", 128, 128},          {"_t128x128w4", 128, 128}, {"_t128x128w8n", 128, 128},
                                  {"_t64x128w4", 64, 128}, {"_t128x64w4", 128, 64},   {"_t64x64w4", 64, 64},
                                  {"_t128x256k16", 128, 256}, {"_t256x128k16", 256, 128}};
constexpr uint32_t kFmaTile = 64;

// A product of fewer output tiles than kSplitBelowTiles (a wave of the default tiles on a 132-SM H100: one per
// SM) sums slices of K of at least kMinSliceK in about kSplitTarget workgroups, then adds them in order.
constexpr int64_t kSplitBelowTiles = 132;
constexpr int64_t kSplitTarget = 264;
constexpr int64_t kMinSliceK = 256;

int64_t padded_k(int64_t K) { return (K + kBK - 1) / kBK * kBK; }
size_t align16(size_t b) { return (b + 15) / 16 * 16; }

}  // namespace

LinearKernels::MixedTile LinearKernels::mixed_tile(const std::string& variant) const {
  if (!dev_.coop_matrix()) return {kFmaTile, kFmaTile};
  for (const TileRow& t : kCoopTiles)
    if (variant == t.suffix) return {t.bm, t.bn};
  throw std::invalid_argument("mixed_product: no tile variant '" + variant + "'");
}

const std::vector<std::string>& LinearKernels::mixed_variants() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const TileRow& t : kCoopTiles) v.push_back(t.suffix);
    return v;
  }();
  return names;
}

bool LinearKernels::has_mixed_variant(Format f, bool dx, const std::string& variant) const {
  if (!dev_.coop_matrix()) return variant.empty();  // the portable twin has the one shape
  const std::string name = std::string(dx ? "mixed_dx_" : "mixed_gemm_") + format_name(f) + variant;
  return shader_table().count(name) > 0;
}

size_t LinearKernels::f16_rows_bytes(int64_t rows, int64_t K) {
  return size_t(rows * padded_k(K)) * 2 + size_t(rows) * 4;
}

LinearKernels::F16Rows LinearKernels::to_f16(Sequence& s, const Buffer& dst, size_t offset, const Buffer& src,
                                             int64_t rows, int64_t K, int64_t lda, int64_t col0, uint32_t unroll) {
  const char* k = "rows_to_f16";
  if (offset % 16 != 0) throw std::invalid_argument("rows_to_f16: the offset must be a multiple of 16 bytes");
  check_gemm(k, rows, K, 1);
  check_fits_u32(k, "the rows", rows * lda);
  check_min_size(k, "the input", src.size(), size_t((rows - 1) * lda + col0 + K) * 4);
  check_min_size(k, "the output", dst.size(), offset + f16_rows_bytes(rows, K));
  check_fits_u32(k, "the output", int64_t((offset + f16_rows_bytes(rows, K)) / 4));
  F16Rows a;
  a.buf = &dst;
  a.base = uint32_t(offset / 16);
  a.s_base = uint32_t((offset + size_t(rows * padded_k(K)) * 2) / 4);
  a.rows = rows;
  a.K = K;
  const ToF16Push push{uint32_t(rows), uint32_t(K), uint32_t(lda), uint32_t(col0), a.base,
                       uint32_t(padded_k(K) / kBK), a.s_base};
  if (unroll == 0) unroll = to_f16_unroll(K);
  if (unroll > 16) throw std::invalid_argument("rows_to_f16: unroll " + std::to_string(unroll) + " is over 16");
  s.dispatch(pipeline("rows_to_f16", 2, sizeof(push), {unroll}), {&dst, &src}, push, groups_1d(rows));
  return a;
}

size_t LinearKernels::mixed_split_bytes(int64_t M, int64_t N, int64_t K, const std::string& variant) const {
  const MixedTile t = mixed_tile(variant);
  const int64_t tiles = int64_t(ceil_div(M, t.bm)) * ceil_div(N, t.bn);
  if (tiles >= kSplitBelowTiles) return 0;
  const auto [slices, k_slice] = split_k(tiles, kSplitTarget, padded_k(K), kMinSliceK, kBK);
  return slices > 1 ? size_t(slices * M * N) * 4 : 0;
}

void LinearKernels::mixed_product(bool dx, Sequence& s, const Buffer& C, const F16Rows& a, const MixedW& w, int64_t N,
                                  int64_t n_in, bool accumulate, const Buffer* split, const std::string& variant) {
  const std::string name = std::string(dx ? "mixed_dx_" : "mixed_gemm_") + format_name(w.format) + (w.panels ? "p" : "");
  const char* k = name.c_str();
  const int64_t M = a.rows, K = a.K;
  check_gemm(k, M, N, K);
  if (n_in % kBK != 0)
    throw ShapeError(name + ": n_in = " + std::to_string(n_in) + " is not a multiple of 32 (the mixed kernels read "
                     "weights 32 at a time)");
  if (w.panels && w.format != Format::F16) throw std::invalid_argument(name + ": only F16 weights come in k-panels");
  const int64_t w_rows = dx ? K : N;
  if (!dx && K != n_in) throw ShapeError(name + ": K = " + std::to_string(K) + " differs from n_in = " +
                                         std::to_string(n_in));
  if (dx && N != n_in) throw ShapeError(name + ": N = " + std::to_string(N) + " differs from n_in = " +
                                        std::to_string(n_in));
  if (w.panels)
    check_min_size(k, "W", w.buf->size(), size_t(w.base) * 16 + size_t(w_rows * n_in) * 2);
  else
    check_min_size(k, "W", w.buf->size(), size_t(device_weight_bytes(w.format, w.row0 + w_rows, n_in)));
  check_min_size(k, "C", C.size(), size_t(M * N) * 4);
  check_fits_u32(k, "C", M * N);
  const MixedTile t = mixed_tile(variant);
  std::string shader = name + (dev_.coop_matrix() ? variant : "_fma");
  if (dev_.coop_matrix_khr() && shader_table().count(shader + "_khr")) shader += "_khr";
  const auto& p = pipeline(shader, 3, sizeof(MixedPush));
  MixedPush push{uint32_t(M), uint32_t(N), uint32_t(K), uint32_t(a.rows), a.base, a.s_base, uint32_t(N),
                 accumulate ? 1u : 0u, 0, uint32_t(w.row0), uint32_t(n_in), w.base};
  const std::array<uint32_t, 3> groups{ceil_div(M, t.bm), ceil_div(N, t.bn), 1};
  const size_t split_bytes = mixed_split_bytes(M, N, K, variant);
  if (split_bytes == 0 || !split) {
    s.dispatch(p, {&C, a.buf, w.buf}, push, groups);
    return;
  }
  check_min_size(k, "the split scratch", split->size(), split_bytes);
  const int64_t tiles = int64_t(groups[0]) * groups[1];
  const auto [slices, k_slice] = split_k(tiles, kSplitTarget, padded_k(K), kMinSliceK, kBK);
  push.accumulate = 0;
  push.k_slice = uint32_t(k_slice);
  s.dispatch(p, {split, a.buf, w.buf}, push, {groups[0], groups[1], uint32_t(slices)});
  dx_reduce(s, C, *split, M * N, slices, accumulate);
}

LinearKernels::MixedW LinearKernels::decode_f16(Format f, Sequence& s, const Buffer& dst, size_t offset, const Buffer& w,
                                                int64_t rows, int64_t n_in, int64_t w_row0, uint32_t tile_rows,
                                                bool staged) {
  const std::string name = std::string("decode_f16_") + format_name(f);
  const char* k = name.c_str();
  if (offset % 16 != 0 || n_in % kBK != 0)
    throw std::invalid_argument(name + ": needs an offset on 16 bytes and n_in a multiple of 32");
  check_min_size(k, "W", w.size(), size_t(device_weight_bytes(f, w_row0 + rows, n_in)));
  check_min_size(k, "the output", dst.size(), offset + size_t(rows * n_in) * 2);
  check_fits_u32(k, "the output", int64_t(offset / 4) + rows * n_in / 2);
  if (tile_rows == 0) tile_rows = kDecodeTileRows;
  if (tile_rows > 128 || (tile_rows & (tile_rows - 1)) != 0)
    throw std::invalid_argument(name + ": the tile's rows must be a power of two up to 128");
  const DecodePush push{uint32_t(rows), uint32_t(n_in), uint32_t(w_row0), uint32_t(offset / 16)};
  const int64_t groups = int64_t(ceil_div(rows, tile_rows)) * ceil_div(n_in / kBK, 128 / tile_rows);
  s.dispatch(pipeline(name, 2, sizeof(push), {tile_rows, staged ? 1u : 0u}), {&dst, &w}, push, groups_1d(groups));
  return {Format::F16, &dst, 0, true, uint32_t(offset / 16)};
}

size_t LinearKernels::mixed_scratch_bytes(Format f, int64_t T, int64_t N, int64_t K) const {
  const size_t decoded = decodes_once(f) ? size_t(N * K) * 2 : 0;
  return align16(mixed_split_bytes(T, N, K)) + align16(f16_rows_bytes(T, K)) + decoded;
}

void LinearKernels::mixed_gemm(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X,
                               const Buffer& scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t row0) {
  const size_t split = align16(mixed_split_bytes(T, n_out, n_in));
  check_min_size("mixed_gemm", "scratch", scratch.size(), mixed_scratch_bytes(f, T, n_out, n_in));
  MixedW wv{f, &w, row0};
  if (decodes_once(f)) wv = decode_f16(f, s, scratch, split + align16(f16_rows_bytes(T, n_in)), w, n_out, n_in, row0);
  const F16Rows a = to_f16(s, scratch, split, X, T, n_in, n_in, 0);
  mixed_product(false, s, Y, a, wv, n_out, n_in, false, split > 0 ? &scratch : nullptr);
}

void LinearKernels::mixed_dx(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                             const Buffer& scratch, int64_t T, int64_t dy_cols, int64_t dy_col0, int64_t n_in,
                             int64_t w_row0, int64_t n_rows, bool accumulate) {
  const size_t split = align16(mixed_split_bytes(T, n_in, n_rows));
  check_min_size("mixed_dx", "scratch", scratch.size(), mixed_scratch_bytes(f, T, n_in, n_rows));
  MixedW wv{f, &w, w_row0};
  if (decodes_once(f))
    wv = decode_f16(f, s, scratch, split + align16(f16_rows_bytes(T, n_rows)), w, n_rows, n_in, w_row0);
  const F16Rows a = to_f16(s, scratch, split, dY, T, n_rows, dy_cols, dy_col0);
  mixed_product(true, s, dX, a, wv, n_in, n_in, accumulate, split > 0 ? &scratch : nullptr);
}

namespace {
void check_scratch(const char* k, const Buffer* scratch, size_t need) {
  if (!scratch)
    throw ShapeError(std::string(k) + ": the mixed-precision path needs a scratch buffer of " + std::to_string(need) +
                     " bytes");
  check_min_size(k, "scratch", scratch->size(), need);
}
}  // namespace

void LinearKernels::routed_mixed_gemm(Format f, const char* k, Sequence& s, const Buffer& Y, const Buffer& w,
                                      const Buffer& X, int64_t T, int64_t n_out, int64_t n_in, const Buffer* scratch) {
  check_scratch(k, scratch, mixed_scratch_bytes(f, T, n_out, n_in));
  mixed_gemm(f, s, Y, w, X, *scratch, T, n_out, n_in);
}

void LinearKernels::routed_mixed_dx(Format f, const char* k, Sequence& s, const Buffer& dX, const Buffer& w,
                                    const Buffer& dY, const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in,
                                    int64_t j_start, int64_t j_end, bool accumulate) {
  check_scratch(k, scratch, mixed_scratch_bytes(f, T, n_in, j_end - j_start));
  mixed_dx(f, s, dX, w, dY, *scratch, T, n_out, j_start, n_in, j_start, j_end - j_start, accumulate);
}

size_t LinearKernels::frozen_scratch_bytes(Format f, int64_t T, int64_t n_out, int64_t n_in) const {
  if (mixed_for(T, n_in))
    return std::max(mixed_scratch_bytes(f, T, n_out, n_in), mixed_scratch_bytes(f, T, n_in, n_out));
  return std::max(gemm_scratch_bytes(f, T, n_out, n_in), dx_scratch_bytes(f, T, n_out, n_in));
}

}  // namespace q4t::vk
