// The CPU one-token product (GEMV) of every format against ggml's CPU mat-vec, measured in the same process on the
// same weights: q4tune's cpu::frozen_gemm at T = 1, and ggml's mul_mat of the npm prebuilt's libggml (the CPU
// variant its own loader would pick: the highest ggml_backend_score), both on the same number of threads.
//   bench_ggml_cpu [--avx2] [--reps N] [--formats a,b,...] [N_OUTxN_IN ...]     default 15 runs, every format,
//   4096x14336
// --avx2: what an AVX2-only CPU runs, on this one: q4tune's AVX2 kernels against ggml's haswell variant (AVX2,
// FMA, F16C; the one its loader picks on such a CPU).
// Prints per format the median of the runs (interleaved) of ggml, q4tune in f32 and q4tune in mixed precision
// (the activation rounded to 8-bit blocks as ggml rounds it, integer dot products; formats that have it), each
// q4tune time as a speed ratio ggml / q4tune (> 1: q4tune faster; in brackets the same ratio of the fastest runs),
// and the largest difference from ggml's result.
// A benchmark, not a test: ctest does not run it.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "interop_util.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/q4_0_rows.h"
#include "kernels/cpu/threads.h"
#include "kernels/formats.h"

namespace fs = std::filesystem;
using namespace q4t;

namespace {

struct GgmlInitParams {
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
struct Ggml {
  void* (*init)(GgmlInitParams);
  void (*free_ctx)(void*);
  void* (*new_tensor_2d)(void*, int, int64_t, int64_t);
  void* (*mul_mat)(void*, void*, void*);
  void* (*new_graph)(void*);
  void (*build_forward_expand)(void*, void*);
  void* (*get_data)(void*);
  int (*compute)(void*, void*, int);  // ggml_graph_compute_with_ctx
  std::string variant;
};

template <class F>
void sym(void* h, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(h, name));
  if (!f) throw std::runtime_error(std::string("missing ") + name);
}

Ggml load_ggml(bool avx2) {
  const auto inst = interop::run(interop::quoted(fs::path(Q4T_INTEROP_DIR) / "install_node_llama.sh"));
  std::string dir = inst.out.substr(0, inst.out.find_last_not_of('\n') + 1);
  dir = dir.substr(dir.find_last_of('\n') + 1);
  const fs::path bins = fs::path(dir) / "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64";
  void* base = dlopen((bins / "libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!base) throw std::runtime_error(std::string("dlopen libggml-base: ") + dlerror());
  Ggml g;
  int best = 0;
  void* cpu = nullptr;
  for (const auto& e : fs::directory_iterator(bins)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("libggml-cpu-", 0) != 0 || (avx2 && n != "libggml-cpu-haswell.so")) continue;
    void* h = dlopen(e.path().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    const auto score = reinterpret_cast<int (*)()>(dlsym(h, "ggml_backend_score"));
    const int s = score ? score() : 0;
    if (s > best) best = s, cpu = h, g.variant = n;
  }
  if (!cpu) throw std::runtime_error("no libggml-cpu variant runs on this CPU");
  sym(base, "ggml_init", g.init);
  sym(base, "ggml_free", g.free_ctx);
  sym(base, "ggml_new_tensor_2d", g.new_tensor_2d);
  sym(base, "ggml_mul_mat", g.mul_mat);
  sym(base, "ggml_new_graph", g.new_graph);
  sym(base, "ggml_build_forward_expand", g.build_forward_expand);
  sym(base, "ggml_get_data", g.get_data);
  sym(cpu, "ggml_graph_compute_with_ctx", g.compute);
  void (*cpu_init)() = nullptr;
  sym(cpu, "ggml_cpu_init", cpu_init);
  cpu_init();
  return g;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  bool avx2 = false;
  int reps = 15;
  std::string formats;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--avx2") == 0) {
      avx2 = true;
      continue;
    }
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      reps = std::atoi(argv[++i]);
      continue;
    }
    if (std::strcmp(argv[i], "--formats") == 0 && i + 1 < argc) {
      formats = "," + std::string(argv[++i]) + ",";
      continue;
    }
    long long a = 0, b = 0;
    if (std::sscanf(argv[i], "%lldx%lld", &a, &b) != 2 || a <= 0 || b <= 0) {
      std::fprintf(stderr, "usage: bench_ggml_cpu [--avx2] [--reps N] [--formats a,b,...] [N_OUTxN_IN ...]\n");
      return 2;
    }
    shapes.emplace_back(a, b);
  }
  if (shapes.empty()) shapes.emplace_back(4096, 14336);
  const Ggml g = load_ggml(avx2);
  if (avx2) cpu::detail::use_q4_0_kernels(cpu::detail::Isa::Avx2);  // every format's row kernels follow it
  const int threads = cpu::num_threads();
  std::printf("ggml %s, q4tune %s kernels, %d threads\n", g.variant.c_str(), cpu::detail::q4_0_kernels().name,
              threads);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [n_out, n_in] : shapes)
    for (const FormatTraits& f : format_table()) {
      if (n_in % f.block_elems || (!formats.empty() && formats.find("," + std::string(f.name) + ",") == std::string::npos))
        continue;
      std::vector<float> wf(static_cast<size_t>(n_out * n_in)), x(static_cast<size_t>(n_in)), y(static_cast<size_t>(n_out));
      for (float& v : wf) v = nd(rng) * 0.02f;
      for (float& v : x) v = nd(rng);
      const std::vector<uint8_t> w = quantize_matrix(f.format, wf, n_out, n_in);
      void* ctx = g.init({w.size() + x.size() * 4 + y.size() * 4 + (size_t(64) << 20), nullptr, false});
      void* tw = g.new_tensor_2d(ctx, int(f.format), n_in, n_out);
      void* tx = g.new_tensor_2d(ctx, 0, n_in, 1);
      void* ty = g.mul_mat(ctx, tw, tx);
      void* gf = g.new_graph(ctx);
      g.build_forward_expand(gf, ty);
      std::memcpy(g.get_data(tw), w.data(), w.size());
      std::memcpy(g.get_data(tx), x.data(), x.size() * 4);
      std::vector<double> ours, mixed, theirs;
      std::vector<float> ym(y.size());
      const bool has_mixed = cpu::has_mixed(f.format);
      for (int rep = 0; rep <= reps; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        cpu::frozen_gemm(f.format, y, w, x, 1, n_out, n_in);
        auto t1 = std::chrono::steady_clock::now();
        if (has_mixed) cpu::frozen_gemm(f.format, ym, w, x, 1, n_out, n_in, Precision::Mixed);
        auto t2 = std::chrono::steady_clock::now();
        g.compute(ctx, gf, threads);
        auto t3 = std::chrono::steady_clock::now();
        if (rep == 0) continue;  // warm-up
        ours.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        mixed.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
        theirs.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
      }
      // The results agree up to ggml's activation rounding (a misread layout would not); mixed rounds the
      // activation as ggml does, so only the order of the sums differs.
      const float* gy = static_cast<const float*>(g.get_data(ty));
      double diff = 0, diff_m = 0, scale = 0;
      for (int64_t i = 0; i < n_out; ++i) {
        diff = std::max(diff, double(std::abs(gy[i] - y[size_t(i)])));
        diff_m = std::max(diff_m, double(std::abs(gy[i] - ym[size_t(i)])));
        scale = std::max(scale, double(std::abs(gy[i])));
      }
      // Medians, and in brackets the ratio of the fastest runs (what neighbours on a shared machine cannot slow).
      const double a = median(ours), b = median(theirs), b0 = least(theirs);
      std::printf("%-7s %6lldx%-6lld  ggml %7.3f ms  f32 %7.3f ms %5.2fx [%4.2fx] (diff %.1e)", f.name,
                  (long long)n_out, (long long)n_in, b, a, b / a, b0 / least(ours), diff);
      if (has_mixed)
        std::printf("  mixed %7.3f ms %5.2fx [%4.2fx] (diff %.1e)", median(mixed), b / median(mixed), b0 / least(mixed),
                    diff_m);
      std::printf("  of %.2f\n", scale);
      g.free_ctx(ctx);
    }
  return 0;
}
