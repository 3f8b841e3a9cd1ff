// NCCL communicator bootstrapped over MPI: unique id from rank 0, every rank's readiness agreed
// over MPI, MPI_Bcast of the id, ncclCommInitRank.
#include "dp/nccl_comm.hpp"

#include <exception>
#include <string>

#include "dp/cuda/device.hpp"

namespace dp::mpi {

std::string nccl_version() {
  int v = 0;
  DP_NCCL_CHECK(ncclGetVersion(&v));
  constexpr int kMajor = 10000, kMinor = 100;
  return str_cat(v / kMajor, ".", (v % kMajor) / kMinor, ".", v % kMinor);
}

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  // NCCL's last-error text says what failed underneath (CUDA, network, ...); empty if nothing.
  const char* detail = ncclGetLastError(nullptr);
  fail("NCCL error in ", call, ": ", ncclGetErrorString(status),
       detail && *detail ? str_cat(" (", detail, ")") : std::string(), " (at ", file, ":", line,
       ")");
}

NcclComm::NcclComm(const MpiComm& mpi) : rank_(mpi.rank()), size_(mpi.size()) {
  // Everything that can fail before the NCCL collective is agreed on over MPI first, so that a
  // failure on one rank never leaves the others waiting in ncclCommInitRank for it.
  ncclUniqueId id{};
  std::string error;
  try {
    int device = -1;
    DP_CUDA_CHECK(cudaGetDevice(&device));
    // A sticky error of earlier work, or a device that fails now, shows here rather than in NCCL.
    DP_CUDA_CHECK(cudaDeviceSynchronize());
    if (rank_ == 0) DP_NCCL_CHECK(ncclGetUniqueId(&id));
  } catch (const std::exception& e) {
    error = e.what();
  }
  int first_failed = error.empty() ? size_ : rank_;
  DP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_failed, 1, MPI_INT, MPI_MIN, mpi.native()));
  if (!error.empty()) fail("NCCL set-up: ", error);
  if (first_failed < size_)
    throw NcclPeerFailed(
        str_cat("NCCL set-up: rank ", first_failed, " failed before creating the communicator"));
  // From here on the peers may already be inside ncclCommInitRank: any failure is NcclInitError.
  ncclResult_t status = ncclSuccess;
  try {
    DP_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi.native()));
    status = ncclCommInitRank(&comm_, size_, id, rank_);
  } catch (const std::exception& e) {
    throw NcclInitError(e.what());
  }
  if (status != ncclSuccess) {
    const char* detail = ncclGetLastError(nullptr);
    throw NcclInitError(str_cat("NCCL error in ncclCommInitRank: ", ncclGetErrorString(status),
                                detail && *detail ? str_cat(" (", detail, ")") : std::string()));
  }
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

void NcclComm::abort_for_exit() {
  if (comm_) (void)ncclCommAbort(comm_);
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
