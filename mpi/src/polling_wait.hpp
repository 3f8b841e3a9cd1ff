// Waits on MPI requests that give the core away between polls, for ranks that share cores.
#pragma once

#include <mpi.h>
#include <sched.h>

#include <vector>

#include "dp/mpi_comm.hpp"  // DP_MPI_CHECK

namespace dp::mpi {

// MPI_Waitall and MPI_Waitsome as loops of MPI_Testall / MPI_Testsome with sched_yield between
// polls. An MPI's own waits busy-poll without yielding (MPICH 4 over UCX), so where ranks share
// cores (more ranks than cores, as on a laptop or in the tests) each message waits for the
// scheduler to take a whole time slice away from a polling peer: the reducer tests' 4 ranks on 2
// cores took 75 s under MPICH instead of 2 s. On a core of its own the yield returns at once.
inline void wait_all_yielding(std::vector<MPI_Request>& requests) {
  for (int done = 0;;) {
    DP_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                             MPI_STATUSES_IGNORE));
    if (done != 0) return;
    sched_yield();
  }
}

// Returns once at least one active request of `requests` has completed (or none is active);
// `completed` receives their indices, as MPI_Waitsome's.
inline int wait_some_yielding(std::vector<MPI_Request>& requests, std::vector<int>& completed) {
  completed.resize(requests.size());
  for (int count = 0;;) {
    DP_MPI_CHECK(MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &count,
                              completed.data(), MPI_STATUSES_IGNORE));
    if (count != 0) return count;
    sched_yield();
  }
}

}  // namespace dp::mpi
