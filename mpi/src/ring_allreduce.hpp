// RingAllreduce: nonblocking in-place float sum over all ranks (ring reduce-scatter, then ring
// all-gather, over MPI point-to-point), advanced by the caller; private to dp_dist.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "dp/buffer.hpp"

namespace dp::mpi {

// Each piece is cut into one chunk per rank; in 2(p-1) steps every rank sends one chunk to its
// right neighbour and receives one from its left: first the partial sums (added into the piece
// from a scratch buffer), then the finished chunks (received in place). Every chunk is summed by
// one rank and copied to the others, so all ranks end with the same bits. Compared with
// MPI_Iallreduce (Open MPI's libnbc: binomial reduce + broadcast for few ranks, a temporary of the
// message size allocated per call), it moves the minimum: 2(p-1)/p of the piece per rank, into
// scratch allocated once.
// Up to `lanes` pieces advance together, each lane with its own scratch and tag; pieces are given
// to lanes round-robin. Each lane's current step is always posted, and wait() waits only for
// any of every lane's requests (polling_wait.hpp), so no rank can sleep on one lane while a peer
// waits for it on another.
class RingAllreduce {
 public:
  // `comm` (not owned) must outlive this object; pieces hold at most max_count elements.
  RingAllreduce(MPI_Comm comm, int64_t max_count, int lanes);
  RingAllreduce(const RingAllreduce&) = delete;
  RingAllreduce& operator=(const RingAllreduce&) = delete;

  // Queues the sum over ranks of data[0, count) into data. Every rank must queue the same pieces
  // (same counts) in the same order; `data` must stay valid until the piece is done.
  void start(float* data, int64_t count);
  // Advances every lane as far as it can without blocking.
  void progress();
  // Returns when everything queued is done.
  void wait();
  bool idle() const;

 private:
  struct Piece {
    float* data = nullptr;
    int64_t count = 0;
    int step = 0;  // 0 .. 2(p-1)-1
  };
  struct Lane {
    std::deque<Piece> queue;  // front: the piece in flight
    bool posted = false;      // the front piece's current step has its requests posted
    Buffer scratch;           // one chunk of partial sums
  };
  int64_t chunk_begin(const Piece& piece, int chunk) const { return piece.count * chunk / size_; }
  void post(int lane);
  // Finishes completed steps of `lane` and posts the next; true if any step completed.
  bool advance(int lane);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int64_t max_count_;
  std::vector<Lane> lanes_;
  std::vector<MPI_Request> requests_;  // lane i: [2i] receive, [2i+1] send
  int next_lane_ = 0;
};

}  // namespace dp::mpi
