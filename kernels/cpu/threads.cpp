#include "kernels/cpu/threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace q4t::cpu {

namespace {

using ChunkFn = std::function<void(int64_t, int64_t)>;

// True on pool workers and on a caller while it runs its own chunk: parallel_for from there runs inline.
thread_local bool t_in_parallel = false;

struct InlineScope {
  InlineScope() { t_in_parallel = true; }
  ~InlineScope() { t_in_parallel = false; }
};

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Waiting threads spin this long before sleeping on a condition variable: the kernels are called back to
// back, and a futex wake-up costs about as much as a small GEMV.
constexpr auto kSpinTime = std::chrono::microseconds(50);

// Spins until done() holds (true) or kSpinTime passes (false).
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
  }
}

// n_threads - 1 persistent workers; for a job of k chunks, worker i runs chunk i + 1 (if i + 1 < k) and the
// caller runs chunk 0. Every worker acknowledges every job, so job fields are never rewritten while a late
// worker may still read them. One job at a time (parallel_for serialises callers).
class Pool {
 public:
  explicit Pool(int n_threads) : n_workers_(n_threads - 1) {
    for (int i = 0; i < n_workers_; i++) workers_.emplace_back([this, i] { worker_loop(i + 1); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void run(int64_t n_chunks, int64_t chunk, int64_t n, const ChunkFn& fn) {
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    n_chunks_ = n_chunks;
    error_ = nullptr;
    pending_.store(n_workers_, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(mu_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    {
      InlineScope scope;
      run_chunk(0);
    }
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lk(mu_);
      done_.wait(lk, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void worker_loop(int64_t chunk_index) {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      seen = wait_for_job(seen);
      if (stop_) return;
      if (chunk_index < n_chunks_) run_chunk(chunk_index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);
        done_.notify_one();
      }
    }
  }

  // Returns the generation of the next job (or of the stop request).
  uint64_t wait_for_job(uint64_t seen) {
    if (spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; }))
      return generation_.load(std::memory_order_acquire);
    std::unique_lock<std::mutex> lk(mu_);
    wake_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    return generation_.load(std::memory_order_acquire);
  }

  // An exception in any chunk is kept (the first one) and rethrown to the caller once all chunks end.
  void run_chunk(int64_t c) {
    const int64_t begin = c * chunk_;
    try {
      (*fn_)(begin, std::min(n_, begin + chunk_));
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
  }

  const int n_workers_;
  std::vector<std::thread> workers_;
  std::mutex mu_, error_mu_;
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> pending_{0};
  bool stop_ = false;  // written under mu_ before the last generation bump
  // The current job; written only while no worker is between picking it up and acknowledging it.
  const ChunkFn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, n_chunks_ = 0;
  std::exception_ptr error_;
};

int default_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

struct PoolState {
  std::mutex submit;  // held for a whole parallel_for or a resize
  // Read without the lock (num_threads may be called from inside a parallel_for body); written under it.
  std::atomic<int> n_threads{default_threads()};
  std::unique_ptr<Pool> pool;  // created on first use
};

PoolState& state() {
  static PoolState s;
  return s;
}

}  // namespace

int num_threads() { return state().n_threads.load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  if (t_in_parallel) throw std::logic_error("set_num_threads called from inside parallel_for");
  PoolState& s = state();
  std::lock_guard<std::mutex> lk(s.submit);
  const int want = n > 0 ? n : default_threads();
  if (want == s.n_threads.load()) return;
  s.pool.reset();
  s.n_threads.store(want);
}

void parallel_for(int64_t n, int64_t grain, const ChunkFn& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  if (t_in_parallel || units == 1) {
    fn(0, n);
    return;
  }
  PoolState& s = state();
  std::unique_lock<std::mutex> lk(s.submit);
  const int n_threads = s.n_threads.load();
  const int64_t per_chunk = (units + n_threads - 1) / n_threads;
  const int64_t chunk = per_chunk * grain;
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (n_chunks == 1) {
    lk.unlock();
    InlineScope scope;
    fn(0, n);
    return;
  }
  if (!s.pool) s.pool = std::make_unique<Pool>(n_threads);
  s.pool->run(n_chunks, chunk, n, fn);
}

}  // namespace q4t::cpu
