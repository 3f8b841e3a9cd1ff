// dp::mpi::NcclComm: NCCL communicator over the ranks of an MpiComm, for device all-reduces.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <string>

#include "dp/error.hpp"
#include "dp/mpi_comm.hpp"

// One CHECK macro for NCCL: a failed status becomes dp::Error
// "NCCL error in <call>: <ncclGetErrorString> (<ncclGetLastError>) (at file:line)".
#define DP_NCCL_CHECK(call)                                                    \
  do {                                                                         \
    ncclResult_t dp_nccl_status_ = (call);                                     \
    if (dp_nccl_status_ != ncclSuccess)                                        \
      ::dp::mpi::throw_nccl_error(dp_nccl_status_, #call, __FILE__, __LINE__); \
  } while (0)

namespace dp::mpi {

// The loaded NCCL's version, "2.21.5" (ncclGetVersion: major * 10000 + minor * 100 + patch).
std::string nccl_version();

[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file,
                                   int line);

// Another rank failed before ncclCommInitRank, this one did not (see NcclComm); that rank throws
// its own error.
class NcclPeerFailed : public Error {
 public:
  using Error::Error;
};

// ncclCommInitRank failed on this rank. Its peers may be inside that call, which only ends when
// every rank has joined: no MPI agreement can reach them. The caller reports the error and ends
// the job (Env::abort, i.e. MPI_Abort), never waits for the peers.
class NcclInitError : public Error {
 public:
  using Error::Error;
};

// Collective constructor: every rank of `mpi` must construct one, after selecting its GPU
// (dp::cuda::select_device). Rank 0 creates the unique id, every rank checks that its GPU works,
// and MPI agrees on the outcome: if any rank failed, every rank throws (the ranks that failed
// dp::Error with their error, the others NcclPeerFailed naming the lowest failing rank) and none
// enters NCCL. Then every rank joins with ncclCommInitRank; a failure there throws
// NcclInitError (see there). NCCL ranks equal MPI ranks. Not copyable or movable.
class NcclComm {
 public:
  explicit NcclComm(const MpiComm& mpi);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // In-place sum over all ranks of `n` floats in device memory, enqueued on `stream` (returns
  // before it completes). Every rank must make the same calls in the same order.
  void allreduce_sum(float* device_buf, size_t n, cudaStream_t stream);
  // Throws dp::Error if NCCL has recorded an asynchronous error (e.g. a peer or network failure);
  // call it while waiting on a stream that runs NCCL work so a failure cannot hang the rank.
  void check_async();
  ncclComm_t native() const { return comm_; }
  // Aborts the communicator so that pending NCCL work returns; only the end of the job may follow
  // (the stall watchdog calls it from its thread just before MPI_Abort).
  void abort_for_exit();

 private:
  // Throws like DP_NCCL_CHECK, after marking the communicator as failed.
  void check(ncclResult_t status, const char* call, const char* file, int line);

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  // Set once any call failed: the destructor then aborts instead of destroying (which may wait).
  bool failed_ = false;
};

}  // namespace dp::mpi
