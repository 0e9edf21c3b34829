// The processes of a data-parallel run (`mpirun -np N q4tune train ...`, or under srun), over Open MPI.
//
// Every rank holds the frozen model and a copy of the adapters. Each optimizer step every rank draws the same
// global batch from the same data cursor and keeps its own share of the rows; after the backward the ranks sum
// their gradients (each already weighted by the global token count), so every rank takes the same AdamW step and
// the adapters stay equal on every rank without being sent. Rank 0 alone writes files and prints progress.
//
// Built without MPI (no libopenmpi-dev), the world is always one process, and starting more than one under a
// launcher is an error (World::init).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace q4t::dist {

// Whether this binary was built with MPI.
bool built_with_mpi();

// The number of processes the launcher started (mpirun's OMPI_COMM_WORLD_SIZE, MPICH's PMI_SIZE, srun's
// SLURM_STEP_NUM_TASKS) and this one's rank there, read before any MPI call; 1 and 0 without a launcher.
int launched_size();
int launched_rank();

// A failure every rank of the job meets alike (starting the world, a setup error found together, a loss that is
// not finite): each rank throws it, and only rank 0 reports it (run_parsed).
class JobError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class World {
 public:
  // Starts MPI when a launcher started more than one process (idempotent; finalised at exit). Throws JobError
  // when that is so and the binary has no MPI.
  static const World& init();
  // The world init() made; one process before it.
  static const World& get();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank among those on its machine, and their number.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  bool root() const { return rank_ == 0; }
  bool distributed() const { return size_ > 1; }

  // v summed over the ranks, in place, every rank getting the same bits. Ranks that all share one machine sum
  // through a shared-memory window: each copies v in, each adds up its slice of every rank's copy in rank order
  // (so N ranks sum as --grad-accum sums N micro-batches), each copies the result out, on the CPU worker threads.
  // Across machines: a ring (reduce-scatter, then all-gather) over MPI, in buckets of bucket_floats values.
  void sum(std::span<float> v, size_t bucket_floats = size_t(1) << 21) const;
  // Small sums (losses, counts): every rank's values gathered and added in rank order.
  void sum(std::span<double> v) const;
  // Whether flag is true on any rank.
  bool any(bool flag) const;
  // s as rank 0 has it, on every rank.
  std::string broadcast(const std::string& s) const;
  // Every rank's s, in rank order, on every rank.
  std::vector<std::string> all_gather(const std::string& s) const;
  // Ends every rank of the job with exit code `code` (after a failure on this rank that the others cannot see).
  [[noreturn]] void abort(int code) const;

 private:
  struct Impl;  // the MPI communicators and the shared-memory window (distributed.cpp)
  static void finalize();  // at exit, after init started MPI
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
  bool mpi_ = false;
  std::shared_ptr<Impl> impl_;
};

// Runs fn on every rank of w and makes a failure the job's: when fn threw on any rank, every rank throws JobError
// with the message of the lowest such rank (named, with its host, unless it is rank 0 and every rank failed), so
// no rank waits for one that has stopped. One process: fn's own exception passes through.
void on_every_rank(const World& w, const std::function<void()>& fn);

}  // namespace q4t::dist
