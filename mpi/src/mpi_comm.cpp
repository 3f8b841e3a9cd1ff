// MPI environment and communicator: init/finalize, node-local split, chunked all-reduce, broadcast.
#include "dp/mpi_comm.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace dp::mpi {
namespace {

// Large single all-reduces page-fault a fresh temporary buffer each call (300-430 ms for 117 MB
// here, vs ~30 ms in 1M-element pieces): reduce in pieces of this many elements.
constexpr size_t kChunkElements = size_t{1} << 20;

template <typename T>
void allreduce_chunked(MPI_Comm comm, T* data, size_t count, MPI_Datatype type) {
  for (size_t first = 0; first < count; first += kChunkElements) {
    const int n = static_cast<int>(std::min(kChunkElements, count - first));
    DP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + first, n, type, MPI_SUM, comm));
  }
}

}  // namespace

void throw_mpi_error(int status, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(status, text, &len) != MPI_SUCCESS) len = 0;
  int rank = -1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fail("MPI error on rank ", rank, " in ", call, ": ", std::string(text, static_cast<size_t>(len)),
       " (", file, ":", line, ")");
}

bool launched() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") ||
         std::getenv("PMI_RANK") || std::getenv("PMI_SIZE");
}

Env::Env(int* argc, char*** argv) {
  // A process started without a launcher (dptrain on one process) is an Open MPI singleton. By
  // default it forks a daemon of its own for MPI_Comm_spawn and probes UCX's devices for peers it
  // will never have: 0.3 s of every such command (0.04 s without). The user's settings win, and
  // other MPIs ignore these.
  if (!launched()) {
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
  }
  int provided = 0;
  // MPI_THREAD_MULTIPLE for the stall watchdog's thread (dp/stall_watchdog.hpp); the training
  // itself calls MPI from one thread, so FUNNELED is enough where MULTIPLE is not provided.
  DP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  DP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  DP_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level ", provided,
           ", dptrain needs MPI_THREAD_FUNNELED");
}

Env::~Env() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void Env::drain_output() {
  // MPI_Abort makes the launcher kill every process at once: Hydra (MPICH's mpiexec) then drops
  // what a rank wrote just before, unforwarded (the error line of a failing rank 0 was lost in 5
  // of 8 runs), so the last lines get a moment to reach mpiexec first.
  constexpr auto kOutputGrace = std::chrono::milliseconds(300);
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(kOutputGrace);
}

void Env::abort(int code) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {  // else a process of its own (dppredict without a launcher)
    drain_output();
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(code);
}

MpiComm::MpiComm(MPI_Comm comm) : comm_(comm) {
  DP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  DP_MPI_CHECK(
      MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_comm_));
  DP_MPI_CHECK(MPI_Comm_rank(local_comm_, &local_rank_));
  DP_MPI_CHECK(MPI_Comm_size(local_comm_, &local_size_));
}

MpiComm::~MpiComm() {
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
}

void MpiComm::allreduce_sum(float* data, size_t count) {
  allreduce_chunked(comm_, data, count, MPI_FLOAT);
}
void MpiComm::allreduce_sum(double* data, size_t count) {
  allreduce_chunked(comm_, data, count, MPI_DOUBLE);
}
void MpiComm::allreduce_sum(int64_t* data, size_t count) {
  allreduce_chunked(comm_, data, count, MPI_INT64_T);
}

void MpiComm::broadcast(void* data, size_t bytes, int root) {
  auto* p = static_cast<char*>(data);
  for (size_t first = 0; first < bytes; first += kChunkElements * sizeof(float)) {
    const int n = static_cast<int>(std::min(kChunkElements * sizeof(float), bytes - first));
    DP_MPI_CHECK(MPI_Bcast(p + first, n, MPI_BYTE, root, comm_));
  }
}

void MpiComm::barrier() {
  DP_MPI_CHECK(MPI_Barrier(comm_));
}

bool MpiComm::all_true(bool local) {
  int v = local ? 1 : 0;
  DP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, comm_));
  return v != 0;
}

}  // namespace dp::mpi
