// NCCL communicator bootstrapped over MPI: unique id from rank 0, MPI_Bcast, ncclCommInitRank.
#include "dp/nccl_comm.hpp"

#include <exception>
#include <string>

namespace dp::mpi {

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  // NCCL's last-error text says what failed underneath (CUDA, network, ...); empty if nothing.
  const char* detail = ncclGetLastError(nullptr);
  fail("NCCL error in ", call, ": ", ncclGetErrorString(status),
       detail && *detail ? str_cat(" (", detail, ")") : std::string(), " (at ", file, ":", line,
       ")");
}

NcclComm::NcclComm(const MpiComm& mpi) : rank_(mpi.rank()), size_(mpi.size()) {
  // Rank 0 broadcasts whether it got an id, so that a failure there becomes an error on every
  // rank instead of the others waiting in ncclCommInitRank for a peer that never comes.
  struct {
    ncclUniqueId id;
    int ok;
  } boot{};
  ncclResult_t id_status = ncclSuccess;
  if (rank_ == 0) {
    id_status = ncclGetUniqueId(&boot.id);
    boot.ok = id_status == ncclSuccess ? 1 : 0;
  }
  DP_MPI_CHECK(MPI_Bcast(&boot, sizeof boot, MPI_BYTE, 0, mpi.native()));
  if (rank_ == 0) DP_NCCL_CHECK(id_status);
  DP_CHECK(boot.ok == 1, "NCCL set-up: rank 0 could not create the NCCL unique id");
  DP_NCCL_CHECK(ncclCommInitRank(&comm_, size_, boot.id, rank_));
}

NcclComm::~NcclComm() {
  if (!comm_) return;
  // Destroying waits for outstanding work; after an error, or while an exception unwinds the
  // stack (peers may never join the pending collectives), abort instead so the rank cannot hang.
  if (failed_ || std::uncaught_exceptions() > 0) {
    (void)ncclCommAbort(comm_);
  } else {
    (void)ncclCommDestroy(comm_);
  }
}

void NcclComm::check(ncclResult_t status, const char* call, const char* file, int line) {
  if (status == ncclSuccess) return;
  failed_ = true;
  throw_nccl_error(status, call, file, line);
}

void NcclComm::allreduce_sum(float* device_buf, size_t n, cudaStream_t stream) {
  check(ncclAllReduce(device_buf, device_buf, n, ncclFloat32, ncclSum, comm_, stream),
        "ncclAllReduce", __FILE__, __LINE__);
}

void NcclComm::check_async() {
  ncclResult_t async = ncclSuccess;
  check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", __FILE__, __LINE__);
  if (async == ncclInProgress) return;
  check(async, "a collective (asynchronous error)", __FILE__, __LINE__);
}

}  // namespace dp::mpi
