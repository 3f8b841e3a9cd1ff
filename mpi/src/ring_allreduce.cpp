// Nonblocking ring all-reduce over MPI point-to-point: reduce-scatter then all-gather, one chunk
// per step, scratch allocated once, progressed by the caller.
#include "ring_allreduce.hpp"

#include <algorithm>

#include "dp/error.hpp"
#include "dp/mpi_comm.hpp"
#include "polling_wait.hpp"

namespace dp::mpi {
namespace {

int mod(int a, int p) {
  return ((a % p) + p) % p;
}

}  // namespace

RingAllreduce::RingAllreduce(MPI_Comm comm, int64_t max_count, int lanes)
    : comm_(comm), max_count_(max_count) {
  DP_CHECK(lanes >= 1 && max_count >= 0 && max_count <= INT32_MAX, "RingAllreduce: ", lanes,
           " lanes, pieces of ", max_count, " elements");
  DP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  lanes_.resize(static_cast<size_t>(lanes));
  const int64_t largest_chunk = (max_count + size_ - 1) / size_;
  if (size_ > 1)
    for (Lane& lane : lanes_)
      lane.scratch =
          Buffer(static_cast<size_t>(std::max<int64_t>(largest_chunk, 1)) * sizeof(float));
  requests_.assign(2 * lanes_.size(), MPI_REQUEST_NULL);
}

void RingAllreduce::start(float* data, int64_t count) {
  DP_CHECK(count >= 0 && count <= max_count_, "RingAllreduce: a piece of ", count,
           " elements, at most ", max_count_, " allowed");
  if (size_ == 1 || count == 0) return;  // the sum over one rank is the data
  const int lane = next_lane_;
  next_lane_ = (next_lane_ + 1) % static_cast<int>(lanes_.size());
  lanes_[static_cast<size_t>(lane)].queue.push_back({data, count, 0});
  if (!lanes_[static_cast<size_t>(lane)].posted) post(lane);
}

void RingAllreduce::post(int lane) {
  Lane& l = lanes_[static_cast<size_t>(lane)];
  const Piece& piece = l.queue.front();
  const int p = size_, r = rank_, s = piece.step;
  const bool scatter = s < p - 1;  // reduce-scatter step s, else all-gather step s - (p - 1)
  const int t = scatter ? s : s - (p - 1);
  const int send_chunk = scatter ? mod(r - s, p) : mod(r + 1 - t, p);
  const int recv_chunk = scatter ? mod(r - s - 1, p) : mod(r - t, p);
  const int64_t send_at = chunk_begin(piece, send_chunk);
  const int64_t recv_at = chunk_begin(piece, recv_chunk);
  const int send_n = static_cast<int>(chunk_begin(piece, send_chunk + 1) - send_at);
  const int recv_n = static_cast<int>(chunk_begin(piece, recv_chunk + 1) - recv_at);
  float* recv = scatter ? l.scratch.f32() : piece.data + recv_at;
  const int tag = lane;  // pieces of one lane run in sequence; lanes never share a tag
  DP_MPI_CHECK(MPI_Irecv(recv, recv_n, MPI_FLOAT, mod(r - 1, p), tag, comm_,
                         &requests_[static_cast<size_t>(2 * lane)]));
  DP_MPI_CHECK(MPI_Isend(piece.data + send_at, send_n, MPI_FLOAT, mod(r + 1, p), tag, comm_,
                         &requests_[static_cast<size_t>(2 * lane + 1)]));
  l.posted = true;
}

bool RingAllreduce::advance(int lane) {
  Lane& l = lanes_[static_cast<size_t>(lane)];
  bool moved = false;
  while (l.posted) {
    int done = 0;
    DP_MPI_CHECK(
        MPI_Testall(2, &requests_[static_cast<size_t>(2 * lane)], &done, MPI_STATUSES_IGNORE));
    if (!done) break;
    moved = true;
    l.posted = false;
    Piece& piece = l.queue.front();
    const int p = size_;
    if (piece.step < p - 1) {  // add the received partial sums into our chunk
      const int chunk = mod(rank_ - piece.step - 1, p);
      const int64_t at = chunk_begin(piece, chunk), n = chunk_begin(piece, chunk + 1) - at;
      float* dst = piece.data + at;
      const float* src = l.scratch.f32();
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    }
    if (++piece.step == 2 * (p - 1)) l.queue.pop_front();
    if (!l.queue.empty()) post(lane);
  }
  return moved;
}

void RingAllreduce::progress() {
  for (int lane = 0; lane < static_cast<int>(lanes_.size()); ++lane) advance(lane);
}

bool RingAllreduce::idle() const {
  return std::all_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.queue.empty(); });
}

void RingAllreduce::wait() {
  std::vector<int> completed(requests_.size());
  for (;;) {
    progress();
    if (idle()) return;
    // Nothing can advance locally: wait until any posted request of any lane completes.
    wait_some_yielding(requests_, completed);
  }
}

}  // namespace dp::mpi
