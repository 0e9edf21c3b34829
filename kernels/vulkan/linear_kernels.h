// Host side of the Vulkan linear kernels: checks shapes and buffer sizes, then records dispatches into a
// Sequence. Same contracts as kernels/cpu/linear.h. Pipelines are built on first use and kept. Frozen weights come
// in the device layout of their format (kernels/formats.h: GGML's bytes, or Q6_K's groups; to_device_layout
// converts), n_in a multiple of the format's gpu_n_in_multiple.
#pragma once
#include <cstdint>
#include <array>
#include <map>
#include <memory>
#include <string>

#include "kernels/formats.h"
#include "kernels/precision.h"
#include "kernels/vulkan/buffer.h"
#include "kernels/vulkan/pipeline.h"
#include "kernels/vulkan/sequence.h"

namespace q4t::vk {

// The tile edge (BM = BN of gemm_tiled.glsl) of a tiled GEMM with an M x N output: 128 for large products, 64
// for those that 128-wide tiles would leave most of a large GPU idle with.
uint32_t gemm_tile_for(int64_t M, int64_t N);

class LinearKernels {
 public:
  explicit LinearKernels(Device& dev);

  // Y[T, n_out] = X[T, n_in] · Wᵀ for W [n_out, n_in] in format f (kernels/formats.h: its row names the shaders).
  // T = 1 runs the format's GEMV. With a scratch of gemm_scratch_bytes(f, T, n_out, n_in) bytes (when that is not
  // 0): a product of too few output tiles to fill the GPU is split over K into slices summed in order by a second
  // pass; the GEMVs with an integer-dot twin run on 8-bit integer dot products where the device has them (the
  // scratch holds the activations as limbs; int_dot.glsl); and a format with a tensor-core GEMM takes X split once
  // per product (coop_split_rows.comp). Mixed products (mixed_for) need frozen_scratch_bytes.
  void gemm(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T, int64_t n_out,
            int64_t n_in, const Buffer* scratch = nullptr);
  size_t gemm_scratch_bytes(Format f, int64_t T, int64_t n_out, int64_t n_in) const;
  // dX[T, n_in] (+)= dY[T, n_out][:, j_start:j_end] · W[j_start:j_end, :]. The one-token path needs `scratch` of at
  // least dx_scratch_bytes(f, T, j_end - j_start, n_in) bytes (it may be null when that is 0); for T > 1 the same
  // size lets a small product with many rows split over them (without it, it runs unsplit), and a format with a
  // tensor-core dx take dY split once per product.
  void dx(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer* scratch, int64_t T,
          int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end, bool accumulate);
  size_t dx_scratch_bytes(Format f, int64_t T, int64_t n_rows, int64_t n_in) const;
  // Y[T, n_out] = X · Wᵀ + hs · Bᵀ (hs [T, r], B [n_out, r], f32): a LoRA adapter's term added by the format's
  // tensor-core GEMM after its main loop, in the same pass. Records nothing and returns false where that GEMM does
  // not serve the shape (no such GEMM for the format, no cooperative matrices, T below the fewest tokens that take
  // them, a mixed product) or r > 32; the caller then adds the term itself. The scratch as for gemm.
  bool gemm_lora(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T, int64_t n_out,
                 int64_t n_in, const Buffer* scratch, const Buffer& hs, const Buffer& B, int64_t r);
  // dX[T, n_in] += dY · W + dh · A (dh [T, r], A [r, n_in], f32) over all of W's rows: the adapter's term of the
  // gradient of an input that both the frozen product and the adapter read, added by the format's tensor-core dx
  // in the same pass. Declines like gemm_lora. The scratch as for dx.
  bool dx_lora(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer* scratch,
               int64_t T, int64_t n_out, int64_t n_in, const Buffer& dh, const Buffer& A, int64_t r);
  // Y[T, n] = X[T, n_in] · W[row0 : row0 + n, :]ᵀ for a window of the rows of W [n_rows, n_in] (a vocabulary tile of
  // the loss), on the format's tensor-core GEMM. Records nothing and returns false where it declines (as above).
  bool gemm_rows_coop(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                      int64_t n_rows, int64_t row0, int64_t n, int64_t n_in);
  // dX[T, n_in] += d[T, n] · W[row0 : row0 + n, :] for the same window (the loss's dx), with a scratch of
  // dx_scratch_bytes(f, T, n, n_in) bytes. Declines likewise.
  bool dx_rows_coop(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& d, const Buffer& scratch,
                    int64_t T, int64_t n_rows, int64_t row0, int64_t n, int64_t n_in);

  // f32 GEMMs, row-major: nt: C[M,N] (+)= alpha·A[M,K]·B[N,K]ᵀ; nn: alpha·A[M,K]·B[K,N]; tn: alpha·A[K,M]ᵀ·B[K,N].
  // With a scratch of gemm_split_scratch_bytes(M, N, K) bytes (when that is not 0), a product of few output
  // tiles and a long K (LoRA's rank-r sides) is split over K into slices summed in order by a second pass.
  void gemm_nt(Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B, int64_t M, int64_t N, int64_t K,
               bool accumulate, const Buffer* scratch = nullptr, float alpha = 1);
  void gemm_nn(Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B, int64_t M, int64_t N, int64_t K,
               bool accumulate, const Buffer* scratch = nullptr, float alpha = 1);
  void gemm_tn(Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B, int64_t M, int64_t N, int64_t K,
               bool accumulate, const Buffer* scratch = nullptr, float alpha = 1);
  static size_t gemm_split_scratch_bytes(int64_t M, int64_t N, int64_t K);

  // The products of a LoRA adapter of rank r <= kLoraMaxRank, in f32 (lora_*.comp): kernels bound by reading (and,
  // for the wide ones, writing) their large operand once, where the tiled GEMMs above would spend most of their
  // work on the rank's short side.
  //   lora_rows: C[M, r] (+)= alpha·X[M, K]·Bᵀ with B [r, K], or (b_kr) alpha·X·B with B [K, r]; X rows of ldx.
  //              Given a scratch of lora_rows_scratch_bytes (when not 0), K is split over workgroups.
  //   lora_cols: C (+)= alpha·Σ_t X[t, n]·H[t, j], C [N, r] or (out_rn) [r, N]; X rows of ldx. Given a scratch of
  //              lora_cols_scratch_bytes (when not 0), the tokens are split over workgroups and added in order.
  //   lora_wide: C[M, N] (+)= alpha·H[M, r]·Bᵀ with B [N, r], or (b_rn) alpha·H·B with B [r, N].
  static constexpr int64_t kLoraMaxRank = 64;
  void lora_rows(Sequence& s, const Buffer& C, const Buffer& X, const Buffer& B, int64_t M, int64_t K, int64_t ldx,
                 int64_t r, bool b_kr, bool accumulate, float alpha, const Buffer* scratch);
  static size_t lora_rows_scratch_bytes(int64_t M, int64_t K, int64_t r);
  void lora_cols(Sequence& s, const Buffer& C, const Buffer& X, const Buffer& H, int64_t T, int64_t N, int64_t ldx,
                 int64_t r, bool out_rn, bool accumulate, float alpha, const Buffer* scratch);
  static size_t lora_cols_scratch_bytes(int64_t T, int64_t N, int64_t r);
  void lora_wide(Sequence& s, const Buffer& C, const Buffer& H, const Buffer& B, int64_t M, int64_t N, int64_t r,
                 bool b_rn, bool accumulate, float alpha);

  // dst[0:bytes) = src[0:bytes), bytes a multiple of 16: the bandwidth roofline of the benchmarks.
  void copy(Sequence& s, const Buffer& dst, const Buffer& src, size_t bytes);

  Device& device() const { return dev_; }

  // --- Mixed precision -------------------------------------------------------------------------------------
  // F32: the products keep f32-level numerics. Mixed: every frozen product of kMixedMinTokens tokens or more takes
  // f16 inputs and accumulates in f32 (mixed_gemm.comp): the activations (or dY) as f16 rows each scaled by a power
  // of two (rows_to_f16.comp: no overflow, no flush to zero), the weights decoded to f16; on cooperative matrices
  // where the device has them, else on the same tiles in FP32 FMAs. Products of fewer tokens keep f32.
  void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }
  static constexpr int64_t kMixedMinTokens = 32;
  bool mixed(int64_t T) const { return precision_ == Precision::Mixed && T >= kMixedMinTokens; }
  // Whether a frozen product of T tokens with rows of n_in weights runs mixed (every format's entry point above
  // takes the mixed path then): mixed(T), and rows of whole 32-weight units.
  bool mixed_for(int64_t T, int64_t n_in) const { return mixed(T) && n_in % 32 == 0; }
  // The scratch one frozen product of format f needs at this precision: its forward and its dx over all n_out rows
  // (one scratch serves both). The entry points above take it (or the smaller sizes of their own functions when
  // the product does not run mixed).
  size_t frozen_scratch_bytes(Format f, int64_t T, int64_t n_out, int64_t n_in) const;

  // The f16 operand of a mixed product (to_f16): `rows` rows of K values in k-panels (panel q: columns 32q ..
  // 32q + 31 of every row, 4 uvec4s a row, zero past K) from uvec4 `base` of `buf`, and their factors (floats from
  // `s_base`; kNoScales: all 1).
  struct F16Rows {
    const Buffer* buf = nullptr;
    uint32_t base = 0, s_base = 0;
    int64_t rows = 0, K = 0;
  };
  static constexpr uint32_t kNoScales = 0xFFFFFFFFu;
  // Bytes of such rows and their factors.
  static size_t f16_rows_bytes(int64_t rows, int64_t K);
  // src's rows [rows, col0 : col0 + K) (rows of lda floats) into dst from byte `offset` (a multiple of 16).
  // `unroll` (the loads an invocation issues together; 0 the default) is for the bench.
  F16Rows to_f16(Sequence& s, const Buffer& dst, size_t offset, const Buffer& src, int64_t rows, int64_t K, int64_t lda,
                 int64_t col0, uint32_t unroll = 0);
  // The W operand of a mixed product: a frozen W [.., n_in] in `format` read from row `row0` on (Q6_K in the device
  // layout), or (`panels`) f16 k-panels as decode_f16 writes them, rows from 0, from uvec4 `base` of `buf`.
  struct MixedW {
    Format format = Format::F16;
    const Buffer* buf = nullptr;
    int64_t row0 = 0;
    bool panels = false;
    uint32_t base = 0;
  };
  // C[M, N] (+)= s_m · a · W[row0 + n, :]ᵀ (dx false: K = a.K = n_in; Y = X·Wᵀ) or s_m · a · W[row0 + k, :] (dx true:
  // K = a.K rows of W, N = n_in; dX = dY·W), M = a.rows (n_in a multiple of 32). With `split` (mixed_split_bytes of
  // the shape, when not 0) a product of few output tiles sums slices of K there, then adds them in order.
  // `variant` names another tile shape of the same kernel (bench: "_t128x64w4" ...; "" the default).
  void mixed_product(bool dx, Sequence& s, const Buffer& C, const F16Rows& a, const MixedW& w, int64_t N, int64_t n_in,
                     bool accumulate, const Buffer* split, const std::string& variant = "");
  size_t mixed_split_bytes(int64_t M, int64_t N, int64_t K, const std::string& variant = "") const;
  // The tile-shape suffixes of mixed_gemm.comp's variants (kernels/CMakeLists.txt), "" first (the default), and
  // whether the shader of one exists for a format and direction (the bench's other shapes exist for some only;
  // devices without cooperative matrices run every one as the portable twin).
  static const std::vector<std::string>& mixed_variants();
  bool has_mixed_variant(Format f, bool dx, const std::string& variant) const;
  // Rows w_row0 .. w_row0 + rows of W [.., n_in] in format f decoded to f16 k-panels in dst from byte `offset` (a
  // multiple of 16): the W operand (panels) of a product that decodes W once. For the bench, `tile_rows` (a power
  // of two up to 128; 0 the default) sets the rows of a workgroup's tile and `staged` whether the tile passes
  // through shared memory (decode_f16.comp).
  MixedW decode_f16(Format f, Sequence& s, const Buffer& dst, size_t offset, const Buffer& w, int64_t rows, int64_t n_in,
                    int64_t w_row0, uint32_t tile_rows = 0, bool staged = true);
  // Whether the mixed products of format f decode W to f16 once per product (then run the F16 GEMM) rather than tile
  // by tile in the GEMM's main loop: for every format but the 16-bit floats (F16, BF16: a part of a unit is 8 of their weights, read as they stand) (docs/mixed-precision.md has the measurements).
  static bool decodes_once(Format f) { return f != Format::F16 && f != Format::BF16; }
  // The scratch of a whole mixed frozen product of T tokens (the split slices, the f16 rows, and W decoded where
  // decodes_once) in either direction: forward K = n_in, N = n_out; dx K = n_rows, N = n_in.
  size_t mixed_scratch_bytes(Format f, int64_t T, int64_t N, int64_t K) const;
  // Y[T, n_out] = X·W[row0 : row0 + n_out]ᵀ, and dX[T, n_in] (+)= dY[:, dy_col0 : dy_col0 + n_rows]·W[w_row0 :
  // w_row0 + n_rows] (dY rows of dy_cols floats), as mixed products through `scratch` (mixed_scratch_bytes with
  // K = n_in, N = n_out, or N = n_in, K = n_rows). The windows serve the vocabulary tiles of the loss.
  void mixed_gemm(Format f, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, const Buffer& scratch,
                  int64_t T, int64_t n_out, int64_t n_in, int64_t row0 = 0);
  void mixed_dx(Format f, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY, const Buffer& scratch,
                int64_t T, int64_t dy_cols, int64_t dy_col0, int64_t n_in, int64_t w_row0, int64_t n_rows,
                bool accumulate);

  // The tiled GEMMs (T > 1 without tensor cores, the dx for T > 1, the f32 GEMMs) pick a 64- or 128-wide tile
  // from the product's shape; tests force one (0: pick) to check both on shapes of any size.
  void force_gemm_tile(uint32_t tile);
  // When the Q4_0, Q4_K and Q6_K GEMVs take the integer-dot path (given a scratch and a device with it): Auto for
  // matrices of at least kGemvDotMinWeights weights, where it is faster; tests force either path to check both
  // on one device.
  enum class IntegerDot { Auto, Always, Never };
  void set_integer_dot(IntegerDot mode) { integer_dot_ = mode; }
  bool integer_dot_gemv(int64_t n_out, int64_t n_in) const;
  // The one-token dx split passes of Q4_0 and Q4_K decode their codes through f16 pairs where the device has
  // f16 arithmetic (Device::float16); tests switch that off to check the f32-decode shaders on one device.
  void set_f16_decode(bool on) { f16_decode_ = on; }
  bool f16_decode() const { return f16_decode_ && dev_.float16(); }

 private:
  struct GemmPush;  // the push constants of the tiled and tensor-core GEMMs (gemm_push.glsl)
  const Pipeline& pipeline(const std::string& shader, uint32_t n_buffers, uint32_t push_bytes,
                           const std::vector<uint32_t>& spec = {});
  // The tensor-core dx with dY split once into `scratch`: dY's columns dy_col0 .. (rows of dy_stride floats) meet
  // W's rows j_start .. j_end; with lora = {dh, A}, the adapter's dh·A (rank r) is added too.
  void dx_coop_split(const FormatTraits& t, const char* k, Sequence& s, const Buffer& dX, const Buffer& w,
                     const Buffer& dY, const Buffer& scratch, int64_t T, int64_t n_in, int64_t dy_stride,
                     int64_t dy_col0, int64_t j_start, int64_t j_end, bool accumulate,
                     std::array<const Buffer*, 2> lora = {}, int64_t r = 0);
  // The tensor-core dx (T >= the fewest tokens that take it), with the adapter's dh and A where lora holds them.
  void coop_dx(const FormatTraits& t, const char* k, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
               const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
               bool accumulate, std::array<const Buffer*, 2> lora, int64_t r);
  void f32_gemm(const char* shader, Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B, int64_t M,
                int64_t N, int64_t K, uint32_t lda, uint32_t ldb, bool accumulate, const Buffer* scratch, float alpha);
  // The integer-dot GEMV `shader` if integer_dot_gemv(n_out, n_in) and the scratch holds the limbs: x_limbs.comp
  // (with `layout`) into the scratch, then the GEMV over `rows` rows per workgroup. False (nothing recorded)
  // otherwise.
  bool gemv_dot(const char* shader, uint32_t layout, uint32_t rows, Sequence& s, const Buffer& y, const Buffer& w,
                const Buffer& x, int64_t n_out, int64_t n_in, const Buffer* scratch);
  // Y = X · Wᵀ for T > 1 with the format's tiled (FP32) shader.
  void tiled_gemm(const char* shader, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X, int64_t T,
                  int64_t n_out, int64_t n_in, const Buffer* scratch);
  // Forward GEMM pipeline p over groups_n x groups_m output tiles, split over K as forward_split says.
  void dispatch_forward(const char* k, const Pipeline& p, Sequence& s, const Buffer& Y, const Buffer& w,
                        const Buffer& X, int64_t T, int64_t n_out, int64_t n_in, uint32_t groups_n, uint32_t groups_m,
                        const Buffer* scratch, int64_t row0 = 0, std::array<const Buffer*, 2> lora = {});
  // The tensor-core GEMM (T >= the fewest tokens that take it), with the adapter's hs and B where lora holds them.
  void coop_gemm(const FormatTraits& t, const char* k, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X,
                 int64_t T, int64_t n_out, int64_t n_in, const Buffer* scratch, std::array<const Buffer*, 2> lora,
                 int64_t r);
  // Any GEMM pipeline p over `groups` (x: N tiles, y: M tiles) of C [M, N]: straight into C; or, given a scratch
  // and split = {slices > 1, k_slice}, as slices of K into the scratch, which dx_reduce then adds into C in order
  // (accumulating when push.accumulate says so).
  // Pipelines of five bindings (the tensor-core GEMMs) take `extra` as bindings 3 and 4.
  void dispatch_gemm(const char* k, const Pipeline& p, Sequence& s, const Buffer& C, const Buffer& A, const Buffer& B,
                     const GemmPush& push, int64_t M, int64_t N, std::pair<int64_t, int64_t> split,
                     std::array<uint32_t, 2> groups, const Buffer* scratch, std::array<const Buffer*, 2> extra = {});
  // dX (+)= dY[:, j_start:j_end] · W[j_start:j_end, :] for T > 1 with the format's tiled dx shader, split over
  // the rows into slices summed by dx_reduce when the product is small and the rows many (dx_gemm_split).
  void dx_gemm(const char* shader, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
               const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
               bool accumulate);
  // The one-token dx's second pass: dX (+)= Σ_c scratch[c, :], chunks in order.
  void dx_reduce(Sequence& s, const Buffer& dX, const Buffer& scratch, int64_t n_in, int64_t n_chunks,
                 bool accumulate);

  uint32_t gemm_tile(int64_t M, int64_t N) const;

  // The mixed paths of the per-format entry points (mixed_for), checking their scratch.
  void routed_mixed_gemm(Format f, const char* k, Sequence& s, const Buffer& Y, const Buffer& w, const Buffer& X,
                         int64_t T, int64_t n_out, int64_t n_in, const Buffer* scratch);
  void routed_mixed_dx(Format f, const char* k, Sequence& s, const Buffer& dX, const Buffer& w, const Buffer& dY,
                       const Buffer* scratch, int64_t T, int64_t n_out, int64_t n_in, int64_t j_start, int64_t j_end,
                       bool accumulate);
  // The workgroup tile (BM, BN) of a mixed_gemm.comp variant, and its pipeline.
  struct MixedTile {
    uint32_t bm, bn;
  };
  MixedTile mixed_tile(const std::string& variant) const;

  Device& dev_;
  Precision precision_ = Precision::F32;
  IntegerDot integer_dot_ = IntegerDot::Auto;
  bool f16_decode_ = true;
  uint32_t forced_gemm_tile_ = 0;
  std::map<std::string, std::unique_ptr<Pipeline>> pipelines_;
};

}  // namespace q4t::vk
