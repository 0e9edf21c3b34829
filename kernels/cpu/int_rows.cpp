// The choice between the integer loop sets of int_rows.h (int_rows_avx2.cpp, int_rows_avx512.cpp) and the
// one-token-at-a-time driver over them.
#include "kernels/cpu/int_rows.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/int_rows_x86.h"
#include "kernels/cpu/q4_0_rows.h"
#include "kernels/cpu/threads.h"
#include "kernels/formats.h"
#include "kernels/shapes.h"

namespace q4t::cpu::detail {

#if defined(__x86_64__) || defined(__i386__)
bool avx512_int_supported() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return ok;
}
#endif

// The Q4_0 kernel set in use picks the loops (so use_q4_0_kernels switches these too): the AVX-512 set where the CPU
// also has BW, VL and VNNI, else the AVX2 set; none with the portable set.
template <Format F>
const IntRowKernels* int_row_kernels() {
#if defined(__x86_64__) || defined(__i386__)
  switch (q4_0_kernels().isa) {
    case Isa::Avx512: return avx512_int_supported() ? avx512_int_rows<F>() : avx2_int_rows<F>();
    case Isa::Avx2: return avx2_int_rows<F>();
    case Isa::Portable: break;
  }
#endif
  return nullptr;
}

#define Q4T_INSTANTIATE(fmt) template const IntRowKernels* int_row_kernels<Format::fmt>();
Q4T_INT_FORMATS(Q4T_INSTANTIATE)
#undef Q4T_INSTANTIATE

// Each token's row of X rounded once (small next to a pass over W), then rows of W in chunks of at least 128 KiB
// per thread.
void int_gemm(const IntRowKernels& k, float* Y, const uint8_t* w, const float* X, int64_t T, int64_t n_out,
              int64_t n_in) {
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d;
  thread_local std::vector<int16_t> bsum;
  q.resize(size_t(n_in)), d.resize(size_t(n_in / k.block_elems)), bsum.resize(size_t(n_in / 16));
  const int64_t rb = n_in / k.block_elems * k.block_bytes;
  const int64_t grain = ceil_div(std::max<int64_t>(4, 128 * 1024 / rb), 4) * 4;
  for (int64_t t = 0; t < T; t++) {
    k.round(q.data(), d.data(), bsum.data(), X + t * n_in, n_in);
    const RoundedX x{q.data(), d.data(), bsum.data()};
    float* y = Y + t * n_out;
    parallel_for(n_out, grain, [&](int64_t r0, int64_t r1) { k.dot_rows(y + r0, w + r0 * rb, rb, x, r1 - r0, n_in); });
  }
}

}  // namespace q4t::cpu::detail
