// The NCCL calls of mpi/src/nccl_*.cpp on the CPU, for the emulated backend (tests/emu): a
// communicator is a copy of MPI_COMM_WORLD (every world rank must create it, as dptrain does),
// ncclAllReduce of fp32 sums is MPI_Allreduce on the ("device", i.e. host) buffers, at once.
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 0;
};

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclSystemError:
      return "unhandled system error";
    default:
      return "internal error";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  return "";
}

// The emulation reports the NCCL release it was written against.
ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  std::strncpy(id->internal, "dp_emu", sizeof id->internal - 1);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == nullptr || std::strncmp(id.internal, "dp_emu", sizeof id.internal) != 0)
    return ncclInvalidArgument;
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (nranks != world_size || rank < 0 || rank >= nranks) return ncclInvalidUsage;
  auto* c = new ncclComm{};
  // Ordered by the NCCL rank.
  if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->mpi) != MPI_SUCCESS) {
    delete c;
    return ncclSystemError;
  }
  c->rank = rank;
  c->size = nranks;
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (comm == nullptr || error == nullptr) return ncclInvalidArgument;
  *error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

// Abort must not wait for the other ranks: the MPI communicator is left to MPI_Finalize/abort.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  if (comm == nullptr || type != ncclFloat32 || op != ncclSum || count > size_t(INT32_MAX))
    return ncclInvalidArgument;
  if (count == 0) return ncclSuccess;
  const int status = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, int(count), MPI_FLOAT,
                                   MPI_SUM, comm->mpi);
  return status == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

}  // extern "C"
