// GradReducer: sums the gradient arena over all ranks in buckets whose all-reduces start during
// backward, as soon as every gradient in a bucket is final.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dp/comm.hpp"
#include "dp/model.hpp"
#include "dp/params.hpp"

namespace dp::mpi {

// PyTorch DDP's defaults: bucket_cap_mb = 25, and a first bucket of 1 MiB so that communication
// starts after the last layers' (small) gradients instead of waiting for 25 MiB of them.
inline constexpr double kDefaultBucketMiB = 25.0;
inline constexpr double kDefaultFirstBucketMiB = 1.0;
// Largest piece summed at once, in elements (the ring's scratch holds one chunk of it). Open
// MPI's collectives allocate a temporary of the message's size per call; glibc serves up to
// 32 MiB from its heap once a block that size has been freed, but maps (and page-faults) larger
// ones every call: one 117 MB MPI_Allreduce took 60 ms here (300-430 ms on a busier VM) against
// ~35 ms in pieces of this size.
inline constexpr int64_t kDefaultPieceElements = int64_t{1} << 20;

// How often the MPI reducer's progress thread advances the all-reduces in flight during backward.
// See bench/README.md (simulated 2-node cluster over TCP).
inline constexpr int kDefaultProgressMicroseconds = 500;

// How the MPI reducer sums a piece: its own ring over MPI_Isend/MPI_Irecv (scratch allocated once,
// the least data moved; mpi/src/ring_allreduce.hpp) or MPI_Iallreduce. See bench/README.md.
enum class ReduceAlgorithm { kRing, kIallreduce };

struct ReducerOptions {
  double bucket_mib = kDefaultBucketMiB;             // every bucket after the first
  double first_bucket_mib = kDefaultFirstBucketMiB;  // capped at bucket_mib
  bool overlap = true;  // false: nothing is sent before wait() (after backward)
  int64_t piece_elements = kDefaultPieceElements;
  // With overlap: a thread advances the pieces in flight every progress_us while backward runs
  // (0: only grad_ready calls do). Needs MPI_THREAD_MULTIPLE, else it is 0.
  int progress_us = kDefaultProgressMicroseconds;
  ReduceAlgorithm algorithm = ReduceAlgorithm::kRing;
};

// A contiguous slice [begin, end) of the gradient arena, in floats.
struct Bucket {
  int64_t begin = 0, end = 0;
  int params = 0;  // parameters overlapping it (a bucket may cut a tensor; padding is in no one)
  int64_t size() const { return end - begin; }
};

// Cuts an arena into buckets and tracks, during one backward pass, which buckets are complete.
// Bucket boundaries are multiples of 16 floats (64 bytes); buckets cover the arena exactly, the
// first holds first_bucket_mib, the others bucket_mib (the last: what remains). A bucket is
// released when every parameter overlapping it is ready AND every bucket before it has been
// released, so buckets are released in index order on every rank whatever the ready order.
class BucketPlan {
 public:
  BucketPlan(const ParamStore& params, double first_bucket_mib, double bucket_mib);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Start of a backward pass: nothing ready yet (buckets that overlap no parameter are).
  void reset();
  // `param` (a view of the ParamStore given to the constructor) is ready. Returns the range
  // [first, last) of buckets released by this call (empty when none). Throws dp::Error for an
  // unknown parameter or one reported twice in the same pass.
  std::pair<int, int> mark_ready(const ParamView& param);
  bool all_released() const { return next_ == static_cast<int>(buckets_.size()); }
  // The first parameter (in arena order) not reported since reset(), for error messages.
  std::string first_missing() const;

  // One backward pass as every reducer runs it (GradReducer::begin, grad_ready, wait), checked
  // here: begin_pass() resets (not twice without end_pass()); ready() marks a parameter between
  // them and returns the buckets released; end_pass() closes the pass once backward has reported
  // every parameter. Each throws dp::Error naming the misuse.
  void begin_pass();
  std::pair<int, int> ready(const ParamView& param);
  void end_pass();
  bool in_pass() const { return in_pass_; }

 private:
  struct Slot {
    const ParamView* view = nullptr;
    int first_bucket = 0, last_bucket = 0;  // inclusive range of buckets it overlaps
  };
  const Slot& slot_of(const ParamView& param) const;

  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;              // sorted by arena offset
  std::vector<int> pending_;             // per bucket: overlapping parameters not yet ready
  std::vector<unsigned char> reported_;  // per slot, in this pass
  int next_ = 0;                         // first bucket not released
  bool in_pass_ = false;                 // between begin_pass() and end_pass()
};

// Fed by Model::backward (GradListener); gradients end up summed over ranks, in place.
// Per reduced step: begin(); model.backward(diff, &reducer, ...); wait(); optimizer step.
// Every rank must make the same calls in the same order (as for any collective).
class GradReducer : public GradListener {
 public:
  // Before the backward pass whose gradients are to be reduced.
  virtual void begin() = 0;
  // After it: returns when every bucket is summed over all ranks. Throws dp::Error if backward
  // did not report every parameter (a layer that forgot its GradListener call).
  virtual void wait() = 0;
  virtual const std::vector<Bucket>& buckets() const = 0;
  // "ring all-reduce (...), N bucket(s) (...)" for the start-up log.
  virtual std::string describe() const = 0;
};

// The reducer for `comm`: for an MpiComm, in-place sums on host memory per released bucket, in
// pieces of at most piece_elements (options.algorithm), advanced from each grad_ready call and
// from a progress thread (Open MPI's ob1 progresses only inside MPI calls); for any other Comm
// (SelfComm in tests) one Comm::allreduce_sum of the arena in wait(). `params` and `comm` must
// outlive it.
std::unique_ptr<GradReducer> make_grad_reducer(Comm& comm, const ParamStore& params,
                                               const ReducerOptions& options);

}  // namespace dp::mpi
