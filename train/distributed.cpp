#include "train/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/threads.h"

#ifdef Q4T_HAVE_MPI
#include <mpi.h>
#endif

namespace q4t::dist {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 && n < (1 << 24) ? int(n) : fallback;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

World& the_world() {
  static World w;
  return w;
}

#ifdef Q4T_HAVE_MPI
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(msg, size_t(len)));
}


// Sums n floats over the ring of ranks in place, the same bits on every rank: n is cut into size slices; in
// size - 1 steps each rank adds the slice it receives from its left neighbour to its own and passes the sum on
// (after which rank r holds the whole sum of slice r + 1), then in size - 1 more steps the whole sums go round.
void ring_sum(float* v, size_t n, int size, int rank) {
  const size_t slice = (n + size_t(size) - 1) / size_t(size);
  static thread_local std::vector<float> padded, in;  // kept from call to call (a step sums bucket after bucket)
  float* all = v;
  if (slice * size_t(size) != n) {
    padded.assign(slice * size_t(size), 0.0f);
    std::copy(v, v + n, padded.begin());
    all = padded.data();
  }
  in.resize(slice);
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  const auto part = [&](int k) { return all + size_t((k % size + size) % size) * slice; };
  for (int s = 0; s < size - 1; ++s) {
    check(MPI_Sendrecv(part(rank - s), int(slice), MPI_FLOAT, right, 0, in.data(), int(slice), MPI_FLOAT, left, 0,
                       MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
    float* mine = part(rank - s - 1);
    for (size_t i = 0; i < slice; ++i) mine[i] += in[i];
  }
  for (int s = 0; s < size - 1; ++s)
    check(MPI_Sendrecv(part(rank + 1 - s), int(slice), MPI_FLOAT, right, 1, part(rank - s), int(slice), MPI_FLOAT,
                       left, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
  if (all != v) std::copy(all, all + n, v);
}

// dst[0, n) = src[0, n) on the CPU worker threads.
void copy_parallel(float* dst, const float* src, size_t n) {
  cpu::parallel_for(int64_t(n), 1 << 16, [&](int64_t b, int64_t e) { std::memcpy(dst + b, src + b, size_t(e - b) * 4); });
}
#endif

}  // namespace

#ifdef Q4T_HAVE_MPI
struct World::Impl {
  MPI_Comm local = MPI_COMM_NULL;  // the ranks of this machine
  // The window: each local rank's segment of `capacity` floats, and after local rank 0's, the result.
  MPI_Win win = MPI_WIN_NULL;
  size_t capacity = 0;
  std::vector<float*> segment;
  float* result = nullptr;

  void free_window() {
    if (win == MPI_WIN_NULL) return;
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    capacity = 0;
  }
  void reserve(size_t n, int local_rank, int local_size) {
    if (n <= capacity) return;
    free_window();
    const MPI_Aint bytes = MPI_Aint(n * sizeof(float) * (local_rank == 0 ? 2 : 1));
    void* base = nullptr;
    check(MPI_Win_allocate_shared(bytes, sizeof(float), MPI_INFO_NULL, local, &base, &win), "MPI_Win_allocate_shared");
    segment.assign(size_t(local_size), nullptr);
    for (int r = 0; r < local_size; ++r) {
      MPI_Aint size = 0;
      int unit = 0;
      check(MPI_Win_shared_query(win, r, &size, &unit, &segment[size_t(r)]), "MPI_Win_shared_query");
    }
    result = segment[0] + n;
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
    capacity = n;
  }
  // Every local rank's writes to the window before any reads after it.
  void fence() const {
    MPI_Win_sync(win);
    check(MPI_Barrier(local), "MPI_Barrier");
    MPI_Win_sync(win);
  }
};
#else
struct World::Impl {};
#endif

void World::finalize() {
#ifdef Q4T_HAVE_MPI
  World& w = the_world();
  if (w.impl_) w.impl_->free_window();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
#endif
}

bool built_with_mpi() {
#ifdef Q4T_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int launched_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const int n = env_int(name, 0);
    if (n > 0) return n;
  }
  return 1;
}

int launched_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const int r = env_int(name, -1);
    if (r >= 0) return r;
  }
  return 0;
}

const World& World::get() { return the_world(); }

const World& World::init() {
  World& w = the_world();
  if (w.mpi_ || launched_size() <= 1) {
    if (w.host_.empty()) w.host_ = host_name();
    return w;
  }
#ifdef Q4T_HAVE_MPI
  int ready = 0;
  MPI_Initialized(&ready);
  if (!ready) {
    check(MPI_Init(nullptr, nullptr), "MPI_Init");
    std::atexit(&World::finalize);
  }
  // Errors come back as codes (and become exceptions here) instead of ending the job from inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size_);
  w.impl_ = std::make_shared<Impl>();
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank_, MPI_INFO_NULL, &w.impl_->local),
        "MPI_Comm_split_type");
  MPI_Comm_rank(w.impl_->local, &w.local_rank_);
  MPI_Comm_size(w.impl_->local, &w.local_size_);
  w.host_ = host_name();
  w.mpi_ = true;
  return w;
#else
  throw JobError("this q4tune was built without MPI (libopenmpi-dev was missing when it was built), so it runs "
                    "as one process and cannot train as one of the " + std::to_string(launched_size()) +
                    " processes the launcher started; install libopenmpi-dev and rebuild, or run without mpirun");
#endif
}

void World::sum(std::span<float> v, size_t bucket_floats) const {
  if (!distributed() || v.empty()) return;
#ifdef Q4T_HAVE_MPI
  if (local_size_ < size_) {
    for (size_t at = 0; at < v.size(); at += bucket_floats)
      ring_sum(v.data() + at, std::min(bucket_floats, v.size() - at), size_, rank_);
    return;
  }
  Impl& m = *impl_;
  m.reserve(v.size(), local_rank_, local_size_);
  copy_parallel(m.segment[size_t(local_rank_)], v.data(), v.size());
  m.fence();
  const size_t slice = (v.size() + size_t(size_) - 1) / size_t(size_);
  const size_t first = std::min(v.size(), slice * size_t(local_rank_)), last = std::min(v.size(), first + slice);
  cpu::parallel_for(int64_t(last - first), 1 << 14, [&](int64_t b, int64_t e) {
    for (size_t i = first + size_t(b); i < first + size_t(e); ++i) {
      float total = m.segment[0][i];
      for (int r = 1; r < size_; ++r) total += m.segment[size_t(r)][i];
      m.result[i] = total;
    }
  });
  m.fence();
  copy_parallel(v.data(), m.result, v.size());
#endif
}

void World::sum(std::span<double> v) const {
  if (!distributed() || v.empty()) return;
#ifdef Q4T_HAVE_MPI
  std::vector<double> all(v.size() * size_t(size_));
  check(MPI_Allgather(v.data(), int(v.size()), MPI_DOUBLE, all.data(), int(v.size()), MPI_DOUBLE, MPI_COMM_WORLD),
        "MPI_Allgather");
  for (size_t i = 0; i < v.size(); ++i) {
    double total = all[i];
    for (int r = 1; r < size_; ++r) total += all[size_t(r) * v.size() + i];
    v[i] = total;
  }
#endif
}

bool World::any(bool flag) const {
  if (!distributed()) return flag;
  int in = flag ? 1 : 0, out = in;
#ifdef Q4T_HAVE_MPI
  check(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
#endif
  return out != 0;
}

std::string World::broadcast(const std::string& s) const {
  if (!distributed()) return s;
  std::string out = s;
#ifdef Q4T_HAVE_MPI
  int64_t n = int64_t(s.size());
  check(MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
  out.resize(size_t(n));
  check(MPI_Bcast(out.data(), int(n), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
#endif
  return out;
}

std::vector<std::string> World::all_gather(const std::string& s) const {
  if (!distributed()) return {s};
  std::vector<std::string> out(static_cast<size_t>(size_));
#ifdef Q4T_HAVE_MPI
  int n = int(s.size());
  std::vector<int> sizes(static_cast<size_t>(size_)), at(static_cast<size_t>(size_));
  check(MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    at[size_t(r)] = total;
    total += sizes[size_t(r)];
  }
  std::string all(size_t(total), '\0');
  check(MPI_Allgatherv(s.data(), n, MPI_CHAR, all.data(), sizes.data(), at.data(), MPI_CHAR, MPI_COMM_WORLD),
        "MPI_Allgatherv");
  for (int r = 0; r < size_; ++r) out[size_t(r)] = all.substr(size_t(at[size_t(r)]), size_t(sizes[size_t(r)]));
#endif
  return out;
}

void on_every_rank(const World& w, const std::function<void()>& fn) {
  if (!w.distributed()) return fn();
  std::string mine;
  try {
    fn();
  } catch (const std::exception& e) {
    mine = std::string(e.what()).empty() ? "failed" : e.what();
  }
  const std::vector<std::string> all = w.all_gather(mine);
  int failed = 0, first = -1;
  for (int r = 0; r < int(all.size()); ++r)
    if (!all[size_t(r)].empty()) {
      ++failed;
      if (first < 0) first = r;
    }
  if (failed == 0) return;
  std::vector<std::string> hosts = w.all_gather(w.host());
  const std::string who = first == 0 && failed == w.size()
                              ? ""
                              : "rank " + std::to_string(first) + " (on " + hosts[size_t(first)] + "): ";
  throw JobError(who + all[size_t(first)]);
}

void World::abort(int code) const {
#ifdef Q4T_HAVE_MPI
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

}  // namespace q4t::dist
