// A small fixed thread pool for the CPU kernels. parallel_for splits [0, n) into contiguous chunks, one per
// worker, and returns when all are done; calls from inside a worker run inline (no nested parallelism).
#pragma once
#include <cstdint>
#include <functional>

namespace q4t::cpu {

// Number of worker threads used by the CPU kernels (default: hardware concurrency).
int num_threads();
// Changes the worker count; n <= 0 restores the default.
void set_num_threads(int n);
// Runs fn(begin, end) over disjoint chunks covering [0, n); chunks are multiples of `grain` except the last.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace q4t::cpu
