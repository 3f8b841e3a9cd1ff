// The start-up and error policy of dptrain and dppredict: MPI start-up, exit codes, error lines.
#pragma once

#include <functional>

#include "dp/mpi_comm.hpp"

namespace dp::app {

// Starts MPI (dp::mpi::Env, which may remove MPI's own arguments from argc/argv) and returns
// body(world)'s exit code. Errors: a UsageError is printed once, by rank 0 ("<program>: error:
// ..."), exit 2; an AgreedFailure (every rank knows) is printed by the rank that saw it, exit its
// code; any other exception was seen by this rank alone, so it is printed with the rank and the
// whole job ends (MPI_Abort) so that no peer waits for it. A failing MPI start-up exits 1.
int run_mpi_program(const char* program, int& argc, char**& argv,
                    const std::function<int(mpi::MpiComm& world)>& body);

// As run_mpi_program where a launcher started the process (mpi::launched()); without one, body
// runs on a world of one rank (SelfComm) and MPI is never started: MPI_Init alone is a fifth of
// the start-up of a dppredict command on one photograph.
int run_program(const char* program, int& argc, char**& argv,
                const std::function<int(Comm& world)>& body);

}  // namespace dp::app
