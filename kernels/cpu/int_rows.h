// The CPU's mixed precision products (--precision mixed with --device cpu): a token's activation is rounded to
// 8-bit blocks exactly as llama.cpp's CPU matmuls round it (kernels/quant/act_round.h: Q8_0 blocks of 32 before
// the formats of 32-weight blocks, Q8_K blocks of 256 before the 256-weight ones), then each weight row's integer
// levels are multiplied with those bytes in 16- and 32-bit integer sums and every block's scales are applied once
// (float sums across blocks). Two x86 builds of one skeleton (int_rows_skeleton.h): AVX2, and AVX-512 where the CPU
// has BW, VL and VNNI; none where the Q4_0 kernel set in use is the portable one. F16 and BF16 have none.
#pragma once
#include <cstdint>

namespace q4t {
enum class Format : uint32_t;
}

namespace q4t::cpu::detail {

// An activation of n values rounded into blocks of `block`: value i is d[i / block]·q[i]; bsum[g] = Σ q over
// values 16g .. 16g + 15.
struct RoundedX {
  const int8_t* q;
  const float* d;
  const int16_t* bsum;
};

struct IntRowKernels {
  const char* name;
  int64_t block_elems, block_bytes;  // the format's block, also the activation's rounding block (32 or 256)
  // q[n], d[n / block_elems], bsum[n / 16] = x[0:n) rounded (n whole blocks).
  void (*round)(int8_t* q, float* d, int16_t* bsum, const float* x, int64_t n);
  // y[r] = W[r, 0:n) · x for r in [0, n_rows): w points at row 0, rows row_bytes apart, x rounded by round().
  void (*dot_rows)(float* y, const uint8_t* w, int64_t row_bytes, const RoundedX& x, int64_t n_rows, int64_t n);
};

// The integer loops of format F, or null where this CPU's kernel set has none (see above).
template <Format F>
const IntRowKernels* int_row_kernels();

// Y[T, n_out] = X[T, n_in] · Wᵀ one token at a time through k: each row of X rounded once, rows of W threaded.
void int_gemm(const IntRowKernels& k, float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
              int64_t n_in);

}  // namespace q4t::cpu::detail
