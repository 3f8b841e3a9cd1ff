// MPI environment (RAII init/finalize) and dp::mpi::MpiComm, the MPI implementation of dp::Comm.
#pragma once

#include <mpi.h>

#include <string>

#include "dp/comm.hpp"
#include "dp/error.hpp"

// One CHECK macro for MPI: turns a status into dp::Error with file:line and MPI's own message.
#define DP_MPI_CHECK(call)                                                   \
  do {                                                                       \
    int dp_mpi_status_ = (call);                                             \
    if (dp_mpi_status_ != MPI_SUCCESS)                                       \
      ::dp::mpi::throw_mpi_error(dp_mpi_status_, #call, __FILE__, __LINE__); \
  } while (0)

namespace dp::mpi {

[[noreturn]] void throw_mpi_error(int status, const char* call, const char* file, int line);

// True when a launcher started this process: mpirun/mpiexec (Open MPI, MPICH's Hydra) or srun
// with PMI-2 or PMIx, by the variables each sets (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK,
// PMI_SIZE). They say only whether there is one; ranks come from MPI.
bool launched();

// Initialises MPI once (MPI_THREAD_MULTIPLE where provided, at least FUNNELED) and finalises it on
// destruction; errors return codes (MPI_ERRORS_RETURN) so they become dp::Error instead of silent
// aborts.
class Env {
 public:
  Env(int* argc, char*** argv);
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  // Ends every rank of the job with `code` (the app calls this on a fatal error so no rank hangs).
  [[noreturn]] static void abort(int code);
  // Flushes stdout and stderr and waits for the launcher to forward them (before MPI_Abort).
  static void drain_output();
};

class MpiComm final : public Comm {
 public:
  // Wraps (does not own) `comm`; splits off the node-local communicator.
  explicit MpiComm(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  void allreduce_sum(float* data, size_t count) override;
  void allreduce_sum(double* data, size_t count) override;
  void allreduce_sum(int64_t* data, size_t count) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  bool all_true(bool local) override;
  MPI_Comm native() const { return comm_; }

 private:
  MPI_Comm comm_;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace dp::mpi
