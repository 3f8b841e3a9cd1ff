// dp::Comm: the small communicator interface (rank, size, all-reduce, broadcast, barrier) the
// trainer uses.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dp {

// Implemented by dp::mpi::MpiComm (mpi/) and, for tests of lib code alone, by dp::SelfComm.
// Every collective must be called in the same order on every rank.
class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank within this node (shared-memory domain); selects the GPU.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // In-place sums over all ranks.
  virtual void allreduce_sum(float* data, size_t count) = 0;
  virtual void allreduce_sum(double* data, size_t count) = 0;
  virtual void allreduce_sum(int64_t* data, size_t count) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // True when every rank passes true (used to agree on success before going on).
  virtual bool all_true(bool local) = 0;
};

// A world of one rank: collectives are no-ops.
class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void allreduce_sum(int64_t*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  bool all_true(bool local) override { return local; }
};

}  // namespace dp
